package server_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/model"
	"agentkit/server"
)

func TestCORSAllowlist(t *testing.T) {
	const allowed = "https://chat.example.com"
	f := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: "secret", CORSOrigins: []string{allowed, "http://localhost:5173"}}})

	// A preflight carries no token; it is answered before the auth check.
	pre := func(origin string) *http.Response {
		req, _ := http.NewRequest("OPTIONS", f.url+"/v1/sessions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, idempotency-key, last-event-id")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := pre(allowed)
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != allowed || h.Get("Access-Control-Allow-Credentials") != "true" ||
		!allows(h.Get("Access-Control-Allow-Headers"), "Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID") || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
		t.Errorf("preflight from an allowed origin: %d %v", resp.StatusCode, h)
	}
	if resp := pre("HTTP://LOCALHOST:5173"); resp.StatusCode != http.StatusNoContent {
		t.Errorf("origins compare case-insensitively: %d", resp.StatusCode)
	}
	for _, o := range []string{"https://evil.example", "https://chat.example.com.evil.example", "http://chat.example.com", "null"} {
		if resp := pre(o); resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("preflight from %s: %d %q, want 403 without CORS headers", o, resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
		}
	}

	// Actual requests.
	resp = f.send("POST", "/v1/sessions", `{"message": "hi"}`, http.Header{"Origin": {allowed}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Access-Control-Allow-Origin") != allowed ||
		!allows(resp.Header.Get("Access-Control-Expose-Headers"), "Location", "Retry-After", "Idempotent-Replayed", "X-Request-Id") {
		t.Errorf("POST from an allowed origin: %d %v", resp.StatusCode, resp.Header)
	}
	var e apiError
	resp = f.send("POST", "/v1/sessions", `{"message": "hi"}`, http.Header{"Origin": {"https://evil.example"}})
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), server.CodeOriginNotAllowed) || !strings.Contains(string(body), "--cors-origins") {
		t.Errorf("POST from another origin: %d %s, want 403 %s", resp.StatusCode, body, e.Error.Code)
	}
	// The server's own page (same origin) and clients without Origin pass.
	resp = f.send("GET", "/v1/sessions", "", http.Header{"Origin": {f.url}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("same-origin GET: %d %v", resp.StatusCode, resp.Header)
	}
	// Routes outside /v1/ are not the API's.
	resp = f.send("GET", "/healthz", "", http.Header{"Origin": {"https://evil.example"}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz with an Origin: %d", resp.StatusCode)
	}
}

// allows reports whether a CORS header's comma-separated list holds each
// name, compared as the browser does (case-insensitively).
func allows(list string, names ...string) bool {
	have := map[string]bool{}
	for n := range strings.SplitSeq(list, ",") {
		have[strings.ToLower(strings.TrimSpace(n))] = true
	}
	for _, n := range names {
		if !have[strings.ToLower(n)] {
			return false
		}
	}
	return true
}

// TestCORSCoversEveryHeaderTheAPIUses reads the package's source for the
// request headers the API reads and the answer headers it sets, and checks
// that a page on an allowed origin may send (preflight) and read (expose)
// each one, so that a header added later cannot be left out: a browser
// client could not retry safely without Idempotency-Key and
// Idempotent-Replayed.
func TestCORSCoversEveryHeaderTheAPIUses(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	reads := regexp.MustCompile(`\bHeader\.(?:Get|Values)\("([A-Za-z-]+)"\)`)
	sets := regexp.MustCompile(`(?:\bHeader\(\)|\bh)\.(?:Set|Add)\("([A-Za-z-]+)"`)
	// Request headers the browser sends itself, and answer headers a page
	// needs no exposing for (Content-Type and Cache-Control every page may
	// read) or has no use for (CORS's, the playground page's).
	browsers := map[string]bool{"Origin": true, "Access-Control-Request-Method": true}
	notForScripts := map[string]bool{
		"Content-Type": true, "Cache-Control": true, "Vary": true,
		"Content-Security-Policy": true, "X-Content-Type-Options": true, "Referrer-Policy": true, "X-Accel-Buffering": true,
	}
	var sent, answered []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range reads.FindAllStringSubmatch(string(src), -1) {
			if !browsers[m[1]] {
				sent = append(sent, m[1])
			}
		}
		for _, m := range sets.FindAllStringSubmatch(string(src), -1) {
			if !notForScripts[m[1]] && !strings.HasPrefix(m[1], "Access-Control-") {
				answered = append(answered, m[1])
			}
		}
	}
	sent, answered = slices.Compact(slices.Sorted(slices.Values(sent))), slices.Compact(slices.Sorted(slices.Values(answered)))
	t.Logf("request headers the API reads: %v; answer headers it sets: %v", sent, answered)
	if !slices.Contains(sent, "Idempotency-Key") || !slices.Contains(sent, "Content-Type") || !slices.Contains(answered, "Idempotent-Replayed") || !slices.Contains(answered, "Retry-After") {
		t.Fatalf("the source scan found the request headers %v and the answer headers %v; it misses some", sent, answered)
	}
	const origin = "https://chat.example.com"
	f := newFixture(t, fixtureOpts{Options: server.Options{CORSOrigins: []string{origin}}})
	pre := f.send("OPTIONS", "/v1/sessions", "", http.Header{"Origin": {origin}, "Access-Control-Request-Method": {"POST"}, "Access-Control-Request-Headers": {strings.ToLower(strings.Join(sent, ","))}})
	pre.Body.Close()
	for _, h := range sent {
		if !allows(pre.Header.Get("Access-Control-Allow-Headers"), h) {
			t.Errorf("the API reads the request header %s, but a preflight does not allow it (Access-Control-Allow-Headers: %s)", h, pre.Header.Get("Access-Control-Allow-Headers"))
		}
	}
	resp := f.send("GET", "/v1/sessions", "", http.Header{"Origin": {origin}})
	resp.Body.Close()
	for _, h := range answered {
		if !allows(resp.Header.Get("Access-Control-Expose-Headers"), h) {
			t.Errorf("the API sets the answer header %s, but a page may not read it (Access-Control-Expose-Headers: %s)", h, resp.Header.Get("Access-Control-Expose-Headers"))
		}
	}
}

