package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/server"
	"agentkit/tool"
)

// fixture is a server over a real runtime (memory store) in this process.
type fixture struct {
	t       *testing.T
	url     string
	rt      *agent.Runtime
	srv     *server.Server
	metrics *server.Metrics
	token   string
	close   func() // stops the server and closes the runtime; safe to call twice
}

type fixtureOpts struct {
	server.Options
	agent  agent.Agent
	store  any
	policy agent.Policy
	root   string // the state root; empty: a new temporary one
	// serving and ledger set the serving mode and the ledger's options.
	serving string
	ledger  agent.LedgerOptions
}

func newFixture(t *testing.T, o fixtureOpts) *fixture {
	t.Helper()
	if o.agent.Name == "" {
		o.agent.Name = "test"
	}
	if o.agent.Model == nil {
		echo, err := model.NewEcho(nil)
		if err != nil {
			t.Fatal(err)
		}
		o.agent.Model = echo
	}
	if o.store == nil {
		o.store = memkv.New()
	}
	if o.root == "" {
		o.root = t.TempDir()
	}
	m := server.NewMetrics()
	rt, err := agent.Open(context.Background(), agent.Config{
		Agent:     o.agent,
		StateRoot: o.root,
		Store:     o.store,
		Observer:  m,
		Logger:    discardLogger(),
		Policy:    o.policy,
		Serving:   o.serving,
		Ledger:    o.ledger,
	})
	if err != nil {
		t.Fatal(err)
	}
	o.Options.Metrics = m
	if o.Options.Logger == nil {
		o.Options.Logger = discardLogger()
	}
	srv, err := server.New(rt, o.Options)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	f := &fixture{t: t, url: hs.URL, rt: rt, srv: srv, metrics: m, token: o.AuthToken}
	f.close = func() {
		srv.Drain()
		hs.Close()
		rt.Close()
	}
	t.Cleanup(f.close)
	return f
}

// do sends a request and decodes a JSON answer into out (when not nil). It
// returns the status.
func (f *fixture) do(method, path, body string, out any) int {
	f.t.Helper()
	resp := f.send(method, path, body, nil)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("%s %s: answer %q is not JSON: %v", method, path, data, err)
		}
	}
	return resp.StatusCode
}

