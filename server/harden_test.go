package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/agent/stateroot"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/server"
	"agentkit/tool"
)

func echoModel(t *testing.T) model.Model {
	t.Helper()
	m, err := model.NewEcho(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEveryV1RouteNeedsTheToken sends a request without a token to every
// /v1/ route of the server's own route table, so a route added later
// without auth is caught.
func TestEveryV1RouteNeedsTheToken(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: "a-long-enough-token"}})
	f.token = ""
	routes := f.srv.Routes()
	wildcard := regexp.MustCompile(`\{[^}]*\}`)
	checked := 0
	for _, pattern := range routes {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok {
			method, path = "GET", pattern
		}
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		path = wildcard.ReplaceAllString(path, "x")
		for _, accept := range []string{"application/json", "text/event-stream"} {
			resp := f.send(method, path, `{}`, http.Header{"Accept": {accept}})
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s (%s %s, Accept %s) without a token: status %d; want 401 with WWW-Authenticate", pattern, method, path, accept, resp.StatusCode)
			}
		}
		checked++
	}
	// The table holds the session routes at least: a table that lost them
	// would make this test pass on nothing.
	if checked < 9 {
		t.Fatalf("only %d /v1/ routes in the route table %v", checked, routes)
	}
}

// TestRouteTableIsDocumented checks that docs/http-api.md names every route.
func TestRouteTableIsDocumented(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	doc, err := os.ReadFile("../docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, pattern := range f.srv.Routes() {
		// The docs write the exact-match root "GET /{$}" as "GET /".
		if !strings.Contains(string(doc), "`"+strings.TrimSuffix(pattern, "{$}")+"`") {
			t.Errorf("docs/http-api.md does not list the route `%s`", pattern)
		}
	}
}

// TestGetOnAPostRouteIs405 checks that a POST-only path answers other
// methods with 405 and Allow, even where a wildcard route of that method
// would take the path as an id.
func TestGetOnAPostRouteIs405(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, method := range []string{"GET", "DELETE", "PUT", "PATCH"} {
		resp := f.send(method, "/v1/sessions/continue", "", nil)
		var e apiError
		decodeJSON(t, resp, &e)
		if resp.StatusCode != http.StatusMethodNotAllowed || e.Error.Code != server.CodeMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
			t.Errorf("%s /v1/sessions/continue: status %d, code %q, Allow %q; want 405 method_not_allowed with Allow: POST", method, resp.StatusCode, e.Error.Code, resp.Header.Get("Allow"))
		}
	}
	resp := f.send("HEAD", "/v1/sessions/continue", "", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("HEAD /v1/sessions/continue: status %d, want 405", resp.StatusCode)
	}
	// A real id still reaches the GET route.
	f.wantError("GET", "/v1/sessions/continue-not", "", 404, server.CodeSessionNotFound)
}

// TestLimitMustBeOneToAThousand checks ?limit=0 and its neighbours.
func TestLimitMustBeOneToAThousand(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	for _, path := range []string{"/v1/sessions", "/v1/sessions/" + s.SessionID, "/v1/sessions/" + s.SessionID + "/events"} {
		f.wantError("GET", path+"?limit=0", "", 400, server.CodeInvalid, "limit", "1 to 1000")
		f.wantError("GET", path+"?limit=1001", "", 400, server.CodeInvalid, "limit")
		for _, ok := range []string{"?limit=1", "?limit=1000", ""} {
			if st := f.do("GET", path+ok, "", nil); st != 200 {
				t.Errorf("GET %s%s: status %d", path, ok, st)
			}
		}
	}
}

