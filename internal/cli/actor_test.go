package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"agentkit/keys"
)

// agentkit actor get|patch through a running server's HTTP API and on the
// state root directly: patch is refused while a server holds the state
// root, get reads beside it, and what one path writes the other reads.
func TestActorCommand(t *testing.T) {
	const token = "actor-test-token-0123456789"
	dir := writeProject(t, "name: acts\n")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--auth-token", token)
	id := start(t, p.url, token, "hello").SessionID
	u, _ := url.Parse(p.url)
	want := func(what string, r result, code int, stdout string, stderr ...string) {
		t.Helper()
		if r.code != code || (stdout != "" && r.stdout != stdout) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q", what, r.code, r.stdout, r.stderr, code, stdout)
		}
		for _, s := range stderr {
			if !strings.Contains(r.stderr, s) {
				t.Fatalf("%s: stderr %q does not say %q", what, r.stderr, s)
			}
		}
	}

	// Through the server.
	want("remote get of a new session", run(t, dir, nil, "", "actor", "get", "--url", p.url, "--auth-token", token, id), 0, "{}\n")
	want("remote patch", run(t, dir, nil, "", "actor", "patch", "--url", p.url, "--auth-token", token, id, `{"status":"busy","tags":{"a":1}}`),
		0, `{"status":"busy","tags":{"a":1}}`+"\n")
	env := []string{"AGENTKIT_AUTH_TOKEN=" + token}
	want("remote patch from standard input, --addr, the token from the environment",
		run(t, dir, env, `{"tags":{"a":null,"b":2}}`, "actor", "patch", "--addr", u.Host, id, "-"), 0, `{"status":"busy","tags":{"b":2}}`+"\n")
	want("remote get", run(t, dir, env, "", "actor", "get", "--addr", u.Host, id), 0, `{"status":"busy","tags":{"b":2}}`+"\n")
	want("remote get without the token", run(t, dir, nil, "", "actor", "get", "--url", p.url, id), 1, "", "401 unauthorized")
	want("remote get of an unknown session", run(t, dir, env, "", "actor", "get", "--url", p.url, "no-such"), 1, "", "404 session_not_found")
	want("remote patch making the state an array", run(t, dir, env, "", "actor", "patch", "--url", p.url, id, `[1]`), 2, "", "422 invalid_state", "JSON object")
	// The route itself, as a browser or curl sends it.
	req, _ := http.NewRequest("GET", p.url+"/v1/sessions/"+id+"/state", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `{"status":"busy","tags":{"b":2}}`+"\n" {
		t.Fatalf("GET state: %d %q", resp.StatusCode, body)
	}

	// On the state root while the server holds it: get reads, patch is
	// refused naming the holder and the way through the server.
	want("local get beside the server", run(t, dir, nil, "", "actor", "get", id), 0, `{"status":"busy","tags":{"b":2}}`+"\n")
	want("local patch beside the server", run(t, dir, nil, "", "actor", "patch", "--dir", dir, id, `{"n":1}`), 1, "", "is in use by", "pid", "--url")

	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	want("local patch", run(t, t.TempDir(), nil, "", "actor", "patch", "--dir", dir, id, `{"n":12345678901234567890,"status":null}`),
		0, `{"tags":{"b":2},"n":12345678901234567890}`+"\n")
	want("local patch from standard input", run(t, dir, nil, `{"more":true}`, "actor", "patch", id), 0, `{"tags":{"b":2},"n":12345678901234567890,"more":true}`+"\n")
	want("local get with --state-root", run(t, t.TempDir(), nil, "", "actor", "get", "--state-root", filepath.Join(dir, ".agentkit"), id),
		0, `{"tags":{"b":2},"n":12345678901234567890,"more":true}`+"\n")
	want("local patch that is not JSON", run(t, dir, nil, "", "actor", "patch", id, "{\n \"a\": nope}"), 2, "", "line 2, column 7")
	want("local patch making the state a string", run(t, dir, nil, "", "actor", "patch", id, `"s"`), 2, "", "JSON object, not a string")
	want("local get of an unknown session", run(t, dir, nil, "", "actor", "get", "no-such"), 1, "", "no session no-such")
	want("local patch of an unknown session", run(t, dir, nil, "", "actor", "patch", "no-such", `{}`), 1, "", "no session no-such")
	want("local get without a state root", run(t, t.TempDir(), nil, "", "actor", "get", "x"), 1, "", "no state root at .agentkit")

	// The server sees what the command wrote.
	p = startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--auth-token", token)
	want("remote get after the local patches", run(t, dir, env, "", "actor", "get", "--url", p.url, id), 0, `{"tags":{"b":2},"n":12345678901234567890,"more":true}`+"\n")
}

func TestActorCommandUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"actor", "frob", "x"}, "use get or patch"},
		{[]string{"actor", "get"}, "agentkit actor get SESSION"},
		{[]string{"actor", "patch"}, "agentkit actor patch SESSION"},
		{[]string{"actor", "get", "a", "b"}, "wrong number of arguments"},
		{[]string{"actor", "get", "--url", "http://x", "--addr", "y:1", "s"}, "not both"},
		{[]string{"actor", "get", "--url", "ftp://x", "s"}, "--url"},
		{[]string{"actor", "patch", "s", "{nope"}, "invalid JSON in the patch at line 1, column 2"},
	} {
		r := run(t, dir, nil, "", c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("agentkit %v: exit %d, stderr %q; want exit 2 and one line saying %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// agentkit actor reads a session's actor still in the key-value layout of
// earlier builds from the agent's store without changing it, and its patch
// migrates it as the state root's host.
func TestActorCommandMigratesTheKeyValueLayout(t *testing.T) {
	dir := writeProject(t, "name: legacy\n")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")
	id := start(t, p.url, "", "hello").SessionID
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	scope, _ := keys.Agent("legacy")
	prefix, _ := scope.Actor(id)
	if r := run(t, dir, nil, `{"status":"from kv"}`, "kv", "put", prefix+"state"); r.code != 0 {
		t.Fatalf("kv put: %d %s", r.code, r.stderr)
	}
	if r := run(t, dir, nil, "", "actor", "get", id); r.code != 0 || r.stdout != `{"status":"from kv"}`+"\n" {
		t.Fatalf("get of a key-value actor: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run(t, dir, nil, "", "kv", "get", prefix+"state"); r.code != 0 {
		t.Fatalf("the get changed the key-value layout: %d %s", r.code, r.stderr)
	}
	if r := run(t, dir, nil, "", "actor", "patch", id, `{"n":1}`); r.code != 0 || r.stdout != `{"status":"from kv","n":1}`+"\n" {
		t.Fatalf("patch of a key-value actor: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run(t, dir, nil, "", "kv", "get", prefix+"state"); r.code != 1 {
		t.Fatalf("the migrated state is still in the store: %d %q", r.code, r.stdout)
	}
	hostID, err := os.ReadFile(filepath.Join(dir, ".agentkit", "HOST_ID"))
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, dir, nil, "", "kv", "get", prefix+"migrated")
	var m struct{ Host, State string }
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil || m.Host != strings.TrimSpace(string(hostID)) || m.State != "migrated" {
		t.Fatalf("the marker %q (%v); want state migrated naming host %s", r.stdout, err, hostID)
	}
	p = startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")
	if r := run(t, dir, nil, "", "actor", "get", "--url", p.url, id); r.code != 0 || r.stdout != `{"status":"from kv","n":1}`+"\n" {
		t.Fatalf("the server's view after the migration: %d %q %q", r.code, r.stdout, r.stderr)
	}
}
