package server

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// CodeOriginNotAllowed is the error code of a /v1/ request from a browser
// page on an origin the server does not allow (403).
const CodeOriginNotAllowed = "origin_not_allowed"

// corsAllowHeaders are the request headers a page on an allowed origin may
// send: every header the API reads (Idempotency-Key, so that a page can
// retry a turn safely; Last-Event-ID, so that a stream can resume) and
// those clients commonly add.
const corsAllowHeaders = "Authorization, Content-Type, Accept, Idempotency-Key, Last-Event-ID, X-Request-Id, Cache-Control"

// corsExposeHeaders are the answer headers such a page may read: every
// header the API sets beyond those a browser always shows (Content-Type,
// Cache-Control): Idempotent-Replayed tells a retry's answer from the
// first, Retry-After when to retry.
const corsExposeHeaders = "X-Request-Id, Location, Retry-After, Idempotent-Replayed, WWW-Authenticate, Allow, Accept-Patch"

// corsMethods are the methods of the /v1/ routes.
const corsMethods = "GET, POST, PUT, PATCH, DELETE"

// cors is the origin allowlist of browser pages on other origins.
type cors struct {
	allowed map[string]bool
}

// CheckOrigins validates an origin allowlist: each entry a scheme (http or
// https), a host and an optional port, such as https://chat.example.com or
// http://localhost:5173, with nothing after (no path, no trailing slash).
// "*" is refused: the allowlist carries credentials, and a wildcard would
// let every page on the web use them.
func CheckOrigins(origins []string) error {
	_, err := newCORS(origins)
	return err
}

func newCORS(origins []string) (*cors, error) {
	c := &cors{allowed: map[string]bool{}}
	for _, o := range origins {
		norm, err := normalizeOrigin(o)
		if err != nil {
			return nil, err
		}
		c.allowed[norm] = true
	}
	return c, nil
}

// normalizeOrigin checks an allowlist entry and lowercases it.
func normalizeOrigin(o string) (string, error) {
	o = strings.TrimSpace(o)
	if o == "*" {
		return "", fmt.Errorf(`server: CORS origin "*" is not allowed: pages on an allowed origin may call the API with the user's credentials; list each origin, such as https://chat.example.com`)
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(o, "/") {
		return "", fmt.Errorf("server: CORS origin %q is not an origin; write the scheme, host and port a browser shows, such as https://chat.example.com or http://localhost:5173, without a path or a trailing slash", o)
	}
	return strings.ToLower(u.Scheme + "://" + u.Host), nil
}

// handleCORS applies the origin policy to a request and reports whether it
// answered it. It only looks at /v1/ requests with an Origin header (what a
// browser sends from a page's script): a page on the server's own origin
// (the playground) passes; a page on an allowed origin gets the CORS
// headers, its preflights (OPTIONS with Access-Control-Request-Method) are
// answered 204 before any auth check, and credentialed requests and event
// streams work; a page on any other origin is refused with 403, preflight
// or not, so that a page a user visits cannot make their browser run turns
// on a server without a token (a loopback dev server, say).
func (s *Server) handleCORS(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || !strings.HasPrefix(path.Clean("/"+r.URL.Path)+"/", "/v1/") {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	if sameOrigin(r, origin) {
		return false
	}
	preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	if !s.cors.allowed[strings.ToLower(origin)] {
		writeError(w, http.StatusForbidden, CodeOriginNotAllowed, fmt.Sprintf("pages on %s may not call this API; the server's operator can allow the origin with --cors-origins (or cors.origins in agentkit.yaml)", clipOrigin(origin)))
		return true
	}
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Allow-Credentials", "true")
	if preflight {
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		h.Set("Access-Control-Allow-Methods", corsMethods)
		h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return true
	}
	h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
	return false
}

// sameOrigin reports whether origin is the server's own: its host and port
// are the request's Host (the scheme is not checked, as a proxy may end
// TLS in front of the server). The Host is the client's word; it is only
// trusted because the Host check (hostPolicy) ran first: without a token,
// a Host that no one else can point at this machine. Otherwise a page on
// a name re-pointed at 127.0.0.1 would pass as the server's own.
func sameOrigin(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// clipOrigin bounds an origin echoed in an error message.
func clipOrigin(o string) string {
	if len(o) > 100 {
		return fmt.Sprintf("%q…", o[:100])
	}
	return fmt.Sprintf("%q", o)
}

// tokenFromQuery lets a browser's EventSource, which cannot send headers,
// authenticate an event stream: on GET /v1/sessions/{id}/events without an
// Authorization header, the access_token query parameter is taken as the
// bearer token and removed from the request. The request log records paths
// without their query, but proxies in front of the server may log it:
// prefer the header where the client can send one.
func tokenFromQuery(r *http.Request) {
	if r.Method != http.MethodGet || r.Header.Get("Authorization") != "" {
		return
	}
	p := path.Clean("/" + r.URL.Path)
	if !strings.HasPrefix(p, "/v1/sessions/") || !strings.HasSuffix(p, "/events") {
		return
	}
	q := r.URL.Query()
	tok := q.Get("access_token")
	if tok == "" {
		return
	}
	q.Del("access_token")
	r.URL.RawQuery = q.Encode()
	r.Header.Set("Authorization", "Bearer "+tok)
}