// metricsText returns the text of GET /metrics.
func (f *fixture) metricsText() string {
	f.t.Helper()
	resp := f.send("GET", "/metrics", "", nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (f *fixture) send(method, path, body string, hdr http.Header) *http.Response {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if f.token != "" {
		req.Header.Set("Authorization", "Bearer "+f.token)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// wantError checks an error answer's status, code and that its message
// contains each of msgs.
func (f *fixture) wantError(method, path, body string, status int, code string, msgs ...string) {
	f.t.Helper()
	var e apiError
	got := f.do(method, path, body, &e)
	if got != status || e.Error.Code != code {
		f.t.Fatalf("%s %s %s: status %d code %q (%q); want %d %q", method, path, body, got, e.Error.Code, e.Error.Message, status, code)
	}
	for _, m := range msgs {
		if !strings.Contains(e.Error.Message, m) {
			f.t.Fatalf("%s %s: message %q does not contain %q", method, path, e.Error.Message, m)
		}
	}
}

func TestSessionLifecycle(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var first agent.TurnResult
	if st := f.do("POST", "/v1/sessions", `{"message":"hello","title":"greeting","workspaceFiles":{"notes/a.txt":"x"}}`, &first); st != http.StatusCreated {
		t.Fatalf("start: status %d", st)
	}
	if first.SessionID == "" || len(first.ContinuationToken) < 22 || first.Turn.Status != agent.StatusCompleted || first.Turn.Result != "echo: hello" {
		t.Fatalf("start answered %+v", first)
	}
	if first.Turn.Usage.InputTokens == 0 {
		t.Fatalf("start: no usage in %+v", first.Turn)
	}
	var second agent.TurnResult
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"and again"}`, first.ContinuationToken)
	if st := f.do("POST", "/v1/sessions/continue", body, &second); st != http.StatusOK {
		t.Fatalf("continue: status %d", st)
	}
	if second.SessionID != first.SessionID || second.ContinuationToken != first.ContinuationToken || second.Turn.Result != "echo: and again" {
		t.Fatalf("continue answered %+v, want the same session and token", second)
	}

	var got struct {
		Session agent.Session `json:"session"`
		Events  []agent.Event `json:"events"`
		Next    int64         `json:"next"`
		More    bool          `json:"more"`
	}
	if st := f.do("GET", "/v1/sessions/"+first.SessionID, "", &got); st != http.StatusOK {
		t.Fatalf("get: status %d", st)
	}
	if got.Session.ID != first.SessionID || got.Session.Title != "greeting" || got.Session.ChannelID != "http" || got.Session.Turns != 2 {
		t.Fatalf("get: session %+v", got.Session)
	}
	if len(got.Events) != int(got.Session.LastSeq) || got.More || got.Events[0].Type != agent.EventTurnStarted || got.Events[0].Message != "hello" {
		t.Fatalf("get: %d events (lastSeq %d, more %v), first %+v", len(got.Events), got.Session.LastSeq, got.More, got.Events[0])
	}
	// Paging the events: two at a time, after a cursor.
	var page agent.EventPage
	f.do("GET", "/v1/sessions/"+first.SessionID+"/events?after=1&limit=2", "", &page)
	if len(page.Events) != 2 || page.Events[0].Seq != 2 || page.Next != 3 || !page.More {
		t.Fatalf("events after 1, limit 2: %+v", page)
	}
	f.do("GET", fmt.Sprintf("/v1/sessions/%s/events?after=%d", first.SessionID, got.Session.LastSeq), "", &page)
	if len(page.Events) != 0 || page.More || page.Next != got.Session.LastSeq {
		t.Fatalf("events after the last: %+v", page)
	}

	if st := f.do("DELETE", "/v1/sessions/"+first.SessionID, "", nil); st != http.StatusNoContent {
		t.Fatalf("delete: status %d", st)
	}
	f.wantError("GET", "/v1/sessions/"+first.SessionID, "", 404, server.CodeSessionNotFound)
	f.wantError("POST", "/v1/sessions/continue", body, 404, server.CodeUnknownToken)
	f.wantError("DELETE", "/v1/sessions/"+first.SessionID, "", 404, server.CodeSessionNotFound)
}

func TestListSessionsNewestFirstWithCursor(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var ids []string
	for i := range 5 {
		var r agent.TurnResult
		f.do("POST", "/v1/sessions", fmt.Sprintf(`{"message":"m%d"}`, i), &r)
		ids = append(ids, r.SessionID)
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		var p agent.SessionPage
		path := "/v1/sessions?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		if st := f.do("GET", path, "", &p); st != 200 {
			t.Fatalf("list: status %d", st)
		}
		for _, s := range p.Sessions {
			seen = append(seen, s.ID)
		}
		if p.NextCursor == "" {
			break
		}
		if pages > 5 {
			t.Fatal("the listing does not end")
		}
		cursor = p.NextCursor
	}
	if len(seen) != 5 {
		t.Fatalf("listed %d sessions, want 5: %v", len(seen), seen)
	}
	for i := range seen {
		if seen[i] != ids[len(ids)-1-i] {
			t.Fatalf("listing order %v, want newest first %v", seen, ids)
		}
	}
	f.wantError("GET", "/v1/sessions?limit=abc", "", 400, server.CodeInvalid, "limit")
	f.wantError("GET", "/v1/sessions?limit=100000", "", 400, server.CodeInvalid, "limit")
	f.wantError("GET", "/v1/sessions?cursor=garbage", "", 400, server.CodeInvalid, "cursor")
}

func TestBadRequestsNameTheField(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{MaxBodyBytes: 256}})
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
		msgs               []string
	}{
		{"POST", "/v1/sessions", `{"message":"x","colour":"red"}`, 400, server.CodeInvalid, []string{"colour", "unknown field"}},
		{"POST", "/v1/sessions", `{"message":5}`, 400, server.CodeInvalid, []string{"message", "string"}},
		{"POST", "/v1/sessions", `{"message":""}`, 400, server.CodeInvalid, []string{"message"}},
		{"POST", "/v1/sessions", `{}`, 400, server.CodeInvalid, []string{"message"}},
		{"POST", "/v1/sessions", ``, 400, server.CodeInvalid, []string{"empty"}},
		{"POST", "/v1/sessions", `{"message":`, 400, server.CodeInvalid, []string{"JSON"}},
		{"POST", "/v1/sessions", `[1,2]`, 400, server.CodeInvalid, []string{"object"}},
		{"POST", "/v1/sessions", `{"message":"a"} {"message":"b"}`, 400, server.CodeInvalid, []string{"more than one"}},
		{"POST", "/v1/sessions", `{"message":"x","workspaceFiles":{"memory/journal.jsonl":"forged"}}`, 400, server.CodeReservedPath, []string{"memory/journal.jsonl"}},
		{"POST", "/v1/sessions", `{"message":"x","workspaceFiles":{"../escape":"x"}}`, 400, server.CodeInvalid, []string{"workspaceFiles"}},
		{"POST", "/v1/sessions", `{"message":"` + strings.Repeat("a", 300) + `"}`, 413, server.CodeTooLarge, []string{"256-byte"}},
		{"POST", "/v1/sessions/continue", `{"message":"x"}`, 400, server.CodeInvalid, []string{"continuationToken"}},
		{"POST", "/v1/sessions/continue", `{"continuationToken":"x","message":"y","title":"t"}`, 400, server.CodeInvalid, []string{"title", "unknown field"}},
		{"POST", "/v1/sessions/continue", `{"continuationToken":"no-such-token","message":"y"}`, 404, server.CodeUnknownToken, nil},
		{"GET", "/v1/sessions/no-such-session", ``, 404, server.CodeSessionNotFound, nil},
		{"GET", "/v1/sessions/no-such-session/events", ``, 404, server.CodeSessionNotFound, nil},
		{"GET", "/v1/sessions/x/events?after=-1", ``, 400, server.CodeInvalid, []string{"after"}},
		{"GET", "/v1/nothing-here", ``, 404, server.CodeNotFound, []string{"/v1/nothing-here"}},
		{"GET", "/elsewhere", ``, 404, server.CodeNotFound, nil},
		{"PUT", "/v1/sessions", ``, 405, server.CodeMethodNotAllowed, []string{"PUT", "POST"}},
		{"POST", "/v1/info", `{}`, 405, server.CodeMethodNotAllowed, []string{"GET"}},
		{"DELETE", "/v1/reminders/no-such-reminder", ``, 404, server.CodeReminderNotFound, nil},
	} {
		f.wantError(c.method, c.path, c.body, c.status, c.code, c.msgs...)
	}
	resp := f.send("PUT", "/v1/sessions", "", nil)
	resp.Body.Close()
	if allow := resp.Header.Get("Allow"); !strings.Contains(allow, "POST") || !strings.Contains(allow, "GET") {
		t.Fatalf("405 without an Allow header naming GET and POST: %q", allow)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("405 Content-Type %q, want application/json", ct)
	}
}

func TestReminders(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	var rem agent.Reminder
	body := fmt.Sprintf(`{"sessionId":%q,"delaySeconds":3600,"message":"check back"}`, s.SessionID)
	if st := f.do("POST", "/v1/reminders", body, &rem); st != http.StatusCreated {
		t.Fatalf("create reminder: status %d", st)
	}
	if rem.ID == "" || rem.SessionID != s.SessionID || rem.Message != "check back" || rem.State != "pending" {
		t.Fatalf("created %+v", rem)
	}
	if d := time.Until(rem.At); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("reminder at %v, want an hour from now", rem.At)
	}
	at := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	var rem2 agent.Reminder
	f.do("POST", "/v1/reminders", fmt.Sprintf(`{"sessionId":%q,"at":%q,"message":"later"}`, s.SessionID, at.Format(time.RFC3339)), &rem2)
	if !rem2.At.Equal(at) {
		t.Fatalf("reminder at %v, want %v", rem2.At, at)
	}
	var list struct{ Reminders []agent.Reminder }
	f.do("GET", "/v1/reminders?sessionId="+s.SessionID, "", &list)
	if len(list.Reminders) != 2 || list.Reminders[0].ID != rem.ID {
		t.Fatalf("listed %+v, want both, the sooner first", list.Reminders)
	}
	if st := f.do("DELETE", "/v1/reminders/"+rem.ID, "", nil); st != http.StatusNoContent {
		t.Fatalf("delete reminder: status %d", st)
	}
	f.do("GET", "/v1/reminders", "", &list)
	if len(list.Reminders) != 1 || list.Reminders[0].ID != rem2.ID {
		t.Fatalf("after delete: %+v", list.Reminders)
	}

	sid := s.SessionID
	for _, c := range []struct{ body, field string }{
		{fmt.Sprintf(`{"sessionId":%q,"message":"x"}`, sid), "at"},
		{fmt.Sprintf(`{"sessionId":%q,"message":"x","at":"tomorrow"}`, sid), "at"},
		{fmt.Sprintf(`{"sessionId":%q,"message":"x","at":%q,"delaySeconds":5}`, sid, at.Format(time.RFC3339)), "at"},
		{fmt.Sprintf(`{"sessionId":%q,"message":"x","delaySeconds":-5}`, sid), "delaySeconds"},
		{fmt.Sprintf(`{"sessionId":%q,"message":"x","delaySeconds":"soon"}`, sid), "delaySeconds"},
		{fmt.Sprintf(`{"sessionId":%q,"delaySeconds":5}`, sid), "message"},
		{`{"message":"x","delaySeconds":5}`, "sessionId"},
		{fmt.Sprintf(`{"sessionId":%q,"message":"x","delaySeconds":5,"repeat":true}`, sid), "repeat"},
	} {
		f.wantError("POST", "/v1/reminders", c.body, 400, server.CodeInvalid, c.field)
	}
	f.wantError("POST", "/v1/reminders", `{"sessionId":"nope","message":"x","delaySeconds":5}`, 404, server.CodeSessionNotFound)
}

func TestReminderFiresATurn(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	events, cancel := f.rt.Subscribe(s.SessionID)
	defer cancel()
	if st := f.do("POST", "/v1/reminders", fmt.Sprintf(`{"sessionId":%q,"delaySeconds":0,"message":"wake up"}`, s.SessionID), nil); st != 201 {
		t.Fatalf("create: status %d", st)
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.Type == agent.EventTurnFinished {
				if ev.Result != "echo: wake up" {
					t.Fatalf("the reminder's turn answered %q", ev.Result)
				}
				return
			}
		case <-timeout:
			t.Fatal("the reminder did not fire within 30s")
		}
	}
}

func TestAuth(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: "s3cret-token"}})
	f.token = ""
	f.wantError("GET", "/v1/sessions", "", 401, server.CodeUnauthorized, "Authorization: Bearer")
	f.wantError("GET", "/v1/no-such-route", "", 401, server.CodeUnauthorized)
	for _, h := range []string{"Bearer wrong", "Bearer s3cret-tokenX", "Basic s3cret-token", "s3cret-token", "Bearer "} {
		resp := f.send("GET", "/v1/info", "", http.Header{"Authorization": {h}})
		resp.Body.Close()
		if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("Authorization %q: status %d, WWW-Authenticate %q; want 401 with the header", h, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	for _, h := range []string{"Bearer s3cret-token", "bearer s3cret-token"} {
		resp := f.send("GET", "/v1/info", "", http.Header{"Authorization": {h}})
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("Authorization %q: status %d, want 200", h, resp.StatusCode)
		}
	}
	for _, open := range []string{"/healthz", "/metrics"} {
		if st := f.do("GET", open, "", nil); st != 200 {
			t.Fatalf("GET %s without a token: status %d, want 200 (it stays open)", open, st)
		}
	}
	if _, err := server.New(f.rt, server.Options{AuthToken: "has space"}); err == nil {
		t.Fatal("New accepted a token with white space")
	}
}

func TestInfoHealthAndMetrics(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{Version: "v9.8.7"}})
	var info map[string]any
	f.do("GET", "/v1/info", "", &info)
	if info["agent"] != "test" || info["version"] != "v9.8.7" || info["serving"] != "local" || info["memory"] != true {
		t.Fatalf("info %v", info)
	}
	st, _ := info["storage"].(map[string]any)
	restore, _ := st["restore"].(map[string]any)
	if st["name"] != "mem" || st["get"] != true || st["list"] != true || restore["maxSessions"] != float64(1000) {
		t.Fatalf("info.storage %v", st)
	}
	if jp, _ := info["journalPath"].(string); !strings.HasSuffix(jp, "journal.jsonl") {
		t.Fatalf("info.journalPath %q", jp)
	}
	var health map[string]string
	if f.do("GET", "/healthz", "", &health); health["status"] != "ok" {
		t.Fatalf("healthz %v", health)
	}

	f.do("POST", "/v1/sessions", `{"message":"count me"}`, nil)
	f.do("GET", "/v1/sessions/none", "", nil)
	text := f.metricsText()
	for _, want := range []string{
		`agentkit_turns_total{status="completed"} 1`,
		`agentkit_turns_total{status="failed"} 0`,
		`agentkit_turn_duration_seconds_count{status="completed"} 1`,
		`agentkit_mirror_writes_dropped_total 0`,
		`agentkit_mirror_write_failures_total 0`,
		// A turn's commit to a store with the batch capability (the
		// memory driver's) is one atomic batch.
		`agentkit_store_operation_duration_seconds_count{op="write_batch"}`,
		`agentkit_store_operations_total{op="write_batch",result="ok"}`,
		`agentkit_http_requests_total{code="201",route="POST /v1/sessions"} 1`,
		`agentkit_http_requests_total{code="404",route="GET /v1/sessions/{id}"} 1`,
		`agentkit_build_info{version="v9.8.7"} 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	f.srv.Drain()
	if f.do("GET", "/healthz", "", &health); health["status"] != "draining" {
		t.Fatalf("healthz while draining: %v", health)
	}
}

// failingGet is a store whose Get fails once told to, with everything else
// passing to a memory store: the fault a store outage causes.
func failingGet(fail *atomic.Bool) *kv.DB {
	mem := memkv.New()
	f := kv.Funcs{
		Put: mem.Put,
		Get: func(ctx context.Context, key string) ([]byte, error) {
			if fail.Load() {
				return nil, errors.New("connection refused (injected)")
			}
			return mem.Get(ctx, key)
		},
		Delete: mem.Delete,
		List:   mem.List,
	}
	db, err := kv.New("flaky", f)
	if err != nil {
		panic(err)
	}
	return db
}

func TestStoreOutageIs503(t *testing.T) {
	var fail atomic.Bool
	store := failingGet(&fail)
	a := newFixture(t, fixtureOpts{store: store})
	var s agent.TurnResult
	a.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	// A second host on the same store, with a fresh state root and restore
	// off: the token is not on its disk, so it must ask the store.
	b := newFixture(t, fixtureOpts{store: store, policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}})
	fail.Store(true)
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"again"}`, s.ContinuationToken)
	b.wantError("POST", "/v1/sessions/continue", body, 503, server.CodeStoreUnavailable)
	b.wantError("GET", "/v1/sessions/"+s.SessionID, "", 503, server.CodeStoreUnavailable)
	resp := b.send("POST", "/v1/sessions/continue", body, nil)
	resp.Body.Close()
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	fail.Store(false)
	var r agent.TurnResult
	if st := b.do("POST", "/v1/sessions/continue", body, &r); st != 200 || r.SessionID != s.SessionID || r.Turn.Result != "echo: again" {
		t.Fatalf("after the outage: status %d, %+v", st, r)
	}
}

// gate is a tool that blocks until the test lets it go, so a test sees a
// turn while it runs.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 16), release: make(chan struct{})} }

func (g *gate) tool() tool.Tool {
	return tool.Tool{
		Spec: model.ToolSpec{Name: "wait", Description: "waits", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			g.entered <- struct{}{}
			select {
			case <-g.release:
				return "released", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		},
	}
}

func gatedAgent(t *testing.T, g *gate) agent.Agent {
	t.Helper()
	echo, err := model.NewEcho(&model.EchoConfig{Script: []model.EchoStep{
		{Tool: "wait", Args: map[string]any{}},
		{Text: "done: {{.UserMessage}} after {{.LastToolResult}}"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return agent.Agent{Name: "gated", Model: echo, Tools: []tool.Tool{g.tool()}}
}

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	id, name, data string
}

// readEvents parses an event stream into ch until it ends.
func readEvents(body io.Reader, ch chan<- sseEvent) {
	defer close(ch)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.name != "" || ev.data != "" {
				ch <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data += line[6:]
		}
	}
}

func next(t *testing.T, ch <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the event stream ended early")
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	return sseEvent{}
}

func TestStreamedTurnAndLiveEvents(t *testing.T) {
	g := newGate()
	f := newFixture(t, fixtureOpts{agent: gatedAgent(t, g)})

	// A streamed POST: events arrive while the turn waits in the tool.
	resp := f.send("POST", "/v1/sessions", `{"message":"stream me"}`, http.Header{"Accept": {"text/event-stream"}})
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("streamed start: status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseEvent, 64)
	go readEvents(resp.Body, ch)
	<-g.entered
	var names []string
	var sessionID string
	for {
		ev := next(t, ch)
		names = append(names, ev.name)
		var e agent.Event
		json.Unmarshal([]byte(ev.data), &e)
		sessionID = e.SessionID
		if ev.id != fmt.Sprint(e.Seq) {
			t.Fatalf("event id %q, seq %d", ev.id, e.Seq)
		}
		if ev.name == agent.EventToolCall {
			break
		}
	}
	if strings.Join(names, ",") != "turn.started,model.call,tool.call" {
		t.Fatalf("events before the tool returned: %v", names)
	}

	// A live GET stream of the same session, opened mid-turn from the
	// start: it replays the log, then follows the turn.
	live := f.send("GET", "/v1/sessions/"+sessionID+"/events", "", http.Header{"Accept": {"text/event-stream"}})
	defer live.Body.Close()
	lch := make(chan sseEvent, 64)
	go readEvents(live.Body, lch)
	for _, want := range []string{"turn.started", "model.call", "tool.call"} {
		if ev := next(t, lch); ev.name != want {
			t.Fatalf("live stream replayed %q, want %q", ev.name, want)
		}
	}
	close(g.release)
	for _, want := range []string{"tool.result", "model.call", "turn.finished"} {
		if ev := next(t, ch); ev.name != want {
			t.Fatalf("streamed POST sent %q, want %q", ev.name, want)
		}
		if ev := next(t, lch); ev.name != want {
			t.Fatalf("live stream sent %q, want %q", ev.name, want)
		}
	}
	last := next(t, ch)
	var res agent.TurnResult
	if err := json.Unmarshal([]byte(last.data), &res); err != nil || last.name != "result" {
		t.Fatalf("last event %q %q: %v", last.name, last.data, err)
	}
	if res.SessionID != sessionID || res.ContinuationToken == "" || res.Turn.Status != agent.StatusCompleted || res.Turn.Result != "done: stream me after released" {
		t.Fatalf("result event %+v", res)
	}
	if _, ok := <-ch; ok {
		t.Fatal("the POST stream went on after the result")
	}

	// Reconnecting with Last-Event-ID resumes after that event.
	again := f.send("GET", "/v1/sessions/"+sessionID+"/events", "", http.Header{"Accept": {"text/event-stream"}, "Last-Event-Id": {"5"}})
	defer again.Body.Close()
	ach := make(chan sseEvent, 64)
	go readEvents(again.Body, ach)
	if ev := next(t, ach); ev.id != "6" {
		t.Fatalf("after Last-Event-ID 5 the stream starts at %q", ev.id)
	}

	// Deleting the session ends its live streams.
	if st := f.do("DELETE", "/v1/sessions/"+sessionID, "", nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	for ev := range lch {
		if ev.name == "end" {
			return
		}
	}
	t.Fatal("the live stream ended without an end event")
}

func TestStreamedErrorBeforeTheTurnIsPlainJSON(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	resp := f.send("POST", "/v1/sessions/continue", `{"continuationToken":"unknown","message":"x"}`, http.Header{"Accept": {"text/event-stream"}})
	defer resp.Body.Close()
	var e apiError
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != 404 || e.Error.Code != server.CodeUnknownToken {
		t.Fatalf("status %d, %+v", resp.StatusCode, e)
	}
	resp2 := f.send("GET", "/v1/sessions/unknown/events", "", http.Header{"Accept": {"text/event-stream"}})
	defer resp2.Body.Close()
	if resp2.StatusCode != 404 {
		t.Fatalf("live stream of an unknown session: status %d", resp2.StatusCode)
	}
}

func TestDrainEndsLiveStreams(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	resp := f.send("GET", "/v1/sessions/"+s.SessionID+"/events", "", http.Header{"Accept": {"text/event-stream"}})
	defer resp.Body.Close()
	ch := make(chan sseEvent, 64)
	go readEvents(resp.Body, ch)
	for range 3 { // the stored events
		next(t, ch)
	}
	f.srv.Drain()
	if ev := next(t, ch); ev.name != "end" {
		t.Fatalf("after Drain the stream sent %q, want end", ev.name)
	}
}

func TestServeFinishesRunningTurnsOnShutdown(t *testing.T) {
	g := newGate()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- server.Serve(ctx, agent.Config{Agent: gatedAgent(t, g), StateRoot: t.TempDir(), Store: memkv.New()}, server.Config{
			Addr:     "127.0.0.1:0",
			Options:  server.Options{Logger: discardLogger()},
			OnListen: func(a netAddr) { addr <- a.String() },
		})
	}()
	var base string
	select {
	case base = <-addr:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	answer := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post("http://"+base+"/v1/sessions", "application/json", strings.NewReader(`{"message":"slow"}`))
		if err != nil {
			t.Error(err)
			close(answer)
			return
		}
		answer <- resp
	}()
	<-g.entered
	cancel() // the signal: the turn is in its tool
	// New connections are refused once shutdown has begun.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + base + "/healthz")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("the server still accepts connections after its context ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(g.release)
	resp := <-answer
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	var r agent.TurnResult
	json.NewDecoder(resp.Body).Decode(&r)
	if resp.StatusCode != 201 || r.Turn.Status != agent.StatusCompleted {
		t.Fatalf("the running turn: status %d, %+v", resp.StatusCode, r)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after a graceful shutdown", err)
	}
}

func TestCheckAddr(t *testing.T) {
	for _, c := range []struct {
		addr, token string
		insecure    bool
		insecureErr bool
		otherErr    bool
	}{
		{addr: "127.0.0.1:8080"},
		{addr: "[::1]:0"},
		{addr: "localhost:9000"},
		{addr: "0.0.0.0:8080", insecureErr: true},
		{addr: ":8080", insecureErr: true},
		{addr: "192.0.2.1:8080", insecureErr: true},
		{addr: "example.internal:8080", insecureErr: true},
		{addr: "0.0.0.0:8080", token: "a-token-of-16-bytes"},
		{addr: "0.0.0.0:8080", insecure: true},
		{addr: "127.0.0.1", otherErr: true},
		{addr: "127.0.0.1:http-ish", otherErr: true},
	} {
		err := server.CheckAddr(c.addr, c.token, c.insecure)
		switch {
		case c.insecureErr && !errors.Is(err, server.ErrInsecure):
			t.Errorf("CheckAddr(%q, %q, %v) = %v, want ErrInsecure", c.addr, c.token, c.insecure, err)
		case c.otherErr && (err == nil || errors.Is(err, server.ErrInsecure)):
			t.Errorf("CheckAddr(%q) = %v, want an address error", c.addr, err)
		case !c.insecureErr && !c.otherErr && err != nil:
			t.Errorf("CheckAddr(%q, %q, %v) = %v, want nil", c.addr, c.token, c.insecure, err)
		}
	}
}

type netAddr = net.Addr

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