// TestLastEventIDWinsOverAfter: an EventSource that reconnects keeps the
// URL it was given (with ?after=) and adds Last-Event-ID; the header must
// win, or the stream replays events the client has.
func TestLastEventIDWinsOverAfter(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	f.do("POST", "/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"again"}`, s.ContinuationToken), nil)
	resp := f.send("GET", "/v1/sessions/"+s.SessionID+"/events?after=1", "", http.Header{"Accept": {"text/event-stream"}, "Last-Event-Id": {"4"}})
	defer resp.Body.Close()
	ch := make(chan sseEvent, 64)
	go readEvents(resp.Body, ch)
	if ev := next(t, ch); ev.id != "5" {
		t.Fatalf("with ?after=1 and Last-Event-ID 4 the stream starts at id %q; want 5", ev.id)
	}
	// Without the header, ?after= is the cursor.
	resp2 := f.send("GET", "/v1/sessions/"+s.SessionID+"/events?after=2", "", http.Header{"Accept": {"text/event-stream"}})
	defer resp2.Body.Close()
	ch2 := make(chan sseEvent, 64)
	go readEvents(resp2.Body, ch2)
	if ev := next(t, ch2); ev.id != "3" {
		t.Fatalf("with ?after=2 the stream starts at id %q; want 3", ev.id)
	}
}

// TestStrictJSONBodies checks what encoding/json lets through by default:
// a field given twice, a field name in another case, a key given twice
// inside workspaceFiles, and text that is not UTF-8.
func TestStrictJSONBodies(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct {
		body string
		msgs []string
	}{
		{`{"message":"a","message":"b"}`, []string{"message", "twice"}},
		{`{"Message":"hi"}`, []string{"Message", "case", `"message"`}},
		{`{"MESSAGE":"hi"}`, []string{"MESSAGE", `"message"`}},
		{`{"message":"hi","workspaceFiles":{"a.txt":"1","a.txt":"2"}}`, []string{"workspaceFiles", "a.txt", "twice"}},
		{"{\"message\":\"caf\xe9\"}", []string{"UTF-8"}},
		{`{"message":"lone \ud800 surrogate"}`, []string{"surrogate"}},
		{`{"message":"swapped \udc00\ud800 pair"}`, []string{"surrogate"}},
		{"{\"message\":\"hi\",\"workspaceFiles\":{\"a\xff.txt\":\"x\"}}", []string{"UTF-8"}},
	} {
		f.wantError("POST", "/v1/sessions", c.body, 400, server.CodeInvalid, c.msgs...)
	}
	// Valid text, escapes and surrogate pairs pass.
	var r agent.TurnResult
	if st := f.do("POST", "/v1/sessions", `{"message":"caf\u00e9 \ud83d\ude00 \\ud800 ok"}`, &r); st != 201 || r.Turn.Result != `echo: café 😀 \ud800 ok` {
		t.Fatalf("a valid body with escapes: status %d, %+v", st, r)
	}
	// The continue and reminder routes use the same decoder.
	f.wantError("POST", "/v1/sessions/continue", `{"continuationToken":"x","ContinuationToken":"y","message":"m"}`, 400, server.CodeInvalid, "ContinuationToken")
	f.wantError("POST", "/v1/reminders", `{"sessionId":"x","sessionId":"y","message":"m","delaySeconds":1}`, 400, server.CodeInvalid, "sessionId", "twice")
}

// TestWorkspaceFileThroughASymlinkIs400 plants a symlink out of a
// session's workspace; writing a workspace file through it is the
// documented 400, not a 500.
func TestWorkspaceFileThroughASymlinkIs400(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	ws := filepath.Join(f.rt.StateRoot(), stateroot.WorkspaceDir, s.SessionID)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"x","workspaceFiles":{"out/escape.txt":"x"}}`, s.ContinuationToken)
	f.wantError("POST", "/v1/sessions/continue", body, 400, server.CodeInvalid, "workspaceFiles", "out/escape.txt")
	if _, err := os.Stat(filepath.Join(outside, "escape.txt")); err == nil {
		t.Fatal("the file was written outside the workspace")
	}
}

// TestServeRefusesAnOpenPublicAddressBeforeListening calls the library
// entry point with a non-loopback address and no token: it must refuse
// before binding the port and before touching the state root.
func TestServeRefusesAnOpenPublicAddressBeforeListening(t *testing.T) {
	// Hold the port: a Serve that listened first would fail with "address
	// already in use" instead of ErrInsecure.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	root := filepath.Join(t.TempDir(), "state")
	listened := false
	for _, c := range []struct {
		token string
		want  error
	}{
		{"", server.ErrInsecure},
		{"short-token", server.ErrWeakToken},
	} {
		err = server.Serve(context.Background(), agent.Config{Agent: agent.Agent{Name: "open", Model: echoModel(t)}, StateRoot: root, Store: memkv.New()}, server.Config{
			Addr:     ln.Addr().String(),
			Options:  server.Options{Logger: discardLogger(), AuthToken: c.token},
			OnListen: func(net.Addr) { listened = true },
		})
		if !errors.Is(err, c.want) {
			t.Fatalf("Serve on %s with token %q: %v; want %v", ln.Addr(), c.token, err, c.want)
		}
	}
	if listened {
		t.Fatal("Serve called OnListen")
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Serve touched the state root before refusing: %v", err)
	}
}

func TestCheckAddrTokenLength(t *testing.T) {
	long := strings.Repeat("k", server.MinAuthTokenLen)
	for _, c := range []struct {
		addr, token string
		insecure    bool
		want        error
	}{
		{"0.0.0.0:8080", long[1:], false, server.ErrWeakToken},
		{"0.0.0.0:8080", "t", false, server.ErrWeakToken},
		{"192.0.2.1:8080", long, false, nil},
		{"127.0.0.1:8080", "t", false, nil}, // loopback: any token
		{"0.0.0.0:8080", "t", true, nil},    // --insecure: the operator's call
	} {
		err := server.CheckAddr(c.addr, c.token, c.insecure)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("CheckAddr(%q, %d-byte token, %v) = %v; want %v", c.addr, len(c.token), c.insecure, err, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprint(server.MinAuthTokenLen)) {
			t.Errorf("the refusal %q does not say the minimum length", err)
		}
	}
}

// faultyStore fails reads of one session's records (its metadata, event
// batches and anything else under its key prefix) while the continuation
// record and everything else pass: the token resolves, the session does
// not load.
func faultyStore(t *testing.T, fail *atomic.Pointer[string]) *kv.DB {
	mem := memkv.New()
	broken := func(key string) error {
		if p := fail.Load(); p != nil && strings.HasPrefix(key, *p) {
			return errors.New("connection reset by peer (injected)")
		}
		return nil
	}
	f := kv.Funcs{
		Put: mem.Put,
		Get: func(ctx context.Context, key string) ([]byte, error) {
			if err := broken(key); err != nil {
				return nil, err
			}
			return mem.Get(ctx, key)
		},
		Delete: mem.Delete,
		List: func(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
			if err := broken(prefix); err != nil {
				return func(yield func(kv.Entry, error) bool) { yield(kv.Entry{}, err) }
			}
			return mem.List(ctx, prefix)
		},
	}
	db, err := kv.New("faulty", f)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestTokenFoundButSessionUnreadableIs503: the continuation record is in
// the store but reading the session it names fails. That is a store
// outage (503, retry), never "unknown token" (404, which tells the client
// its session is gone).
func TestTokenFoundButSessionUnreadableIs503(t *testing.T) {
	var fail atomic.Pointer[string]
	store := faultyStore(t, &fail)
	a := newFixture(t, fixtureOpts{store: store})
	var s agent.TurnResult
	a.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	scope, err := keys.Agent("test")
	if err != nil {
		t.Fatal(err)
	}
	sessionPrefix, _ := scope.SessionPrefix(s.SessionID)
	eventsPrefix, _ := scope.EventsPrefix(s.SessionID)
	tokenKey, _ := scope.Continuation(s.ContinuationToken)
	if strings.HasPrefix(tokenKey, sessionPrefix) {
		t.Fatalf("the continuation key %q is under the session's prefix %q: the fault would hide it", tokenKey, sessionPrefix)
	}
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"again"}`, s.ContinuationToken)
	for _, prefix := range []string{sessionPrefix, eventsPrefix} {
		// A host that has never seen the session: the token is not on
		// its disk, so it resolves it through the store.
		b := newFixture(t, fixtureOpts{store: store, policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}})
		fail.Store(&prefix)
		b.wantError("POST", "/v1/sessions/continue", body, 503, server.CodeStoreUnavailable)
		fail.Store(nil)
		var r agent.TurnResult
		if st := b.do("POST", "/v1/sessions/continue", body, &r); st != 200 || r.SessionID != s.SessionID {
			t.Fatalf("after the fault (%s): status %d, %+v", prefix, st, r)
		}
	}
}

