package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/ledger"
	"agentkit/model"
	"agentkit/server"
)

// holdModel answers "re: {last user message}"; while holding is set, each
// call tells entered and waits for release.
type holdModel struct {
	holding atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// newHold returns a holdModel; ledgerPair releases it when the test ends,
// before the servers close, so a failing test does not hang.
func newHold(_ *testing.T) *holdModel {
	return &holdModel{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

// open releases the held calls, once.
func (m *holdModel) open() { m.once.Do(func() { close(m.release) }) }

func (m *holdModel) Name() string { return "hold" }

func (m *holdModel) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	if m.holding.Load() {
		m.entered <- struct{}{}
		select {
		case <-m.release:
		case <-ctx.Done():
			return model.Response{}, ctx.Err()
		}
	}
	last := ""
	for _, msg := range req.Messages {
		if msg.Role == model.RoleUser {
			last = msg.Content
		}
	}
	return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "re: " + last}}, nil
}

// ledgerPair is two servers in serving mode ledger over one store.
func ledgerPair(t *testing.T, store *kv.DB, ma, mb model.Model, lo agent.LedgerOptions) (*fixture, *fixture) {
	t.Helper()
	lo.AllowProcessLocal = true
	if lo.Lease == 0 {
		lo.Lease = time.Minute
	}
	lo.FollowInterval = 20 * time.Millisecond
	lo.JanitorInterval = 50 * time.Millisecond
	mk := func(m model.Model) *fixture {
		f := newFixture(t, fixtureOpts{agent: agent.Agent{Name: "shared", Model: m, NoWorkspaceTools: true}, store: store, serving: agent.ServingLedger, ledger: lo})
		if h, ok := m.(*holdModel); ok {
			t.Cleanup(h.open) // runs before the server closes: a failing test does not hang
		}
		return f
	}
	return mk(ma), mk(mb)
}

