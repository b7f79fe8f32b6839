package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/server"
)

// hostAnswer is what a request with a given Host header got.
type hostAnswer struct {
	status int
	header http.Header
	err    apiError
	body   string
}

// sendHost sends a request to base with the Host header host (the URL
// still dials base), and extra headers.
func sendHost(t *testing.T, base, method, path, host, body string, hdr http.Header) hostAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := hostAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	json.Unmarshal(b, &a.err)
	return a
}

// routeProbes are requests to every route of the server's route table (a
// wildcard filled with "x"), plus the playground's assets, an unknown
// route and a preflight: every route family the Host check must cover.
func routeProbes(t *testing.T, srv *server.Server) [][2]string {
	t.Helper()
	wildcard := regexp.MustCompile(`\{[^}]*\}`)
	var out [][2]string
	for _, pattern := range srv.Routes() {
		method, path, _ := strings.Cut(pattern, " ")
		path = strings.TrimSuffix(wildcard.ReplaceAllString(path, "x"), "/")
		if strings.HasSuffix(path, "{$}") || path == "" {
			path = "/"
		}
		if path == "/playground" {
			path = "/playground/app.js"
		}
		out = append(out, [2]string{method, path})
	}
	out = append(out, [2]string{"GET", "/no/such/route"}, [2]string{"OPTIONS", "/v1/sessions"}, [2]string{"HEAD", "/healthz"})
	if len(out) < 20 {
		t.Fatalf("only %d routes in the route table", len(out))
	}
	return out
}

// TestForgedHostIsRefusedOnEveryRoute is DNS rebinding seen from the
// server: a page on http://evil.example:PORT whose name was pointed at
// 127.0.0.1 sends its own name as the Host, with an Origin equal to it on
// a POST and none on a same-origin GET. Without a token, every route
// refuses it with 421, before any handler runs.
func TestForgedHostIsRefusedOnEveryRoute(t *testing.T) {
	const allowed = "https://chat.example.com"
	f := newFixture(t, fixtureOpts{Options: server.Options{CORSOrigins: []string{allowed}}})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(f.url, "http://"))
	evil := "evil.example:" + port
	for _, probe := range routeProbes(t, f.srv) {
		method, path := probe[0], probe[1]
		// The Host check runs before the origin check: a refused Host is
		// 421 whatever the Origin, an allowed one's preflight included.
		for _, hdr := range []http.Header{
			nil,
			{"Origin": {"http://" + evil}},
			{"Origin": {"http://" + evil}, "Access-Control-Request-Method": {"POST"}},
			{"Origin": {allowed}, "Access-Control-Request-Method": {"POST"}},
			{"Origin": {"https://other.example"}},
		} {
			a := sendHost(t, f.url, method, path, evil, `{"message":"rebound"}`, hdr)
			if a.status != http.StatusMisdirectedRequest {
				t.Errorf("%s %s with Host %s and %v: %d %s; want 421", method, path, evil, hdr, a.status, a.body)
				continue
			}
			if a.header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("%s %s with Host %s: the refusal carries CORS headers", method, path, evil)
			}
			if method == "HEAD" {
				continue
			}
			if a.err.Error.Code != server.CodeHostNotAllowed || !strings.Contains(a.err.Error.Message, `"`+evil+`"`) || !strings.Contains(a.err.Error.Message, "--allowed-hosts") {
				t.Errorf("%s %s with Host %s: %s; want the code %s, the Host and --allowed-hosts named", method, path, evil, a.body, server.CodeHostNotAllowed)
			}
		}
	}
	// Nothing ran: no session was started by the POSTs.
	var page agent.SessionPage
	if st := f.do("GET", "/v1/sessions", "", &page); st != 200 || len(page.Sessions) != 0 {
		t.Fatalf("after the refused requests: %d, %d sessions; want none", st, len(page.Sessions))
	}
	// Names that are not loopback's, however close.
	for _, host := range []string{"evil.example", "127.0.0.1.evil.example:" + port, "localhost.evil.example", "localhostx:" + port,
		"127.0.0.1:" + port + ":1", "[::1", "[evil]:" + port, "::1", "192.0.2.1:" + port, "[2001:db8::1]:" + port, "0.0.0.0:" + port} {
		if a := sendHost(t, f.url, "GET", "/v1/sessions", host, "", nil); a.status != http.StatusMisdirectedRequest {
			t.Errorf("GET /v1/sessions with Host %q: %d; want 421", host, a.status)
		}
	}
	// Loopback names pass, with or without the port, in any case.
	for _, host := range []string{"127.0.0.1:" + port, "127.0.0.1", "localhost:" + port, "localhost", "LocalHost:" + port, "localhost.:" + port,
		"[::1]:" + port, "[::1]", "127.0.0.2:" + port, "[::ffff:127.0.0.1]:" + port} {
		for _, hdr := range []http.Header{nil, {"Origin": {"http://" + host}}} {
			if a := sendHost(t, f.url, "GET", "/v1/sessions", host, "", hdr); a.status != http.StatusOK {
				t.Errorf("GET /v1/sessions with Host %q and %v: %d %s; want 200", host, hdr, a.status, a.body)
			}
		}
	}
	if a := sendHost(t, f.url, "POST", "/v1/sessions", "localhost:"+port, `{"message":"hi"}`, http.Header{"Origin": {"http://localhost:" + port}}); a.status != http.StatusCreated {
		t.Errorf("POST /v1/sessions from the server's own page on localhost: %d %s", a.status, a.body)
	}
}

