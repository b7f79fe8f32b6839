package server

import (
	"net/http"
	"testing"
)

// TestHostPolicyTakesTheListenAddress: the host of the address Serve
// listens on is the server's own name, accepted without listing it; a
// wildcard adds nothing.
func TestHostPolicyTakesTheListenAddress(t *testing.T) {
	for _, c := range []struct {
		listen string
		host   string
		want   bool
	}{
		{"192.0.2.1", "192.0.2.1:8080", true},
		{"192.0.2.1", "192.0.2.2:8080", false},
		{"agent.lan", "AGENT.lan:8080", true},
		{"agent.lan", "x.agent.lan", false},
		{"2001:db8::1", "[2001:db8::1]:8080", true},
		{"0.0.0.0", "0.0.0.0:8080", false},
		{"::", "[::]:8080", false},
		{"", "evil.example", false},
	} {
		p, err := newHostPolicy(nil, c.listen, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := p.allows(&http.Request{Host: c.host}); got != c.want {
			t.Errorf("listening on %q, Host %q: allowed %v; want %v", c.listen, c.host, got, c.want)
		}
	}
}
