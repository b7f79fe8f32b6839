package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRunOnACleanFolder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tmp := t.TempDir()
	r := run(t, dir, []string{"TMPDIR=" + tmp}, "", "run", "hello")
	if r.code != 0 {
		t.Fatalf("run hello: exit %d, stderr %q", r.code, r.stderr)
	}
	m := regexp.MustCompile(`(?s)^echo: hello\n\nsession: (\S+)\ncontinuation token: (\S+)\n$`).FindStringSubmatch(r.stdout)
	if m == nil || len(m[2]) < 43 {
		t.Fatalf("run printed %q; want the answer, then the session and a continuation token", r.stdout)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Fatalf("the temporary state root was left behind: %v", entries)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("run wrote into the working folder: %v", entries)
	}
}

func TestRunKeepsAGivenStateRootAndContinues(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(t.TempDir(), "state")
	r := run(t, dir, nil, "", "run", "--state-root", root, "first message")
	tok := regexp.MustCompile(`continuation token: (\S+)`).FindStringSubmatch(r.stdout)
	if r.code != 0 || tok == nil {
		t.Fatalf("run: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r2 := run(t, dir, []string{"AGENTKIT_STATE_ROOT=" + root}, "", "run", "--json", "--continue", tok[1], "second", "message")
	var res turnResult
	if r2.code != 0 || json.Unmarshal([]byte(r2.stdout), &res) != nil {
		t.Fatalf("run --continue: exit %d, stdout %q, stderr %q", r2.code, r2.stdout, r2.stderr)
	}
	if res.ContinuationToken != tok[1] || res.Turn.Result != "echo: second message" {
		t.Fatalf("run --continue answered %+v; want the same session, echoing the joined arguments", res)
	}
	r3 := run(t, dir, []string{"AGENTKIT_STATE_ROOT=" + root}, "", "run", "--continue", "not-a-token", "x")
	if r3.code != 1 || !strings.Contains(r3.stderr, "unknown continuation token") {
		t.Fatalf("run with an unknown token: exit %d, stderr %q", r3.code, r3.stderr)
	}
}

// TestInitThenServe scaffolds a project, checks its eval cases against the
// echo model, serves it and runs a session through the API.
func TestInitThenServe(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	r := run(t, parent, nil, "", "init", "My Agent")
	if r.code != 0 {
		t.Fatalf("init: exit %d, stderr %q", r.code, r.stderr)
	}
	dir := filepath.Join(parent, "My Agent")
	yaml, _ := os.ReadFile(filepath.Join(dir, "agentkit.yaml"))
	instr, _ := os.ReadFile(filepath.Join(dir, "instructions.md"))
	for _, want := range []string{"name: my-agent", "model: echo", "memory: true", `storage: ""`, "serving: local", "#   restore:", "#     maxSessions: 1000"} {
		if !strings.Contains(string(yaml), want) {
			t.Errorf("agentkit.yaml lacks %q:\n%s", want, yaml)
		}
	}
	if !strings.Contains(string(instr), "## Memory") || !strings.Contains(string(instr), "untrusted") {
		t.Errorf("instructions.md has no ## Memory section saying records are untrusted:\n%s", instr)
	}
	if r := run(t, parent, nil, "", "init", "My Agent"); r.code != 1 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("a second init over the project: exit %d, stderr %q; want exit 1 keeping the files", r.code, r.stderr)
	}

	// Every case of cases.jsonl passes with the echo model.
	f, err := os.Open(filepath.Join(dir, "cases.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	cases := 0
	for sc.Scan() {
		var c struct {
			Name   string
			Input  string
			Expect map[string]string
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil || c.Input == "" || len(c.Expect) != 1 {
			t.Fatalf("cases.jsonl line %q: %v", sc.Text(), err)
		}
		r := run(t, dir, nil, "", "run", "--json", c.Input)
		var res turnResult
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
			t.Fatalf("case %s: exit %d, stderr %q", c.Name, r.code, r.stderr)
		}
		got := res.Turn.Result
		for kind, want := range c.Expect {
			ok := false
			switch kind {
			case "exact":
				ok = got == want
			case "contains":
				ok = strings.Contains(got, want)
			case "regexp":
				ok = regexp.MustCompile(want).MatchString(got)
			default:
				t.Fatalf("case %s: unknown grader %q", c.Name, kind)
			}
			if !ok {
				t.Errorf("case %s: answer %q fails %s %q", c.Name, got, kind, want)
			}
		}
		cases++
	}
	if cases < 2 {
		t.Fatalf("cases.jsonl has %d cases", cases)
	}

	p := startServe(t, parent, nil, "serve", "--dir", dir, "--addr", "127.0.0.1:0")
	s := start(t, p.url, "", "hello")
	if s.Turn.Result != "echo: hello" {
		t.Fatalf("first turn answered %q", s.Turn.Result)
	}
	st, c := continueWith(t, p.url, "", s.ContinuationToken, "more")
	if st != 200 || c.SessionID != s.SessionID || c.Turn.Result != "echo: more" {
		t.Fatalf("continue: status %d, %+v", st, c)
	}
	list := listSessions(t, p.url, "")
	if len(list) != 1 || list[0].ID != s.SessionID || list[0].Turns != 2 {
		t.Fatalf("listed %+v", list)
	}
	var got struct {
		Session sessionMeta
		Events  []struct{ Type, Message, Result string }
	}
	call(t, "GET", p.url+"/v1/sessions/"+s.SessionID, "", "", &got)
	if got.Session.Turns != 2 || len(got.Events) != got.Session.LastSeq || got.Events[0].Message != "hello" {
		t.Fatalf("GET the session: %+v", got)
	}
	// The state root defaults to .agentkit in the project, and memory is on.
	journal, err := os.ReadFile(filepath.Join(dir, ".agentkit", "memory", "journal.jsonl"))
	if err != nil || strings.Count(string(journal), "\n") != 2 || !strings.Contains(string(journal), `"userMessage":"more"`) {
		t.Fatalf("the memory journal under the project's .agentkit: %v\n%s", err, journal)
	}
	var info struct {
		Agent, Serving, JournalPath string
		Memory                      bool
	}
	call(t, "GET", p.url+"/v1/info", "", "", &info)
	if info.Agent != "my-agent" || info.Serving != "local" || !info.Memory || info.JournalPath != "memory/journal.jsonl" {
		t.Fatalf("info %+v", info)
	}

	// DELETE removes the session here and in the store, which agentkit kv
	// reads beside the running server.
	root := filepath.Join(dir, ".agentkit")
	keys := run(t, parent, nil, "", "kv", "ls", "--state-root", root)
	if keys.code != 0 || !strings.Contains(keys.stdout, s.SessionID) || !strings.Contains(keys.stdout, "/continuations/") {
		t.Fatalf("the store before the delete: exit %d, %q, stderr %q", keys.code, keys.stdout, keys.stderr)
	}
	if st := call(t, "DELETE", p.url+"/v1/sessions/"+s.SessionID, "", "", nil); st != 204 {
		t.Fatalf("DELETE: %d", st)
	}
	if st := call(t, "GET", p.url+"/v1/sessions/"+s.SessionID, "", "", nil); st != 404 {
		t.Fatalf("GET after DELETE: %d", st)
	}
	// Only the session's tombstone (its head) stays, so that no host
	// brings the session back.
	keys = run(t, parent, nil, "", "kv", "ls", "--state-root", root)
	left := strings.ReplaceAll(keys.stdout, "agentkit/v1/my-agent/sessions/"+s.SessionID+"/head\n", "")
	if keys.code != 0 || strings.Contains(left, s.SessionID) || strings.Contains(keys.stdout, "/continuations/") {
		t.Fatalf("the store after the delete still holds the session: exit %d, %q", keys.code, keys.stdout)
	}
	if code := p.stop(syscall.SIGINT); code != 0 {
		t.Fatalf("serve exited %d after SIGINT", code)
	}
}

// TestEventsStreamWhileATurnRuns watches a turn that waits three seconds
// in its last step: its events arrive on the POST's stream and on a live
// GET stream while the session shows the turn unfinished.
func TestEventsStreamWhileATurnRuns(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, slowYAML)
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")
	post := openStream(t, "POST", p.url+"/v1/sessions", "", `{"message":"watch me"}`)
	var sessionID string
	var names []string
	for {
		ev := nextEvent(t, post)
		names = append(names, ev.name)
		var e struct{ SessionID string }
		json.Unmarshal([]byte(ev.data), &e)
		sessionID = e.SessionID
		if ev.name == "tool.result" {
			break
		}
	}
	if strings.Join(names, " ") != "turn.started model.call tool.call tool.result" {
		t.Fatalf("streamed events %v", names)
	}
	// The turn is now in its three-second step.
	var mid struct{ Session sessionMeta }
	call(t, "GET", p.url+"/v1/sessions/"+sessionID, "", "", &mid)
	if mid.Session.Turns != 1 || mid.Session.LastStatus != "" || mid.Session.LastSeq != 4 {
		t.Fatalf("mid-turn the session is %+v; want turn 1 running (no status yet) after 4 events", mid.Session)
	}
	live := openStream(t, "GET", p.url+"/v1/sessions/"+sessionID+"/events", "", "")
	for i, want := range []string{"turn.started", "model.call", "tool.call", "tool.result", "model.call", "turn.finished"} {
		ev := nextEvent(t, live)
		if ev.name != want || ev.id != fmt.Sprint(i+1) {
			t.Fatalf("live event %d: %s (id %s), want %s (id %d)", i+1, ev.name, ev.id, want, i+1)
		}
	}
	for _, want := range []string{"model.call", "turn.finished", "result"} {
		if ev := nextEvent(t, post); ev.name != want {
			t.Fatalf("the POST stream sent %s, want %s", ev.name, want)
		} else if want == "result" {
			var res turnResult
			if err := json.Unmarshal([]byte(ev.data), &res); err != nil || res.SessionID != sessionID || res.Turn.Result != "done: watch me" || res.ContinuationToken == "" {
				t.Fatalf("the result event %q: %v", ev.data, err)
			}
		}
	}
}

// TestRestartKeepsSessionsAndTokens stops a server gracefully during a
// turn (the turn finishes), then kills one with SIGKILL; after each
// restart on the same state root the sessions are listed and their tokens
// continue them.
func TestRestartKeepsSessionsAndTokens(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, slowYAML)
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")

	// A second server on the same state root fails at once, naming it.
	r := run(t, dir, nil, "", "serve", "--addr", "127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, filepath.Join(dir, ".agentkit")) || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("a second serve on the state root: exit %d, stderr %q", r.code, r.stderr)
	}

	post := openStream(t, "POST", p.url+"/v1/sessions", "", `{"message":"survive"}`)
	for ev := nextEvent(t, post); ev.name != "tool.result"; ev = nextEvent(t, post) {
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil { // mid-turn
		t.Fatal(err)
	}
	var res turnResult
	for ev := range post {
		if ev.name == "result" {
			json.Unmarshal([]byte(ev.data), &res)
		}
	}
	if res.Turn.Status != "completed" || res.Turn.Result != "done: survive" {
		t.Fatalf("the turn running at SIGTERM ended %+v; want it finished", res)
	}
	if code := p.wait(); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM", code)
	}

	p2 := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")
	list := listSessions(t, p2.url, "")
	if len(list) != 1 || list[0].ID != res.SessionID || list[0].LastStatus != "completed" {
		t.Fatalf("after a graceful restart: %+v", list)
	}
	st, c := continueWith(t, p2.url, "", res.ContinuationToken, "still here")
	if st != 200 || c.SessionID != res.SessionID || c.Turn.Result != "done: still here" {
		t.Fatalf("continue after restart: %d %+v", st, c)
	}
	if code := p2.stop(syscall.SIGKILL); code != -1 {
		t.Fatalf("SIGKILL: exit code %d", code)
	}

	p3 := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")
	list = listSessions(t, p3.url, "")
	if len(list) != 1 || list[0].Turns != 2 {
		t.Fatalf("after SIGKILL and restart: %+v", list)
	}
	st, c = continueWith(t, p3.url, "", res.ContinuationToken, "and again")
	if st != 200 || c.SessionID != res.SessionID {
		t.Fatalf("continue after SIGKILL: %d %+v", st, c)
	}
	var got struct{ Session sessionMeta }
	call(t, "GET", p3.url+"/v1/sessions/"+res.SessionID, "", "", &got)
	if got.Session.Turns != 3 {
		t.Fatalf("the session has %d turns, want 3", got.Session.Turns)
	}
}

// TestRestorePolicyThroughTheAPI shares one SQLite store between servers
// with fresh state roots: restore caps and restore off show in what they
// list, and an unrestored session still continues on demand.
func TestRestorePolicyThroughTheAPI(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "shared.db")
	writer := writeProject(t, "name: shared\n")
	p := startServe(t, writer, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store)
	var made []turnResult
	for i := range 3 {
		made = append(made, start(t, p.url, "", fmt.Sprintf("session %d", i)))
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}

	capped := writeProject(t, "name: shared\npolicy:\n  restore:\n    maxSessions: 2\n")
	off := writeProject(t, "name: shared\npolicy:\n  restore: off\n")
	pc := startServe(t, capped, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store)
	po := startServe(t, off, []string{"AGENTKIT_STORAGE=" + store}, "serve", "--addr", "127.0.0.1:0")

	list := listSessions(t, pc.url, "")
	if len(list) != 2 || list[0].ID != made[2].SessionID || list[1].ID != made[1].SessionID {
		t.Fatalf("with maxSessions 2 the fresh host lists %+v; want the two newest", list)
	}
	var info struct {
		Storage struct {
			Restore struct {
				Off         bool
				MaxSessions int
			}
		}
	}
	call(t, "GET", pc.url+"/v1/info", "", "", &info)
	if info.Storage.Restore.MaxSessions != 2 || info.Storage.Restore.Off {
		t.Fatalf("info.storage.restore %+v", info.Storage.Restore)
	}
	// The oldest was not restored, but its token still reaches it.
	st, c := continueWith(t, pc.url, "", made[0].ContinuationToken, "the oldest")
	if st != 200 || c.SessionID != made[0].SessionID {
		t.Fatalf("continue the unrestored session: %d %+v", st, c)
	}

	if list := listSessions(t, po.url, ""); len(list) != 0 {
		t.Fatalf("with restore off the fresh host lists %+v; want none", list)
	}
	call(t, "GET", po.url+"/v1/info", "", "", &info)
	if !info.Storage.Restore.Off {
		t.Fatalf("info.storage.restore %+v; want off", info.Storage.Restore)
	}
	st, c = continueWith(t, po.url, "", made[1].ContinuationToken, "on demand")
	if st != 200 || c.SessionID != made[1].SessionID {
		t.Fatalf("continue with restore off: %d %+v", st, c)
	}
	if list := listSessions(t, po.url, ""); len(list) != 1 || list[0].ID != made[1].SessionID || list[0].Turns != 2 {
		t.Fatalf("after loading on demand: %+v", list)
	}
}