func decodeJSON(t *testing.T, resp *http.Response, out any) {
	t.Helper()
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if len(data) > 0 && out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("the answer %q is not JSON: %v", data, err)
		}
	}
}

// stuckTool ignores its context and blocks until the test releases it.
func stuckTool(entered chan<- struct{}, release <-chan struct{}) tool.Tool {
	return tool.Tool{
		Spec: model.ToolSpec{Name: "stuck", Description: "never returns", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(context.Context, *tool.Env, json.RawMessage) (string, error) {
			entered <- struct{}{}
			<-release
			return "released", nil
		},
	}
}

// TestServeExitsWhateverATurnDoes runs a turn whose tool ignores
// cancellation, with a tool timeout far away, and ends Serve's context:
// after the shutdown timeout the turn is canceled, recorded as failed, and
// Serve returns with the state root released, so a new process can serve
// the session.
func TestServeExitsWhateverATurnDoes(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	m, err := model.NewEcho(&model.EchoConfig{Script: []model.EchoStep{{Tool: "stuck"}, {Text: "unreachable"}}})
	if err != nil {
		t.Fatal(err)
	}
	a := agent.Agent{Name: "wedged", Model: m, Tools: []tool.Tool{stuckTool(entered, release)}}
	root := t.TempDir()
	store := memkv.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		served <- server.Serve(ctx, agent.Config{Agent: a, StateRoot: root, Store: store, Timeouts: agent.Timeouts{Tool: time.Hour}}, server.Config{
			Addr:            "127.0.0.1:0",
			Options:         server.Options{Logger: discardLogger()},
			ShutdownTimeout: 200 * time.Millisecond,
			OnListen:        func(a net.Addr) { addr <- a.String() },
		})
	}()
	base := "http://" + <-addr
	go func() {
		resp, err := http.Post(base+"/v1/sessions", "application/json", strings.NewReader(`{"message":"hang"}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return within 30s of its context ending, with a turn stuck in a tool")
	}
	// The state root is free, and the session's turn ended failed.
	rt, err := agent.Open(context.Background(), agent.Config{Agent: a, StateRoot: root, Store: store, Logger: discardLogger()})
	if err != nil {
		t.Fatalf("reopening the state root after Serve returned: %v", err)
	}
	defer rt.Close()
	page, err := rt.ListSessions(context.Background(), 0, "")
	if err != nil || len(page.Sessions) != 1 {
		t.Fatalf("sessions after the shutdown: %+v, %v", page, err)
	}
	evs, err := rt.LastEvents(context.Background(), page.Sessions[0].ID, 1)
	if err != nil || len(evs) != 1 || evs[0].Type != agent.EventTurnFinished || evs[0].Status != agent.StatusFailed || !strings.Contains(evs[0].Result, "shutting down") {
		t.Fatalf("the last event %+v, %v; want turn.finished failed, saying the server was shutting down", evs, err)
	}
}

// TestServeReturnsWhenACanceledTurnStillHangs wedges a turn where
// cancellation cannot reach it (an AfterTurn hook that never returns):
// Serve gives up on it after CancelGrace and returns ErrShutdownIncomplete,
// so the program can exit (and the kernel drop the state root's lock).
func TestServeReturnsWhenACanceledTurnStillHangs(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	a := agent.Agent{Name: "hooked", Model: echoModel(t), Hooks: agent.Hooks{AfterTurn: func(context.Context, agent.TurnInfo) error {
		entered <- struct{}{}
		<-release
		return nil
	}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The turn goes on after Serve returns; the state root is removed only
	// once it has finished (its TurnFinished is its last step).
	root := t.TempDir()
	finished := &turnDone{done: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-finished.done:
		case <-time.After(30 * time.Second):
			t.Error("the hanging turn did not finish within 30s of its release")
		}
	})
	addr := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		served <- server.Serve(ctx, agent.Config{Agent: a, StateRoot: root, Store: memkv.New(), Observer: finished}, server.Config{
			Addr:            "127.0.0.1:0",
			Options:         server.Options{Logger: discardLogger()},
			ShutdownTimeout: 100 * time.Millisecond,
			CancelGrace:     100 * time.Millisecond,
			OnListen:        func(a net.Addr) { addr <- a.String() },
		})
	}()
	base := "http://" + <-addr
	go func() {
		resp, err := http.Post(base+"/v1/sessions", "application/json", strings.NewReader(`{"message":"hang"}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	cancel()
	select {
	case err := <-served:
		if !errors.Is(err, server.ErrShutdownIncomplete) {
			t.Fatalf("Serve: %v; want ErrShutdownIncomplete", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return within 30s with a turn that ignores cancellation")
	}
}

// TestNoHostPathsReachClients: the first turn's note and /v1/info name the
// memory journal by its path in the workspace, and no answer names the
// host's state root.
func TestNoHostPathsReachClients(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	root := f.rt.StateRoot()
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	for _, path := range []string{"/v1/info", "/v1/sessions/" + s.SessionID, "/v1/sessions", "/v1/sessions/" + s.SessionID + "/events"} {
		resp := f.send("GET", path, "", nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), root) || strings.Contains(string(body), "stateRoot") {
			t.Errorf("GET %s names the state root: %s", path, body)
		}
	}
	var info struct{ JournalPath string }
	f.do("GET", "/v1/info", "", &info)
	if info.JournalPath != "memory/journal.jsonl" {
		t.Errorf("info.journalPath %q; want memory/journal.jsonl", info.JournalPath)
	}
	var page agent.EventPage
	f.do("GET", "/v1/sessions/"+s.SessionID+"/events", "", &page)
	if note := page.Events[0].Note; !strings.Contains(note, "memory/journal.jsonl") {
		t.Errorf("the first turn's note %q does not name memory/journal.jsonl", note)
	}
}

// TestDeadLetterRoutesNeedServingModeLedger checks that in serving mode
// local the dead-letter routes answer 404 not_ledger_mode saying why.
func TestDeadLetterRoutesNeedServingModeLedger(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/deadletters"},
		{"POST", "/v1/deadletters/s/e/replay"},
		{"DELETE", "/v1/deadletters/s/e"},
	} {
		f.wantError(c.method, c.path, "", 404, server.CodeNotLedger, "serving mode ledger", "mode local")
	}
	var info map[string]any
	f.do("GET", "/v1/info", "", &info)
	if _, ok := info["ledger"]; ok || info["serving"] != "local" {
		t.Errorf("/v1/info in serving mode local: %v; want serving local and no ledger object", info)
	}
}

// turnDone closes done when a turn finishes.
type turnDone struct {
	agent.NopObserver
	once sync.Once
	done chan struct{}
}

func (o *turnDone) TurnFinished(agent.TurnStatus, time.Duration) { o.once.Do(func() { close(o.done) }) }

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// slowModel tells entered when it is asked, then answers after delay
// (or when its context ends).
type slowModel struct {
	entered chan struct{}
	delay   time.Duration
}

func (m *slowModel) Name() string { return "slow" }

func (m *slowModel) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	select {
	case m.entered <- struct{}{}:
	default:
	}
	select {
	case <-time.After(m.delay):
	case <-ctx.Done():
		return model.Response{}, ctx.Err()
	}
	return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "done"}}, nil
}