func TestCORSDefaultsToNoOrigin(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	resp := f.send("POST", "/v1/sessions", `{"message": "hi"}`, http.Header{"Origin": {"http://localhost:5173"}})
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a page on another origin started a session on a server allowing none: %d", resp.StatusCode)
	}
}

func TestCORSOriginsAreChecked(t *testing.T) {
	for _, bad := range []string{"*", "https://chat.example.com/", "https://chat.example.com/app", "chat.example.com", "ftp://x", "https://user@x.example"} {
		if err := server.CheckOrigins([]string{bad}); err == nil {
			t.Errorf("CheckOrigins accepted %q", bad)
		}
	}
	if err := server.CheckOrigins([]string{"https://chat.example.com", "http://127.0.0.1:5173"}); err != nil {
		t.Error(err)
	}
	e, _ := model.NewEcho(nil)
	rt, err := agent.Open(context.Background(), agent.Config{Agent: agent.Agent{Name: "x", Model: e}, StateRoot: t.TempDir(), Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := server.New(rt, server.Options{CORSOrigins: []string{"*"}}); err == nil || !strings.Contains(err.Error(), `"*" is not allowed`) {
		t.Errorf("New with origin *: %v", err)
	}
}

func TestEventStreamTakesTheTokenFromTheQuery(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: "secret"}})
	var r agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message": "hi"}`, &r)
	get := func(path string) *http.Response {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", f.url+path, nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	resp := get("/v1/sessions/" + r.SessionID + "/events?access_token=secret")
	if resp.StatusCode != 200 {
		t.Fatalf("stream with access_token: %d", resp.StatusCode)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.HasPrefix(line, "id: 1") {
		t.Errorf("first line %q", line)
	}
	if resp := get("/v1/sessions/" + r.SessionID + "/events?access_token=wrong"); resp.StatusCode != 401 {
		t.Errorf("stream with a wrong access_token: %d", resp.StatusCode)
	}
	// Only the event stream takes it.
	if resp := get("/v1/sessions?access_token=secret"); resp.StatusCode != 401 {
		t.Errorf("GET /v1/sessions with access_token: %d, want 401", resp.StatusCode)
	}
}
