package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/model"
	"agentkit/server"
	"agentkit/tool"
)

// blocker is a tool each call of which waits for its own go-ahead, so a
// test holds one turn while it sends others.
type blocker struct {
	entered chan struct{}
	proceed chan struct{}
}

func newBlocker() *blocker {
	return &blocker{entered: make(chan struct{}, 16), proceed: make(chan struct{}, 16)}
}

func (b *blocker) tool() tool.Tool {
	return tool.Tool{
		Spec: model.ToolSpec{Name: "block", Description: "waits for the test", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			b.entered <- struct{}{}
			select {
			case <-b.proceed:
				return "went ahead", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		},
	}
}

// wait waits for a call to enter the tool.
func (b *blocker) wait(t *testing.T) {
	t.Helper()
	select {
	case <-b.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no turn entered the blocking tool within 30s")
	}
}

func blockingAgent(t *testing.T, b *blocker) agent.Agent {
	t.Helper()
	echo, err := model.NewEcho(&model.EchoConfig{Script: []model.EchoStep{
		{Tool: "block", Args: map[string]any{}},
		{Text: "done: {{.UserMessage}}"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return agent.Agent{Name: "blocking", Model: echo, Tools: []tool.Tool{b.tool()}}
}

// answer is one HTTP answer, read in full.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

// post sends a POST with headers and reads the whole answer; it never
// calls t.Fatal, so goroutines may use it.
func (f *fixture) post(path, body string, hdr http.Header, timeout time.Duration) answer {
	req, err := http.NewRequest("POST", f.url+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	client := &http.Client{Timeout: timeout}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(data), err: err}
}

func (a answer) decode(t *testing.T, v any) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("request failed: %v", a.err)
	}
	if err := json.Unmarshal([]byte(a.body), v); err != nil {
		t.Fatalf("answer %d %q is not JSON: %v", a.status, a.body, err)
	}
}

func key(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }

func sessionTurns(t *testing.T, f *fixture, id string) int64 {
	t.Helper()
	var got struct{ Session agent.Session }
	if st := f.do("GET", "/v1/sessions/"+id, "", &got); st != 200 {
		t.Fatalf("GET session: %d", st)
	}
	return got.Session.Turns
}

// startBlocked starts a session on a blocking agent and lets its first
// turn through.
func startBlocked(t *testing.T, f *fixture, b *blocker, hdr http.Header) (agent.TurnResult, answer) {
	t.Helper()
	b.proceed <- struct{}{}
	a := f.post("/v1/sessions", `{"message":"first"}`, hdr, 30*time.Second)
	var r agent.TurnResult
	a.decode(t, &r)
	b.wait(t) // the first turn's call, already let through
	if a.status != 201 || r.Turn.Result != "done: first" {
		t.Fatalf("start: %d %s", a.status, a.body)
	}
	return r, a
}

// TestBusySessionAnswers409AtOnce: a follow-up that finds its session
// running a turn is answered 409 session_busy with Retry-After at once,
// and never runs later (its client may have given up and retried).
func TestBusySessionAnswers409AtOnce(t *testing.T) {
	b := newBlocker()
	f := newFixture(t, fixtureOpts{agent: blockingAgent(t, b)})
	t.Cleanup(func() { close(b.proceed) }) // before the fixture closes: no turn stays blocked
	s, _ := startBlocked(t, f, b, nil)
	body := func(msg string) string {
		return fmt.Sprintf(`{"continuationToken":%q,"message":%q}`, s.ContinuationToken, msg)
	}
	running := make(chan answer, 1)
	go func() { running <- f.post("/v1/sessions/continue", body("slow"), nil, 60*time.Second) }()
	b.wait(t) // the turn "slow" runs, held in its tool
	for _, accept := range []string{"application/json", "text/event-stream"} {
		busy := f.post("/v1/sessions/continue", body("impatient"), http.Header{"Accept": {accept}}, 10*time.Second)
		var e apiError
		busy.decode(t, &e)
		if busy.status != http.StatusConflict || e.Error.Code != server.CodeSessionBusy || busy.header.Get("Retry-After") == "" {
			t.Fatalf("a follow-up (%s) while a turn runs: %d %s, Retry-After %q; want 409 session_busy with Retry-After", accept, busy.status, busy.body, busy.header.Get("Retry-After"))
		}
	}
	b.proceed <- struct{}{}
	if a := <-running; a.status != 200 || !strings.Contains(a.body, "done: slow") {
		t.Fatalf("the running turn: %d %q %v", a.status, a.body, a.err)
	}
	// The refused follow-ups did not queue: the session has its two turns,
	// and a new one runs as the third.
	b.proceed <- struct{}{}
	if a := f.post("/v1/sessions/continue", body("next"), nil, 30*time.Second); a.status != 200 || !strings.Contains(a.body, "done: next") {
		t.Fatalf("a follow-up after the turn: %d %q", a.status, a.body)
	}
	b.wait(t)
	if n := sessionTurns(t, f, s.SessionID); n != 3 {
		t.Fatalf("the session ran %d turns; want 3 (the refused follow-ups must not run)", n)
	}
}

// TestIdempotencyKeyReplaysTheFirstAnswer retries requests with the key
// of an earlier one: the answer is the first turn's, status and body, and
// no second turn runs; a key reused for another request is 422.
func TestIdempotencyKeyReplaysTheFirstAnswer(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := f.post("/v1/sessions", `{"message":"hello","title":"t"}`, key("start-key-1"), 30*time.Second)
	var s agent.TurnResult
	first.decode(t, &s)
	if first.status != 201 {
		t.Fatalf("start: %d %s", first.status, first.body)
	}
	again := f.post("/v1/sessions", `{"message":"hello","title":"t"}`, key("start-key-1"), 30*time.Second)
	if again.status != 201 || withoutToken(again.body) != withoutToken(first.body) || again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retried start: %d %q (Location %q, replayed %q); want the first answer %q", again.status, again.body, again.header.Get("Location"), again.header.Get("Idempotent-Replayed"), first.body)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("the first answer says it was replayed")
	}
	var list agent.SessionPage
	f.do("GET", "/v1/sessions", "", &list)
	if len(list.Sessions) != 1 {
		t.Fatalf("%d sessions after a retried start; want 1", len(list.Sessions))
	}
	// The first token is stored only as its digest, so the replayed start
	// carries a token of its own, which continues the same session.
	var r agent.TurnResult
	again.decode(t, &r)
	if r.ContinuationToken == "" || r.ContinuationToken == s.ContinuationToken {
		t.Fatalf("the replayed start's token %q; want a new token of the session", r.ContinuationToken)
	}
	via := f.post("/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"by the replay's token"}`, r.ContinuationToken), nil, 30*time.Second)
	var vr agent.TurnResult
	via.decode(t, &vr)
	if via.status != 200 || vr.SessionID != s.SessionID {
		t.Fatalf("continuing with the replayed start's token: %d %s; want session %s", via.status, via.body, s.SessionID)
	}

	cont := fmt.Sprintf(`{"continuationToken":%q,"message":"more"}`, s.ContinuationToken)
	c1 := f.post("/v1/sessions/continue", cont, key("cont-key-1"), 30*time.Second)
	c2 := f.post("/v1/sessions/continue", cont, key("cont-key-1"), 30*time.Second)
	if c1.status != 200 || c2.status != 200 || c1.body != c2.body {
		t.Fatalf("continue and its retry: %d %q / %d %q", c1.status, c1.body, c2.status, c2.body)
	}
	if n := sessionTurns(t, f, s.SessionID); n != 3 {
		t.Fatalf("the session ran %d turns; want 3 (the start, the follow-up by the replay's token, the keyed follow-up)", n)
	}
	// A key names one request: another body, or another route, is refused.
	for _, c := range []struct{ path, body, key string }{
		{"/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"other"}`, s.ContinuationToken), "cont-key-1"},
		{"/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"more","workspaceFiles":{"a":"b"}}`, s.ContinuationToken), "cont-key-1"},
		{"/v1/sessions", `{"message":"hello","title":"another"}`, "start-key-1"},
	} {
		a := f.post(c.path, c.body, key(c.key), 30*time.Second)
		var e apiError
		a.decode(t, &e)
		if a.status != http.StatusUnprocessableEntity || e.Error.Code != server.CodeKeyReused || !strings.Contains(e.Error.Message, "Idempotency-Key") {
			t.Errorf("POST %s %s with a used key: %d %s; want 422 %s", c.path, c.body, a.status, a.body, server.CodeKeyReused)
		}
	}
	// The same key on the other route is another request.
	if a := f.post("/v1/sessions", `{"message":"hello"}`, key("cont-key-1"), 30*time.Second); a.status != 201 || strings.Contains(a.body, s.SessionID) {
		t.Fatalf("the continue key on the start route: %d %s; want a new session", a.status, a.body)
	}
	// A key on another session's follow-up is refused too.
	var other agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"other session"}`, &other)
	a := f.post("/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":"more"}`, other.ContinuationToken), key("cont-key-1"), 30*time.Second)
	if a.status != http.StatusUnprocessableEntity {
		t.Fatalf("a key reused on another session: %d %s; want 422", a.status, a.body)
	}
}

// TestIdempotentReplayStreams: a retry that accepts text/event-stream gets
// the first turn's events again, then the same result event.
func TestIdempotentReplayStreams(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message":"hi"}`, &s)
	cont := fmt.Sprintf(`{"continuationToken":%q,"message":"streamed"}`, s.ContinuationToken)
	stream := func() []sseEvent {
		resp := f.send("POST", "/v1/sessions/continue", cont, http.Header{"Accept": {"text/event-stream"}, "Idempotency-Key": {"sse-key"}})
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("streamed continue: %d", resp.StatusCode)
		}
		ch := make(chan sseEvent, 64)
		go readEvents(resp.Body, ch)
		var evs []sseEvent
		for ev := range ch {
			evs = append(evs, ev)
		}
		return evs
	}
	first, again := stream(), stream()
	if len(first) != 4 || first[0].name != "turn.started" || first[3].name != "result" {
		t.Fatalf("the first stream: %+v", first)
	}
	if len(again) != len(first) {
		t.Fatalf("the replayed stream has %d events, the first %d: %+v", len(again), len(first), again)
	}
	for i := range first {
		if again[i] != first[i] {
			t.Fatalf("replayed event %d is %+v; the first stream sent %+v", i, again[i], first[i])
		}
	}
	if n := sessionTurns(t, f, s.SessionID); n != 2 {
		t.Fatalf("the session ran %d turns; want 2", n)
	}
}

// TestConcurrentRetryWithTheSameKey: while the first request with a key
// runs, a retry with the key is answered 409 idempotency_key_in_use with
// Retry-After; once the first ends, the retry gets its answer.
func TestConcurrentRetryWithTheSameKey(t *testing.T) {
	b := newBlocker()
	f := newFixture(t, fixtureOpts{agent: blockingAgent(t, b)})
	t.Cleanup(func() { close(b.proceed) }) // before the fixture closes: no turn stays blocked
	running := make(chan answer, 1)
	go func() { running <- f.post("/v1/sessions", `{"message":"first"}`, key("k-start"), 60*time.Second) }()
	b.wait(t)
	busy := f.post("/v1/sessions", `{"message":"first"}`, key("k-start"), 10*time.Second)
	var e apiError
	busy.decode(t, &e)
	if busy.status != http.StatusConflict || e.Error.Code != server.CodeKeyInUse || busy.header.Get("Retry-After") == "" {
		t.Fatalf("a retry while the first runs: %d %s; want 409 %s with Retry-After", busy.status, busy.body, server.CodeKeyInUse)
	}
	b.proceed <- struct{}{}
	first := <-running
	if first.status != 201 {
		t.Fatalf("the first: %d %s %v", first.status, first.body, first.err)
	}
	if retry := f.post("/v1/sessions", `{"message":"first"}`, key("k-start"), 10*time.Second); retry.status != 201 || withoutToken(retry.body) != withoutToken(first.body) {
		t.Fatalf("the retry after the first ended: %d %s; want %s", retry.status, retry.body, first.body)
	}
}

// TestIdempotencyKeySurvivesARestart retries on a new runtime over the same
// state root: the key is on disk with the turn.
func TestIdempotencyKeySurvivesARestart(t *testing.T) {
	root := t.TempDir()
	f := newFixture(t, fixtureOpts{root: root})
	first := f.post("/v1/sessions", `{"message":"before"}`, key("restart-key"), 30*time.Second)
	var s agent.TurnResult
	first.decode(t, &s)
	cont := fmt.Sprintf(`{"continuationToken":%q,"message":"follow"}`, s.ContinuationToken)
	c1 := f.post("/v1/sessions/continue", cont, key("restart-key-2"), 30*time.Second)
	f.close()
	g := newFixture(t, fixtureOpts{root: root})
	if a := g.post("/v1/sessions", `{"message":"before"}`, key("restart-key"), 30*time.Second); a.status != 201 || withoutToken(a.body) != withoutToken(first.body) {
		t.Fatalf("retried start after a restart: %d %s; want %s", a.status, a.body, first.body)
	}
	if a := g.post("/v1/sessions/continue", cont, key("restart-key-2"), 30*time.Second); a.status != 200 || a.body != c1.body {
		t.Fatalf("retried continue after a restart: %d %s; want %s", a.status, a.body, c1.body)
	}
	if n := sessionTurns(t, g, s.SessionID); n != 2 {
		t.Fatalf("the session ran %d turns; want 2", n)
	}
}

func TestBadIdempotencyKeys(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, h := range []http.Header{
		{"Idempotency-Key": {""}},
		{"Idempotency-Key": {strings.Repeat("k", 256)}},
		{"Idempotency-Key": {"a", "b"}},
		{"Idempotency-Key": {"tab\tinside"}},
	} {
		a := f.post("/v1/sessions", `{"message":"x"}`, h, 10*time.Second)
		var e apiError
		a.decode(t, &e)
		if a.status != 400 || e.Error.Code != server.CodeInvalid || !strings.Contains(e.Error.Message, "Idempotency-Key") {
			t.Errorf("Idempotency-Key %q: %d %s; want 400 naming the header", h.Values("Idempotency-Key"), a.status, a.body)
		}
	}
	// The quoted form of the IETF draft names the same key as the bare one.
	a1 := f.post("/v1/sessions", `{"message":"x"}`, key(`"quoted-key"`), 10*time.Second)
	a2 := f.post("/v1/sessions", `{"message":"x"}`, key("quoted-key"), 10*time.Second)
	if a1.status != 201 || withoutToken(a2.body) != withoutToken(a1.body) {
		t.Fatalf("quoted and bare key: %d %s / %d %s", a1.status, a1.body, a2.status, a2.body)
	}
}

// withoutToken is an answer's body with its continuation token blanked: a
// replayed start carries a new token of the same session, as only the
// first token's digest is stored.
func withoutToken(body string) string {
	return regexp.MustCompile(`"continuationToken":"[^"]*"`).ReplaceAllString(body, `"continuationToken":""`)
}
