package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostCall sends a request to base with the Host header host and extra
// headers, and returns the status and the error code of a JSON error.
func hostCall(t *testing.T, method, base, path, host, body string, hdr http.Header) (int, apiError) {
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
	var e apiError
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &e)
	return resp.StatusCode, e
}

// refusal runs the built binary with extra environment variables for a
// command that must refuse at once, failing the test if it still runs
// after 30 s (it would be serving).
func refusal(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentkitBin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("agentkit %v was still running after 30s; want it to refuse at once", args)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running agentkit %v: %v", args, err)
	}
	return result{out.String(), errb.String(), cmd.ProcessState.ExitCode()}
}

func portOf(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

// hostProbes are requests of every route family: the API (read and turn
// routes), health, metrics, the playground page, its assets, the icon, an
// unknown route and a preflight.
var hostProbes = [][2]string{
	{"GET", "/v1/sessions"}, {"POST", "/v1/sessions"}, {"GET", "/v1/info"}, {"GET", "/v1/evals"}, {"GET", "/v1/abs"},
	{"GET", "/v1/sessions/x/events"}, {"GET", "/healthz"}, {"GET", "/metrics"}, {"GET", "/"}, {"GET", "/playground/app.js"},
	{"GET", "/favicon.ico"}, {"GET", "/nope"}, {"OPTIONS", "/v1/sessions"},
}

// TestDevRefusesARebindingHost is the reproduction against the
// built binary: agentkit dev without a token, a request naming another
// host (what a page on a name pointed at 127.0.0.1 sends), with its Origin
// or without one, on every route family.
func TestDevRefusesARebindingHost(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: rebind\n")
	p := startServe(t, dir, nil, "dev", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "s"))
	evil := "evil.example:" + portOf(t, p.url)
	for _, probe := range hostProbes {
		for _, hdr := range []http.Header{nil, {"Origin": {"http://" + evil}}, {"Origin": {"http://" + evil}, "Access-Control-Request-Method": {"POST"}}} {
			st, e := hostCall(t, probe[0], p.url, probe[1], evil, `{"message":"rebound"}`, hdr)
			if st != http.StatusMisdirectedRequest || e.Error.Code != "host_not_allowed" || !strings.Contains(e.Error.Message, `"`+evil+`"`) || !strings.Contains(e.Error.Message, "--allowed-hosts") {
				t.Errorf("%s %s with Host %s, %v: %d %+v; want 421 host_not_allowed naming the Host and --allowed-hosts", probe[0], probe[1], evil, hdr, st, e)
			}
		}
	}
	if n := len(listSessions(t, p.url, "")); n != 0 {
		t.Fatalf("%d sessions after the refused requests; want none", n)
	}
	// Out of the box, dev answers its loopback names.
	for _, host := range []string{"127.0.0.1:" + portOf(t, p.url), "localhost:" + portOf(t, p.url), "[::1]:" + portOf(t, p.url)} {
		for _, probe := range hostProbes[:4] {
			st, e := hostCall(t, probe[0], p.url, probe[1], host, `{"message":"local"}`, http.Header{"Origin": {"http://" + host}})
			if st != 200 && st != 201 {
				t.Errorf("%s %s with Host %s: %d %+v; want it served", probe[0], probe[1], host, st, e)
			}
		}
	}
	// The refusal is in the request log with the Host, for an operator
	// who means to allow it.
	if log := p.stderr.String(); !strings.Contains(log, "status=421") || !strings.Contains(log, "host="+evil) {
		t.Errorf("the log does not record the refused Host: %s", tail(log, 2000))
	}
	if p.stop(syscall.SIGINT) != 0 {
		t.Fatal("dev did not exit cleanly")
	}
}