// TestRequestWithoutHostIsRefused sends HTTP/1.0 requests without a Host
// header (a raw connection: Go's client always sends one).
func TestRequestWithoutHostIsRefused(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, path := range []string{"/healthz", "/v1/sessions", "/"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, "GET "+path+" HTTP/1.0\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(string(b), "without a Host header") {
			t.Errorf("GET %s without a Host: %d %s; want 421 saying there is no Host", path, resp.StatusCode, b)
		}
	}
}

func TestAllowedHostsAreServed(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{AllowedHosts: []string{"agent.example.com", ".corp.example", "192.0.2.10", "[2001:db8::1]", "Trailing.Example."}}})
	for host, want := range map[string]int{
		"agent.example.com": 200, "agent.example.com:8080": 200, "AGENT.Example.com:1": 200, "agent.example.com.": 200,
		"corp.example": 200, "a.corp.example:9": 200, "a.b.corp.example": 200,
		"192.0.2.10:8080": 200, "[2001:db8::1]:8080": 200, "trailing.example": 200,
		"localhost:1": 200, "127.0.0.1": 200,
		"evilcorp.example": 421, "corp.example.evil": 421, "agent.example.com.evil": 421, "x.agent.example.com": 421,
		"192.0.2.11": 421, "[2001:db8::2]:80": 421, "evil.example": 421,
	} {
		if a := sendHost(t, f.url, "GET", "/v1/info", host, "", nil); a.status != want {
			t.Errorf("Host %q with allowed hosts: %d; want %d", host, a.status, want)
		}
	}
}

// TestHostCheckWithAToken: a token already defeats DNS rebinding (the page
// does not know it), so the Host is not checked unless hosts are listed;
// then it is, on every route.
func TestHostCheckWithAToken(t *testing.T) {
	const token = "a-token-for-the-host-check"
	open := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: token}})
	auth := http.Header{"Authorization": {"Bearer " + token}}
	if a := sendHost(t, open.url, "GET", "/v1/sessions", "evil.example", "", nil); a.status != http.StatusUnauthorized {
		t.Errorf("token, no list, a foreign Host without the token: %d; want 401", a.status)
	}
	if a := sendHost(t, open.url, "GET", "/v1/sessions", "proxy.example", "", auth); a.status != http.StatusOK {
		t.Errorf("token, no list, a foreign Host with the token: %d; want 200", a.status)
	}
	listed := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: token, AllowedHosts: []string{"agent.example.com"}}})
	for _, path := range []string{"/v1/sessions", "/healthz", "/metrics", "/"} {
		if a := sendHost(t, listed.url, "GET", path, "evil.example", "", auth); a.status != http.StatusMisdirectedRequest {
			t.Errorf("token and list, GET %s with a foreign Host and the token: %d; want 421", path, a.status)
		}
		if a := sendHost(t, listed.url, "GET", path, "agent.example.com", "", auth); a.status != http.StatusOK {
			t.Errorf("token and list, GET %s with a listed Host: %d; want 200", path, a.status)
		}
	}
}

func TestCheckHostNames(t *testing.T) {
	for _, good := range []string{"agent.example.com", ".example.com", "localhost", "host_1", "192.0.2.1", "::1", "[::1]", "Agent.Example.COM.", " spaced.example "} {
		if err := server.CheckHostNames([]string{good}); err != nil {
			t.Errorf("CheckHostNames(%q): %v", good, err)
		}
	}
	for bad, want := range map[string]string{
		"*": "wildcards", "*.example.com": ".example.com", "http://agent.example.com": "URL", "agent.example.com:8080": "port",
		"[::1]:80": "port", "agent.example.com/app": "not a host name", "a b": "not a host name", "": "empty", "a..b": "label",
		".": "not a host name", "ex!ample": `'!'`, "user@host": "not a host name",
	} {
		err := server.CheckHostNames([]string{bad})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "allowed host") {
			t.Errorf("CheckHostNames(%q) = %v; want an error about the allowed host mentioning %q", bad, err, want)
		}
	}
	if _, err := server.New(openRuntime(t), server.Options{AllowedHosts: []string{"*"}}); err == nil || !strings.Contains(err.Error(), "wildcards") {
		t.Errorf("New with allowed host *: %v", err)
	}
}