// TestAShutdownShorterThanATurnLogsWhatTheClientGot: a turn outlasts the
// shutdown timeout, so its connection is closed before its answer is sent.
// The client gets no answer, and the request's log record says so (status
// 0, with the answer it was due) instead of claiming a 201. The turn's
// outcome is readable afterwards by its Idempotency-Key, on the next
// server over the same state root.
func TestAShutdownShorterThanATurnLogsWhatTheClientGot(t *testing.T) {
	root := t.TempDir()
	serve := func(m model.Model, logs *lockedBuffer, timeout time.Duration) (string, context.CancelFunc, <-chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		addr := make(chan string, 1)
		served := make(chan error, 1)
		go func() {
			served <- server.Serve(ctx, agent.Config{Agent: agent.Agent{Name: "slow", Model: m}, StateRoot: root}, server.Config{
				Addr:            "127.0.0.1:0",
				Options:         server.Options{Logger: slog.New(slog.NewJSONHandler(logs, nil))},
				ShutdownTimeout: timeout,
				CancelGrace:     5 * time.Second,
				OnListen:        func(a net.Addr) { addr <- a.String() },
			})
		}()
		return "http://" + <-addr, cancel, served
	}
	slow := &slowModel{entered: make(chan struct{}, 1), delay: time.Minute}
	logs := &lockedBuffer{}
	base, cancel, served := serve(slow, logs, 100*time.Millisecond)
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", base+"/v1/sessions", strings.NewReader(`{"message":"slow"}`))
		req.Header.Set("Idempotency-Key", "slow-key")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				err = fmt.Errorf("the client got an answer: %d", resp.StatusCode)
			}
		}
		answered <- err
	}()
	<-slow.entered // the turn runs
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if err := <-answered; err == nil || strings.Contains(err.Error(), "got an answer") {
		t.Fatalf("the client: %v; want no answer (the connection closed)", err)
	}
	var record map[string]any
	for line := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(line, `"route":"POST /v1/sessions"`) {
			json.Unmarshal([]byte(line), &record)
		}
	}
	if record == nil || record["status"] != float64(0) || record["answer"] != float64(201) {
		t.Fatalf("the request's log record %v; want status 0 and the answer 201 it was due (the client got none)", record)
	}
	// The outcome, by the key, on the next server.
	base, cancel, served = serve(echoModel(t), &lockedBuffer{}, time.Second)
	defer func() { cancel(); <-served }()
	req, _ := http.NewRequest("POST", base+"/v1/sessions", strings.NewReader(`{"message":"slow"}`))
	req.Header.Set("Idempotency-Key", "slow-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res agent.TurnResult
	json.NewDecoder(resp.Body).Decode(&res)
	if resp.StatusCode != 201 || resp.Header.Get("Idempotent-Replayed") != "true" || res.Turn.Status != agent.StatusFailed || !strings.Contains(res.Turn.Result, "shut") {
		t.Fatalf("the key after the restart: %d %+v; want the first turn's outcome (failed: the server shut down), replayed", resp.StatusCode, res)
	}
}