// released waits until no host holds the session.
func released(t *testing.T, f *fixture, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for s, err := range f.rt.Ledger().Sessions(context.Background()) {
			if err != nil {
				t.Fatal(err)
			}
			if s.ID == id && s.Holder == "" {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("session %s still held after 20s", id)
}

// keyed sends POST path with body and an Idempotency-Key; it returns the
// status, the headers and the decoded answer.
func (f *fixture) keyed(path, body, key string, out any) (int, http.Header) {
	f.t.Helper()
	hdr := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		hdr.Set("Idempotency-Key", key)
	}
	resp := f.send("POST", path, body, hdr)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			f.t.Fatalf("POST %s: %q is not JSON: %v", path, data, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// post sends POST path with body from any goroutine (it never calls
// t.Fatal) and returns the status, 0 when the request failed.
func post(f *fixture, path, body string) int {
	resp, err := http.Post(f.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// turnsByEvent returns how many turn.started events of the session carry
// the event id, as f reads them.
func turnsByEvent(t *testing.T, f *fixture, id, eventID string) (n int, answer string) {
	t.Helper()
	var page agent.EventPage
	if code := f.do("GET", "/v1/sessions/"+id+"/events?limit=1000", "", &page); code != 200 {
		t.Fatalf("GET events: %d", code)
	}
	var turn int64
	for _, ev := range page.Events {
		if ev.Type == agent.EventTurnStarted && ev.EventID == eventID {
			n++
			turn = ev.Turn
		}
		if ev.Type == agent.EventTurnFinished && ev.Turn == turn && n > 0 {
			answer = ev.Result
		}
	}
	return n, answer
}

type started struct {
	SessionID         string `json:"sessionId"`
	ContinuationToken string `json:"continuationToken"`
	Turn              struct {
		Status string `json:"status"`
		Result string `json:"result"`
	} `json:"turn"`
}

type queued struct {
	SessionID string `json:"sessionId"`
	EventID   string `json:"eventId"`
	Status    string `json:"status"`
}

func TestLedgerContinue200OnTheHolder202ElsewhereAndOneMessagePerKey(t *testing.T) {
	store := memkv.New()
	ma := newHold(t)
	a, b := ledgerPair(t, store, ma, newHold(t), agent.LedgerOptions{})

	var s started
	if code, _ := a.keyed("/v1/sessions", `{"message":"one"}`, "", &s); code != http.StatusCreated || s.Turn.Result != "re: one" {
		t.Fatalf("start on A: %d %+v", code, s)
	}
	released(t, a, s.SessionID)
	// The host that takes the message runs the turn: 200 with the turn.
	var r started
	if code, _ := b.keyed("/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"two"}`, "", &r); code != 200 || r.Turn.Result != "re: two" {
		t.Fatalf("continue on B (no holder): %d %+v; want 200 with the turn", code, r)
	}
	released(t, b, s.SessionID)

	// A holds the session, in a turn; B queues the message: 202.
	ma.holding.Store(true)
	done := make(chan int, 1)
	go func() {
		done <- post(a, "/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"three"}`)
	}()
	<-ma.entered
	body := `{"continuationToken":"` + s.ContinuationToken + `","message":"four"}`
	var q queued
	code, hdr := b.keyed("/v1/sessions/continue", body, "key-four", &q)
	if code != http.StatusAccepted || q != (queued{SessionID: s.SessionID, EventID: "key-four", Status: "queued"}) {
		t.Fatalf("continue on B while A holds the session: %d %+v; want 202 queued with the event id", code, q)
	}
	if hdr.Get("Location") != "/v1/sessions/"+s.SessionID {
		t.Errorf("202 Location %q", hdr.Get("Location"))
	}
	// The retry after a lost answer is the same message.
	if code, hdr := b.keyed("/v1/sessions/continue", body, "key-four", &q); code != http.StatusAccepted || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry: %d %v", code, hdr)
	}
	ma.holding.Store(false)
	ma.open()
	if code := <-done; code != 200 {
		t.Errorf("continue on A, the holder: %d, want 200", code)
	}
	// The queued message's turn is found by its event id on any host.
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, answer := turnsByEvent(t, b, s.SessionID, "key-four")
		if n == 1 && answer == "re: four" {
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("B finds the event key-four in %d turns (answer %q)", n, answer)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, _ := turnsByEvent(t, a, s.SessionID, "key-four"); n != 1 {
		t.Errorf("A finds key-four in %d turns", n)
	}
	// Once consumed, a retry answers 200 with the committed turn.
	var again started
	if code, hdr := a.keyed("/v1/sessions/continue", body, "key-four", &again); code != 200 || again.Turn.Result != "re: four" || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the commit: %d %+v %v", code, again, hdr)
	}
	if n, _ := turnsByEvent(t, b, s.SessionID, "key-four"); n != 1 {
		t.Errorf("after the retries key-four is in %d turns", n)
	}
	var got struct {
		Session agent.Session `json:"session"`
	}
	if code := b.do("GET", "/v1/sessions/"+s.SessionID, "", &got); code != 200 || got.Session.Turns != 4 {
		t.Errorf("GET the session on B: %d %+v", code, got.Session)
	}
	var list agent.SessionPage
	if code := b.do("GET", "/v1/sessions", "", &list); code != 200 || len(list.Sessions) != 1 || list.Sessions[0].ID != s.SessionID {
		t.Errorf("GET /v1/sessions on B: %d %+v", code, list)
	}
}

func TestLedgerFullInboxIs429TooLargeIs413Unknown404(t *testing.T) {
	store := memkv.New()
	ma := newHold(t)
	a, b := ledgerPair(t, store, ma, newHold(t), agent.LedgerOptions{Tuning: ledger.Tuning{MaxPending: 1, MaxEventBytes: 1024, RetryAfter: 3 * time.Second}})
	var s started
	if code, _ := a.keyed("/v1/sessions", `{"message":"one"}`, "", &s); code != http.StatusCreated {
		t.Fatalf("start: %d", code)
	}
	released(t, a, s.SessionID)
	big := `{"continuationToken":"` + s.ContinuationToken + `","message":"` + strings.Repeat("x", 2000) + `"}`
	b.wantError("POST", "/v1/sessions/continue", big, http.StatusRequestEntityTooLarge, "message_too_large", "maxEventBytes")

	ma.holding.Store(true)
	go post(a, "/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"two"}`)
	<-ma.entered
	resp := b.send("POST", "/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"three"}`, nil)
	var e apiError
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || e.Error.Code != "inbox_full" || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("a message past the queue's limit: %d %q Retry-After %q; want 429 inbox_full with Retry-After 3", resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After"))
	}
	ma.holding.Store(false)
	ma.open()

	b.wantError("POST", "/v1/sessions/continue", `{"continuationToken":"nope","message":"x"}`, http.StatusNotFound, "unknown_token")
	b.wantError("GET", "/v1/sessions/nope", "", http.StatusNotFound, "session_not_found")
	if code := b.do("DELETE", "/v1/sessions/"+s.SessionID, "", nil); code != http.StatusNoContent {
		t.Fatalf("DELETE on B: %d", code)
	}
	a.wantError("GET", "/v1/sessions/"+s.SessionID, "", http.StatusNotFound, "session_not_found")
	a.wantError("POST", "/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"x"}`, http.StatusNotFound, "unknown_token")
	b.wantError("DELETE", "/v1/sessions/"+s.SessionID, "", http.StatusNotFound, "session_not_found")
}

func TestLedgerStreamOnAHostNotRunningTheTurn(t *testing.T) {
	store := memkv.New()
	a, b := ledgerPair(t, store, newHold(t), newHold(t), agent.LedgerOptions{})
	var s started
	if code, _ := a.keyed("/v1/sessions", `{"message":"one"}`, "", &s); code != http.StatusCreated {
		t.Fatalf("start: %d", code)
	}
	req, _ := http.NewRequest("GET", b.url+"/v1/sessions/"+s.SessionID+"/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	ch := make(chan sseEvent, 64)
	go readEvents(resp.Body, ch)
	// The backlog: turn 1's events.
	for ev := next(t, ch); ev.name != agent.EventTurnFinished; ev = next(t, ch) {
	}
	released(t, a, s.SessionID)
	if code, _ := a.keyed("/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"two"}`, "", nil); code != 200 {
		t.Fatalf("continue on A: %d", code)
	}
	// B streams the turn A committed.
	ev := next(t, ch)
	if ev.name != agent.EventTurnStarted || !strings.Contains(ev.data, `"message":"two"`) {
		t.Fatalf("B streamed %+v; want turn 2's turn.started", ev)
	}
	for ev = next(t, ch); ev.name != agent.EventTurnFinished; ev = next(t, ch) {
	}
	if !strings.Contains(ev.data, "re: two") {
		t.Errorf("turn.finished %q", ev.data)
	}
}

// heldModel answers "re: {message}"; while held is set, it tells entered
// and waits at each call: for release when asked about "two", for rest
// otherwise. It records the messages it was asked about.
type heldModel struct {
	held          atomic.Bool
	entered       chan string
	release, rest chan struct{}
	mu            sync.Mutex
	asked         []string
}

func (m *heldModel) Name() string { return "held" }

func (m *heldModel) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	last := req.Messages[len(req.Messages)-1].Content
	m.mu.Lock()
	m.asked = append(m.asked, last)
	m.mu.Unlock()
	if m.held.Load() {
		m.entered <- last
		gate := m.rest
		if last == "two" {
			gate = m.release
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return model.Response{}, ctx.Err()
		}
	}
	return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "re: " + last}}, nil
}

// TestAShuttingDownLedgerHostStartsNoQueuedTurn: a host in serving mode
// ledger told to shut down while it runs a turn, with another message
// queued behind it, finishes the running turn and hands the session over
// with the queued message still queued: it never starts that turn, and
// another host runs it (docs/ledger.md, failure table).
func TestAShuttingDownLedgerHostStartsNoQueuedTurn(t *testing.T) {
	store := memkv.New()
	m := &heldModel{entered: make(chan string, 4), release: make(chan struct{}), rest: make(chan struct{})}
	closeRest := sync.OnceFunc(func() { close(m.rest) })
	defer closeRest()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	served := make(chan error, 1)
	cfg := func(mdl model.Model) agent.Config {
		return agent.Config{
			Agent: agent.Agent{Name: "drain", Model: mdl, NoWorkspaceTools: true}, StateRoot: t.TempDir(), Store: store,
			Serving: agent.ServingLedger, Logger: discardLogger(),
			Ledger: agent.LedgerOptions{Tuning: ledger.Tuning{Lease: 2 * time.Second, JanitorInterval: 100 * time.Millisecond, FollowInterval: 20 * time.Millisecond}, AllowProcessLocal: true},
		}
	}
	go func() {
		served <- server.Serve(ctx, cfg(m), server.Config{Addr: "127.0.0.1:0", OnListen: func(a net.Addr) { addr <- a }, Options: server.Options{Logger: discardLogger()}})
	}()
	base := "http://" + (<-addr).String()
	var first agent.TurnResult
	if st := postJSON(t, base+"/v1/sessions", `{"message":"one"}`, &first); st != 201 {
		t.Fatalf("start: %d", st)
	}
	m.held.Store(true)
	go postJSON(t, base+"/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"two"}`, first.ContinuationToken), nil)
	<-m.entered // turn 2 runs on this host
	// A third message waits behind it, queued through another host.
	b, err := agent.Open(context.Background(), cfg(echoModel(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if res, err := b.Continue(context.Background(), agent.ContinueRequest{Token: first.ContinuationToken, Message: "three"}); err != nil || !res.Queued {
		t.Fatalf("the queued message: %+v %v; want it queued", res, err)
	}
	// Another request keeps the server busy through its shutdown: a new
	// session whose turn waits (on rest) until the end of the test.
	go postJSON(t, base+"/v1/sessions", `{"message":"busy"}`, nil)
	<-m.entered
	cancel() // SIGTERM
	// The shutdown drains the ledger before it waits for the running
	// requests; the listener closes after the drain.
	waitFor(t, func() bool {
		return postJSON(t, base+"/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"refused"}`, first.ContinuationToken), nil) == 0
	})
	close(m.release) // turn 2 ends and commits
	// Either the host hands the session over with "three" still queued,
	// or it starts "three": whichever comes first decides.
	l, err := ledger.Open(ledger.Options{Store: store, Agent: "drain", Passive: true, AllowProcessLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	waitFor(t, func() bool {
		m.mu.Lock()
		asked := slices.Contains(m.asked, "three")
		m.mu.Unlock()
		if asked {
			return true
		}
		for s, err := range l.Sessions(context.Background()) {
			if err == nil && s.ID == first.SessionID && s.CommitSeq == 2 && s.Holder == "" && s.Pending == 1 {
				return true
			}
		}
		return false
	})
	m.mu.Lock()
	asked := slices.Clone(m.asked)
	m.mu.Unlock()
	if slices.Contains(asked, "three") {
		t.Fatalf("the shutting-down host started the queued turn (it was asked %q)", asked)
	}
	closeRest()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	// The other host takes the session over and runs it.
	waitFor(t, func() bool {
		s, err := b.GetSession(context.Background(), first.SessionID)
		return err == nil && s.Turns == 3
	})
}

// postJSON posts body to u and decodes a JSON answer into out; it returns
// the status (0 when the server is gone).
func postJSON(t *testing.T, u, body string, out any) int {
	resp, err := http.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// waitFor waits until ok holds, for at most 30 s.
func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("the condition did not hold within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