// TestAllowedHostsFromFlagVariableAndFile allows a name three ways; bad
// entries are refused naming where they came from.
func TestAllowedHostsFromFlagVariableAndFile(t *testing.T) {
	t.Parallel()
	plain := writeProject(t, "name: hosts\n")
	listed := writeProject(t, "name: hosts\nallowedHosts: [agent.lan, .corp.example]\n")
	for _, c := range []struct {
		name string
		dir  string
		env  []string
		args []string
		ok   []string
		no   []string
	}{
		{"flag", plain, nil, []string{"--allowed-hosts", "agent.lan, .corp.example"}, []string{"agent.lan", "x.corp.example"}, []string{"evil.example"}},
		{"variable", plain, []string{"AGENTKIT_ALLOWED_HOSTS=agent.lan,.corp.example"}, nil, []string{"agent.lan", "corp.example"}, []string{"evil.example"}},
		{"file", listed, nil, nil, []string{"agent.lan:1", "x.corp.example"}, []string{"evil.example"}},
		{"flag over file", listed, nil, []string{"--allowed-hosts", "other.lan"}, []string{"other.lan"}, []string{"agent.lan"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"serve", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "s")}, c.args...)
			p := startServe(t, c.dir, c.env, args...)
			for _, h := range c.ok {
				if st, e := hostCall(t, "GET", p.url, "/v1/sessions", h, "", nil); st != 200 {
					t.Errorf("Host %s: %d %+v; want 200", h, st, e)
				}
			}
			for _, h := range c.no {
				if st, _ := hostCall(t, "GET", p.url, "/v1/sessions", h, "", nil); st != http.StatusMisdirectedRequest {
					t.Errorf("Host %s: %d; want 421", h, st)
				}
			}
			p.stop(syscall.SIGTERM)
		})
	}
	bad := writeProject(t, "name: hosts\nallowedHosts: [agent.lan, \"agent.lan:8080\"]\n")
	for _, c := range []struct {
		dir  string
		env  []string
		args []string
		want []string
	}{
		{plain, nil, []string{"serve", "--addr", "127.0.0.1:0", "--allowed-hosts", "*"}, []string{"--allowed-hosts", "wildcards"}},
		{plain, nil, []string{"dev", "--allowed-hosts", "http://agent.lan"}, []string{"--allowed-hosts", "URL"}},
		{plain, []string{"AGENTKIT_ALLOWED_HOSTS=agent.lan:80"}, []string{"serve", "--addr", "127.0.0.1:0"}, []string{"--allowed-hosts", "port"}},
		{bad, nil, []string{"serve", "--addr", "127.0.0.1:0"}, []string{"agentkit.yaml:2", "allowedHosts[1]", "port"}},
	} {
		r := refusal(t, c.dir, c.env, append(c.args, "--state-root", t.TempDir())...)
		if r.code != 2 || strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") != 0 {
			t.Errorf("agentkit %v (env %v): exit %d, stderr %q; want exit 2 and one line", c.args, c.env, r.code, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("agentkit %v (env %v): stderr %q does not mention %q", c.args, c.env, r.stderr, w)
			}
		}
	}
}

// TestServeOnEveryInterfaceNeedsAllowedHostsOrAToken: --insecure on
// 0.0.0.0 without a token is refused unless hosts are listed; with them it
// serves them and loopback, and refuses other names.
func TestServeOnEveryInterfaceNeedsAllowedHostsOrAToken(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: lan\n")
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		r := refusal(t, dir, nil, "serve", "--addr", addr, "--insecure", "--state-root", t.TempDir())
		if r.code != 2 || !strings.Contains(r.stderr, "--allowed-hosts") || !strings.Contains(r.stderr, "--auth-token") || !strings.Contains(r.stderr, "every interface") {
			t.Errorf("serve --addr %s --insecure: exit %d, stderr %q; want exit 2 naming --allowed-hosts and --auth-token", addr, r.code, r.stderr)
		}
	}
	// Without --insecure the refusal already says what to add.
	if r := refusal(t, dir, nil, "serve", "--addr", "0.0.0.0:0", "--state-root", t.TempDir()); r.code != 2 || !strings.Contains(r.stderr, "--insecure with --allowed-hosts") {
		t.Errorf("serve --addr 0.0.0.0:0: exit %d, stderr %q; want the refusal to name --insecure with --allowed-hosts", r.code, r.stderr)
	}
	p := startServe(t, dir, nil, "serve", "--addr", "0.0.0.0:0", "--insecure", "--allowed-hosts", "agent.lan", "--state-root", t.TempDir())
	_, port, err := net.SplitHostPort(strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://127.0.0.1:" + port // reached through loopback only
	for host, want := range map[string]int{"agent.lan:" + port: 200, "127.0.0.1:" + port: 200, "evil.example:" + port: 421, "0.0.0.0:" + port: 421} {
		if st, _ := hostCall(t, "GET", base, "/v1/sessions", host, "", nil); st != want {
			t.Errorf("serve on 0.0.0.0 with --allowed-hosts agent.lan, Host %s: %d; want %d", host, st, want)
		}
	}
	if p.stop(syscall.SIGTERM) != 0 {
		t.Fatal("serve did not exit cleanly")
	}
	// A token already defeats rebinding: on 0.0.0.0 with one, no list is
	// needed, and a foreign Host reaches the token check.
	const token = "a-token-of-at-least-16-bytes"
	p = startServe(t, dir, nil, "serve", "--addr", "0.0.0.0:0", "--auth-token", token, "--state-root", t.TempDir())
	_, port, _ = net.SplitHostPort(strings.TrimPrefix(p.url, "http://"))
	base = "http://127.0.0.1:" + port
	if st, _ := hostCall(t, "GET", base, "/v1/sessions", "proxy.example", "", nil); st != http.StatusUnauthorized {
		t.Errorf("a foreign Host without the token on a server with one: %d; want 401", st)
	}
	if st, _ := hostCall(t, "GET", base, "/v1/sessions", "proxy.example", "", http.Header{"Authorization": {"Bearer " + token}}); st != 200 {
		t.Errorf("a foreign Host with the token: %d; want 200", st)
	}
	p.stop(syscall.SIGTERM)
}