func openRuntime(t *testing.T) *agent.Runtime {
	t.Helper()
	rt, err := agent.Open(context.Background(), agent.Config{Agent: agent.Agent{Name: "x", Model: echoModel(t)}, StateRoot: t.TempDir(), Store: memkv.New(), Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// TestServeRefusesAnOpenWildcardWithoutAllowedHosts: on every interface,
// with --insecure and no token, the server cannot tell its own names, so
// it refuses before binding the port and before touching the state root,
// unless hosts are listed (or a token is set).
func TestServeRefusesAnOpenWildcardWithoutAllowedHosts(t *testing.T) {
	root := filepath.Join(t.TempDir(), "state")
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		// A Serve that does not refuse stops at once instead of serving.
		ctx, cancel := context.WithCancel(context.Background())
		listened := false
		err := server.Serve(ctx, agent.Config{Agent: agent.Agent{Name: "open", Model: echoModel(t)}, StateRoot: root, Store: memkv.New()}, server.Config{
			Addr: addr, Insecure: true,
			Options:  server.Options{Logger: discardLogger()},
			OnListen: func(net.Addr) { listened = true; cancel() },
		})
		cancel()
		if !errors.Is(err, server.ErrOpenWildcard) || !strings.Contains(err.Error(), "--allowed-hosts") || !strings.Contains(err.Error(), "--auth-token") {
			t.Errorf("Serve on %s, insecure, no token, no hosts: %v; want ErrOpenWildcard naming --allowed-hosts and --auth-token", addr, err)
		}
		if listened {
			t.Errorf("Serve on %s listened before refusing", addr)
		}
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Serve touched the state root before refusing: %v", err)
	}
	for _, c := range []struct {
		addr, token string
		hosts       []string
		want        error
	}{
		{"0.0.0.0:8080", "", nil, server.ErrOpenWildcard},
		{":8080", "", nil, server.ErrOpenWildcard},
		{"[::]:8080", "", nil, server.ErrOpenWildcard},
		{"0.0.0.0:8080", "", []string{"agent.lan"}, nil},
		{"0.0.0.0:8080", "a-token-of-16-bytes", nil, nil},
		{"192.0.2.1:8080", "", nil, nil}, // a named address: its own Host is accepted
		{"127.0.0.1:8080", "", nil, nil},
	} {
		err := server.CheckAllowedHosts(c.addr, c.token, c.hosts)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("CheckAllowedHosts(%q, %q, %v) = %v; want %v", c.addr, c.token, c.hosts, err, c.want)
		}
	}
	if err := server.CheckAllowedHosts("0.0.0.0:8080", "", []string{"agent.lan:80"}); err == nil || errors.Is(err, server.ErrOpenWildcard) || !strings.Contains(err.Error(), "port") {
		t.Errorf("CheckAllowedHosts with an entry with a port: %v", err)
	}
}

// TestServeOnAWildcardWithAllowedHosts serves 0.0.0.0 with a list and
// reaches it through loopback only: the listed name and loopback names
// pass, another name is 421.
func TestServeOnAWildcardWithAllowedHosts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- server.Serve(ctx, agent.Config{Agent: agent.Agent{Name: "lan", Model: echoModel(t)}, StateRoot: t.TempDir(), Store: memkv.New()}, server.Config{
			Addr: "0.0.0.0:0", Insecure: true,
			Options:  server.Options{Logger: discardLogger(), AllowedHosts: []string{"agent.lan"}},
			OnListen: func(a net.Addr) { addrs <- a },
		})
	}()
	var base string
	select {
	case a := <-addrs:
		_, port, _ := net.SplitHostPort(a.String())
		base = (&url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", port)}).String()
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	for host, want := range map[string]int{"agent.lan:1": 200, "127.0.0.1": 200, "localhost": 200, "evil.example": 421, "0.0.0.0": 421} {
		if a := sendHost(t, base, "GET", "/healthz", host, "", nil); a.status != want {
			t.Errorf("GET /healthz with Host %s on 0.0.0.0 with allowed hosts: %d; want %d", host, a.status, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