// TestStoreOutageIs503 takes the store (PostgreSQL behind a proxy the
// test owns) away from a running server: a token it must resolve through
// the store gets 503, never a new session, and the server keeps serving.
func TestStoreOutageIs503(t *testing.T) {
	t.Parallel()
	_, pg := postgresURL(t)
	proxy := newProxy(t, pg.Host)
	viaProxy := *pg
	viaProxy.Host = proxy.Addr()
	store := viaProxy.String()

	dir := writeProject(t, "name: outage\npolicy:\n  restore: off\n")
	a := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir())
	s := start(t, a.url, "", "before")
	a.stop(syscall.SIGTERM)

	b := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir())
	proxy.Close()
	var e apiError
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"during"}`, s.ContinuationToken)
	if st := call(t, "POST", b.url+"/v1/sessions/continue", "", body, &e); st != 503 || e.Error.Code != "store_unavailable" {
		t.Fatalf("continue during the outage: status %d %+v; want 503 store_unavailable", st, e)
	}
	if st := call(t, "GET", b.url+"/v1/sessions/"+s.SessionID, "", "", &e); st != 503 {
		t.Fatalf("GET a session not on disk during the outage: status %d", st)
	}
	if st := call(t, "GET", b.url+"/healthz", "", "", nil); st != 200 {
		t.Fatalf("healthz during the outage: %d", st)
	}
	if list := listSessions(t, b.url, ""); len(list) != 0 {
		t.Fatalf("the outage opened sessions: %+v", list)
	}
	if strings.Contains(b.stderr.String(), s.ContinuationToken) {
		t.Fatal("the server logged a continuation token")
	}
}

// TestTwoServersSharePostgres starts a session on one server and continues
// it on another through its token, both on one PostgreSQL table.
func TestTwoServersSharePostgres(t *testing.T) {
	t.Parallel()
	store, _ := postgresURL(t)
	dir := writeProject(t, "name: shared-pg\n")
	a := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir())
	b := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir())
	s := start(t, a.url, "", "on host a")
	st, c := continueWith(t, b.url, "", s.ContinuationToken, "on host b")
	if st != 200 || c.SessionID != s.SessionID || c.ContinuationToken != s.ContinuationToken || c.Turn.Result != "echo: on host b" {
		t.Fatalf("continue on host b: %d %+v", st, c)
	}
	var got struct {
		Session sessionMeta
		Events  []struct{ Type, Message string }
	}
	call(t, "GET", b.url+"/v1/sessions/"+s.SessionID, "", "", &got)
	if got.Session.Turns != 2 || got.Events[0].Message != "on host a" {
		t.Fatalf("host b sees %+v", got)
	}
	var info struct{ Storage struct{ Name string } }
	call(t, "GET", b.url+"/v1/info", "", "", &info)
	if strings.Contains(info.Storage.Name, "@") || !strings.Contains(info.Storage.Name, "postgres") {
		t.Fatalf("info.storage.name %q", info.Storage.Name)
	}
}

func TestAuthToken(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: guarded\n")
	p := startServe(t, dir, []string{"AGENTKIT_AUTH_TOKEN=env-token-123"}, "serve", "--addr", "127.0.0.1:0")
	var e apiError
	if st := call(t, "GET", p.url+"/v1/sessions", "", "", &e); st != 401 || e.Error.Code != "unauthorized" {
		t.Fatalf("no token: %d %+v", st, e)
	}
	if st := call(t, "POST", p.url+"/v1/sessions", "wrong", `{"message":"x"}`, &e); st != 401 {
		t.Fatalf("wrong token: %d", st)
	}
	s := start(t, p.url, "env-token-123", "authorized")
	if st := call(t, "GET", p.url+"/v1/sessions/"+s.SessionID, "env-token-123", "", nil); st != 200 {
		t.Fatalf("with the token: %d", st)
	}
	for _, open := range []string{"/healthz", "/metrics"} {
		if st := call(t, "GET", p.url+open, "", "", nil); st != 200 {
			t.Fatalf("%s without a token: %d", open, st)
		}
	}
	if strings.Contains(p.stderr.String(), "env-token-123") || strings.Contains(p.stderr.String(), "authorized") {
		t.Fatal("the request log holds the token or a message body")
	}
}

func TestServeRefusals(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: refusals\n")
	empty := t.TempDir()
	bad := writeProject(t, "name: bad\nmodle: echo\n")
	for _, c := range []struct {
		dir  string
		env  []string
		args []string
		want []string
	}{
		{dir, nil, []string{"serve", "--addr", "0.0.0.0:0"}, []string{"--auth-token", "--insecure", "0.0.0.0:0"}},
		{dir, nil, []string{"serve", "--addr", ":0"}, []string{"--auth-token", "every interface"}},
		{dir, []string{"AGENTKIT_ADDR=0.0.0.0:0"}, []string{"serve"}, []string{"--insecure"}},
		{dir, nil, []string{"dev", "--addr", "0.0.0.0:0", "--auth-token", "t"}, []string{"loopback only"}},
		{dir, nil, []string{"serve", "--addr", "localhost"}, []string{"HOST:PORT"}},
		{dir, nil, []string{"serve", "--addr", "127.0.0.1:0", "--serving", "ledger"}, []string{"ledger", "shared store", "--storage"}},
		{dir, nil, []string{"serve", "--addr", "127.0.0.1:0", "--serving", "cluster"}, []string{"--serving", "local or ledger"}},
		{dir, nil, []string{"serve", "--addr", "127.0.0.1:0", "--storage", "bogus://x"}, []string{"--storage", "bogus"}},
		{dir, nil, []string{"serve", "--max-body-bytes", "lots"}, []string{"max-body-bytes", "4MiB"}},
		{dir, nil, []string{"serve", "--log-format", "xml"}, []string{"--log-format", "json or text"}},
		{dir, nil, []string{"serve", "extra-arg"}, []string{"no arguments", "--dir"}},
		{empty, nil, []string{"serve", "--addr", "127.0.0.1:0"}, []string{"agentkit.yaml", "agentkit init"}},
		{bad, nil, []string{"serve", "--addr", "127.0.0.1:0"}, []string{"agentkit.yaml:2", "modle", "model"}},
		{empty, nil, []string{"run"}, []string{"MESSAGE"}},
		{empty, nil, []string{"run", "--continue", "tok", "hi"}, []string{"--state-root"}},
		{empty, nil, []string{"init", "--name", "no spaces please"}, []string{"--name"}},
	} {
		r := run(t, c.dir, c.env, "", c.args...)
		lines := strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") + 1
		if r.code != 2 || lines != 1 {
			t.Errorf("agentkit %v: exit %d, stderr %q; want exit 2 and one line", c.args, r.code, r.stderr)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("agentkit %v: stderr %q does not mention %q", c.args, r.stderr, w)
			}
		}
	}
	// --insecure serves a non-loopback address without a token (on every
	// interface, with the hosts clients use listed:
	// TestServeOnEveryInterfaceNeedsAllowedHostsOrAToken).
	p := startServe(t, dir, nil, "serve", "--addr", "0.0.0.0:0", "--insecure", "--allowed-hosts", "agent.lan", "--state-root", t.TempDir())
	if p.stop(syscall.SIGTERM) != 0 {
		t.Fatal("serve --insecure did not exit cleanly")
	}
}

// TestInitGoBuildsAndServes scaffolds a Go project, builds it with go
// build and serves it: its Go tool runs in the turn.
func TestInitGoBuildsAndServes(t *testing.T) {
	t.Parallel()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "goagent")
	if r := run(t, repo, nil, "", "init", "--go", dir); r.code != 0 {
		t.Fatalf("init --go: exit %d, stderr %q", r.code, r.stderr)
	}
	gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	if !strings.Contains(string(gomod), "replace agentkit => "+repo) {
		t.Fatalf("go.mod does not replace agentkit with %s:\n%s", repo, gomod)
	}
	bin := filepath.Join(dir, "goagent")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(cleanEnv(), "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in the init --go project: %v\n%s", err, out)
	}
	p := startServing(t, bin, dir, nil, "-addr", "127.0.0.1:0", "-state-root", t.TempDir())
	s := start(t, p.url, "", "count these three")
	if s.Turn.Result != "echo: count these three (word_count: 3)" {
		t.Fatalf("the Go agent answered %q", s.Turn.Result)
	}
	var got struct {
		Events []struct{ Type, Tool, Output string }
	}
	call(t, "GET", p.url+"/v1/sessions/"+s.SessionID, "", "", &got)
	found := false
	for _, ev := range got.Events {
		if ev.Type == "tool.result" && ev.Tool == "word_count" && ev.Output == "3" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no word_count result among the events: %+v", got.Events)
	}
	var info struct{ Agent string }
	call(t, "GET", p.url+"/v1/info", "", "", &info)
	if info.Agent != "goagent" {
		t.Fatalf("the Go agent is named %q", info.Agent)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("the Go agent exited %d after SIGTERM", code)
	}
}

// TestDevServesOnLoopback checks dev's defaults: text logs.
func TestDevServesOnLoopback(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: devagent\n")
	p := startServe(t, dir, nil, "dev", "--addr", "127.0.0.1:0")
	start(t, p.url, "", "hi")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), "msg=\"http request\"") {
		if time.Now().After(deadline) {
			t.Fatalf("dev logged no text request line: %q", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p.stop(syscall.SIGINT) != 0 {
		t.Fatal("dev did not exit cleanly")
	}
	if resp, err := http.Get(p.url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("dev still answers after SIGINT")
	}
}
