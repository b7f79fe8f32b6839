package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// CodeHostNotAllowed is the error code of a request whose Host header
// names a host the server does not answer for (421).
const CodeHostNotAllowed = "host_not_allowed"

// ErrOpenWildcard is returned by CheckAllowedHosts and Serve for an
// address on every interface (0.0.0.0, ::, or an empty host) without an
// auth token and without allowed hosts: such a server would answer any
// name that a DNS record points at the machine.
var ErrOpenWildcard = errors.New("server: refusing to serve every interface without an auth token and without allowed hosts")

// hostPolicy is the Host check that keeps a page on another site from
// reaching the server through DNS rebinding: a page on
// http://evil.example:8080 whose name the attacker re-points at 127.0.0.1
// is the same origin as the server for the browser, so its requests carry
// the Host evil.example:8080 (and, being same-origin, often no Origin).
// Without a token, only names that cannot be re-pointed by someone else
// pass: loopback names and IPs, the address the server listens on, and the
// hosts the operator lists.
type hostPolicy struct {
	on      bool            // whether requests are checked
	exact   map[string]bool // normalized names and IPs
	domains []string        // ".example.com" entries: the domain and its subdomains
}

// newHostPolicy builds the Host check of a server: on without a token, or
// when hosts are listed. listen is the host part of the address the server
// listens on ("" when unknown or a wildcard).
func newHostPolicy(hosts []string, listen, token string) (*hostPolicy, error) {
	p := &hostPolicy{exact: map[string]bool{}, on: token == "" || len(hosts) > 0}
	for _, h := range hosts {
		norm, err := normalizeHostEntry(h)
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(norm, ".") {
			p.domains = append(p.domains, norm)
		} else {
			p.exact[norm] = true
		}
	}
	if listen != "" && !isWildcardHost(listen) {
		if norm, err := normalizeHostEntry(listen); err == nil {
			p.exact[norm] = true
		}
	}
	return p, nil
}

// allows reports whether the server answers for the request's Host.
func (p *hostPolicy) allows(r *http.Request) bool {
	if !p.on {
		return true
	}
	host, ok := requestHost(r.Host)
	if !ok {
		return false
	}
	if host == "localhost" || p.exact[host] {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	for _, d := range p.domains {
		if host == d[1:] || strings.HasSuffix(host, d) {
			return true
		}
	}
	return false
}

// refuse answers a request whose Host the server does not answer for: 421
// in the API's error shape, naming the Host and how to allow it. It does
// not list the allowed hosts: the answer goes to whoever asks.
func (p *hostPolicy) refuse(w http.ResponseWriter, r *http.Request) {
	what := "a request without a Host header"
	if r.Host != "" {
		what = "the Host " + clipOrigin(r.Host)
	}
	writeError(w, http.StatusMisdirectedRequest, CodeHostNotAllowed,
		"this server answers for localhost, 127.0.0.1, [::1], its listen address and the hosts its operator allows, not for "+what+
			" (a page on a name pointed at this machine, DNS rebinding, is refused so); if clients reach the server by this name, allow it with --allowed-hosts (or allowedHosts in agentkit.yaml)")
}

// requestHost returns the host part of a Host header, lowercased, without
// the port, the IPv6 brackets or a trailing dot; ok is false when the
// header is empty or malformed.
func requestHost(h string) (string, bool) {
	if h == "" {
		return "", false
	}
	host := h
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 || (end+1 < len(h) && h[end+1] != ':') {
			return "", false
		}
		host = h[1:end]
		if net.ParseIP(host) == nil {
			return "", false
		}
	} else if i := strings.LastIndexByte(h, ':'); i >= 0 {
		host = h[:i]
		if strings.Contains(host, ":") {
			return "", false // an IPv6 address without brackets is not a Host
		}
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" {
		return "", false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.String(), true
	}
	return host, true
}

// CheckHostNames validates an allowed-hosts list: each entry a host name
// (agent.example.com), an IP address (192.0.2.10, ::1 or [::1]), or a
// domain with a leading dot (.example.com: the domain and every name under
// it), without a scheme, a port or a path. A Host matches an entry whatever
// its port. "*" is refused: it would let any name, and so DNS rebinding,
// reach a server without a token.
func CheckHostNames(hosts []string) error {
	for _, h := range hosts {
		if _, err := normalizeHostEntry(h); err != nil {
			return err
		}
	}
	return nil
}

// normalizeHostEntry checks an allowed-hosts entry and returns it
// lowercased, an IP in its canonical form.
func normalizeHostEntry(h string) (string, error) {
	h = strings.TrimSpace(h)
	switch {
	case h == "":
		return "", errors.New("server: an allowed host is empty; list host names such as agent.example.com")
	case h == "*" || strings.HasPrefix(h, "*"):
		return "", fmt.Errorf("server: allowed host %q: wildcards are not allowed, as any name would reach the server; list each name, or .example.com for a domain and the names under it", h)
	case strings.Contains(h, "://"):
		return "", fmt.Errorf("server: allowed host %q is a URL; write the host name alone, such as agent.example.com", h)
	case strings.ContainsAny(h, "/?#@ "):
		return "", fmt.Errorf("server: allowed host %q is not a host name; write a name such as agent.example.com, an IP address, or .example.com for a domain and the names under it", h)
	}
	inner := h
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		inner = h[1 : len(h)-1]
	}
	if ip := net.ParseIP(inner); ip != nil {
		return ip.String(), nil
	}
	if strings.Contains(h, ":") {
		return "", fmt.Errorf("server: allowed host %q has a port or is not an address; write the host without the port (a Host matches whatever its port)", h)
	}
	name := strings.TrimSuffix(strings.ToLower(h), ".")
	labels := strings.TrimPrefix(name, ".")
	if labels == "" {
		return "", fmt.Errorf("server: allowed host %q is not a host name; write a name such as agent.example.com", h)
	}
	for _, l := range strings.Split(labels, ".") {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("server: allowed host %q is not a host name (an empty or overlong label); write a name such as agent.example.com", h)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("server: allowed host %q holds %q, which is not in a host name; write a name of letters, digits, dashes and dots", h, c)
			}
		}
	}
	return name, nil
}

// isWildcardHost reports whether a listen address's host part means every
// interface: empty, 0.0.0.0 or ::.
func isWildcardHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsUnspecified()
}

// CheckAllowedHosts checks the Host policy of a listen address: the
// allowed hosts' syntax (CheckHostNames), and, for an address on every
// interface (0.0.0.0:8080, [::]:8080, :8080) without an auth token, that
// hosts are listed: the server cannot tell otherwise which names are its
// own, and would answer a page on any name pointed at the machine. The
// refusal wraps ErrOpenWildcard and names what to set.
func CheckAllowedHosts(addr, token string, hosts []string) error {
	if err := CheckHostNames(hosts); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("server: the address %q is not HOST:PORT (such as 127.0.0.1:8080, or :8080 for every interface)", addr)
	}
	if token == "" && len(hosts) == 0 && isWildcardHost(host) {
		return fmt.Errorf("%w: %s listens on every interface, so a web page on any name pointed at this machine could call it (DNS rebinding); set --allowed-hosts (or AGENTKIT_ALLOWED_HOSTS, allowedHosts in agentkit.yaml) to the names and addresses clients use, such as agent.lan,192.0.2.10, or set --auth-token", ErrOpenWildcard, addr)
	}
	return nil
}

// clipHost bounds a Host header recorded in the request log.
func clipHost(h string) string {
	if len(h) > 100 {
		return h[:100] + "…"
	}
	return h
}
