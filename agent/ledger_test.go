package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/abtest"
	"agentkit/agent"
	"agentkit/internal/testenv/pgtest"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/ledger"
	"agentkit/memory"
	"agentkit/model"
	"agentkit/tool"
)

// gateModel answers "re: {last user message}" and, while blocking is set,
// waits at each call for release, telling entered first. It records the
// user messages of every request it is sent.
type gateModel struct {
	blocking atomic.Bool
	entered  chan string
	release  chan struct{}
	once     sync.Once

	mu       sync.Mutex
	requests [][]string // user messages of each request
}

// newGate returns a gateModel; ledgerHost releases it when the test ends,
// before the runtime closes, so a failing test does not hang.
func newGate(_ *testing.T) *gateModel {
	return &gateModel{entered: make(chan string, 16), release: make(chan struct{})}
}

// open releases the blocked calls, once.
func (g *gateModel) open() { g.once.Do(func() { close(g.release) }) }

func (g *gateModel) Name() string { return "gate" }

func (g *gateModel) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	var users []string
	last := ""
	for _, m := range req.Messages {
		if m.Role == model.RoleUser {
			users = append(users, m.Content)
			last = m.Content
		}
	}
	g.mu.Lock()
	g.requests = append(g.requests, users)
	var call []model.ToolCall
	if strings.HasPrefix(last, "tool:") && req.Messages[len(req.Messages)-1].Role == model.RoleUser {
		call = []model.ToolCall{{ID: "c1", Name: "charge", Arguments: json.RawMessage(`{}`)}}
	}
	g.mu.Unlock()
	if g.blocking.Load() {
		g.entered <- last
		select {
		case <-g.release:
		case <-ctx.Done():
			return model.Response{}, context.Cause(ctx)
		}
	}
	if call != nil {
		return model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: call}}, nil
	}
	return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "re: " + last}}, nil
}

// lastRequest returns the user messages of the last request.
func (g *gateModel) lastRequest() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests[len(g.requests)-1]
}

// ledgerHost opens a runtime in serving mode ledger over store.
func ledgerHost(t *testing.T, store *kv.DB, m model.Model, edit func(*agent.Config)) *agent.Runtime {
	t.Helper()
	cfg := agent.Config{
		Agent:   agent.Agent{Name: "ledger-agent", Model: m, NoWorkspaceTools: true},
		Store:   store,
		Serving: agent.ServingLedger,
		Ledger:  agent.LedgerOptions{Tuning: ledger.Tuning{Lease: time.Minute, FollowInterval: 20 * time.Millisecond, JanitorInterval: 50 * time.Millisecond}, AllowProcessLocal: true},
		Logger:  slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&cfg)
	}
	rt := open(t, cfg)
	if g, ok := m.(interface{ open() }); ok {
		t.Cleanup(g.open) // runs before the runtime closes: a failing test does not hang
	}
	return rt
}

// waitTurns waits until the session has n turns as rt reads it.
func waitTurns(t *testing.T, rt *agent.Runtime, id string, n int64) agent.Session {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := rt.GetSession(context.Background(), id)
		if err == nil && s.Turns >= n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: %d turns after 20s (err %v), want %d", id, s.Turns, err, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitReleased waits until no host holds the session: the holder gives
// the lease up once its inbox is empty, a moment after its last commit.
func waitReleased(t *testing.T, rt *agent.Runtime, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for s, err := range rt.Ledger().Sessions(context.Background()) {
			if err != nil {
				t.Fatal(err)
			}
			if s.ID == id && s.Holder == "" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s is still held after 20s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// userMessages returns the messages of the session's turn.started events,
// with their event ids, as rt reads them.
func ledgerMessages(t *testing.T, rt *agent.Runtime, id string) (msgs, eventIDs []string) {
	t.Helper()
	page, err := rt.Events(context.Background(), id, 0, agent.MaxPageSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range page.Events {
		if ev.Type == agent.EventTurnStarted {
			msgs = append(msgs, ev.Message)
			eventIDs = append(eventIDs, ev.EventID)
		}
	}
	return msgs, eventIDs
}

func TestLedgerModeRefusesTheMemoryStoreOutsideTests(t *testing.T) {
	_, err := agent.Open(context.Background(), agent.Config{
		Agent: agent.Agent{Name: "x", Model: echoModel(t)}, StateRoot: t.TempDir(), Store: memkv.New(), Serving: agent.ServingLedger,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("Open over the memory driver in ledger mode: %v, want a refusal naming the memory store", err)
	}
}

func TestLedgerTwoHostsServeOneSessionFromTheCommittedTranscript(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	ma, mb := newGate(t), newGate(t)
	a := ledgerHost(t, store, ma, nil)
	b := ledgerHost(t, store, mb, nil)

	res := start(t, a, "one")
	if res.Queued || res.Turn.Result != "re: one" || res.EventID == "" {
		t.Fatalf("start on A: %+v", res)
	}
	// B reads the committed turn, and continues the session with A's token.
	if s, err := b.GetSession(ctx, res.SessionID); err != nil || s.Turns != 1 || s.LastStatus != agent.StatusCompleted {
		t.Fatalf("B GetSession: %+v, %v", s, err)
	}
	waitReleased(t, b, res.SessionID)
	r2, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"})
	if err != nil || r2.Queued || r2.Turn.Result != "re: two" {
		t.Fatalf("continue on B: %+v, %v", r2, err)
	}
	// B's model saw exactly the committed conversation: A's turn, then its own.
	if got := mb.lastRequest(); strings.Join(got, "|") != "one|two" {
		t.Errorf("B's model was sent the user messages %q, want one|two", got)
	}
	waitReleased(t, a, res.SessionID)
	r3, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three"})
	if err != nil || r3.Turn.Result != "re: three" {
		t.Fatalf("continue on A: %+v, %v", r3, err)
	}
	if got := ma.lastRequest(); strings.Join(got, "|") != "one|two|three" {
		t.Errorf("A's model was sent %q after B's turn, want one|two|three", got)
	}
	for name, rt := range map[string]*agent.Runtime{"A": a, "B": b} {
		msgs, ids := ledgerMessages(t, rt, res.SessionID)
		if strings.Join(msgs, "|") != "one|two|three" || ids[1] != r2.EventID {
			t.Errorf("host %s reads %q (event ids %q)", name, msgs, ids)
		}
		page, err := rt.ListSessions(ctx, 0, "")
		if err != nil || len(page.Sessions) != 1 || page.Sessions[0].Turns != 3 || page.Sessions[0].ChannelID != agent.DefaultChannel {
			t.Errorf("host %s lists %+v, %v", name, page.Sessions, err)
		}
	}
}

func TestLedgerContinueOnAnotherHostIsQueuedAndFoundByEventID(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	ma := newGate(t)
	a := ledgerHost(t, store, ma, nil)
	b := ledgerHost(t, store, newGate(t), nil)
	res := start(t, a, "one")

	ma.blocking.Store(true)
	done := make(chan agent.TurnResult, 1)
	go func() {
		r, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	<-ma.entered // A holds the session, in turn 2
	live, cancel := b.Subscribe(res.SessionID)
	defer cancel()
	q, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three", IdempotencyKey: "k-three"})
	if err != nil || !q.Queued || q.EventID != "k-three" || q.SessionID != res.SessionID {
		t.Fatalf("continue on B while A holds the session: %+v, %v; want Queued with the event id", q, err)
	}
	// The same key again is the same message, not a second one.
	q2, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three", IdempotencyKey: "k-three"})
	if err != nil || !q2.Queued || !q2.Replayed {
		t.Fatalf("the retry: %+v, %v", q2, err)
	}
	ma.blocking.Store(false)
	ma.open()
	if r := <-done; r.Turn.Result != "re: two" {
		t.Errorf("A's turn: %+v", r)
	}
	// B's subscriber sees the turns A commits, B being no holder.
	var finished int
	for finished < 2 {
		select {
		case ev := <-live:
			if ev.Type == agent.EventTurnFinished {
				finished++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("B's subscriber saw %d turns finish", finished)
		}
	}
	waitTurns(t, b, res.SessionID, 3)
	msgs, ids := ledgerMessages(t, b, res.SessionID)
	if strings.Join(msgs, "|") != "one|two|three" || ids[2] != "k-three" {
		t.Fatalf("B reads %q %q; want the queued message once, with its event id", msgs, ids)
	}
	// A retry after the turn committed answers with the committed turn.
	r3, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three", IdempotencyKey: "k-three"})
	if err != nil || r3.Queued || !r3.Replayed || r3.Turn.Result != "re: three" {
		t.Fatalf("retry after the commit: %+v, %v", r3, err)
	}
	if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "other", IdempotencyKey: "k-three"}); !errors.Is(err, agent.ErrKeyReused) {
		t.Errorf("the key with another message: %v, want ErrKeyReused", err)
	}
	if msgs, _ := ledgerMessages(t, a, res.SessionID); len(msgs) != 3 {
		t.Errorf("after the retries the session holds %q", msgs)
	}
}

func TestLedgerFullInboxTooLargeAndUnknown(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	ma := newGate(t)
	a := ledgerHost(t, store, ma, func(c *agent.Config) { c.Ledger.MaxPending = 2; c.Ledger.MaxEventBytes = 2048 })
	b := ledgerHost(t, store, newGate(t), func(c *agent.Config) { c.Ledger.MaxPending = 2; c.Ledger.MaxEventBytes = 2048 })
	res := start(t, a, "one")

	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: strings.Repeat("x", 4096)}); !errors.Is(err, agent.ErrTooLarge) {
		t.Errorf("a message over MaxEventBytes: %v, want ErrTooLarge", err)
	}
	ma.blocking.Store(true)
	go a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"})
	<-ma.entered
	if r, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three"}); err != nil || !r.Queued {
		t.Fatalf("second pending: %+v, %v", r, err)
	}
	_, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "four"})
	var full *agent.InboxFullError
	if !errors.As(err, &full) || !errors.Is(err, agent.ErrInboxFull) || full.RetryAfter <= 0 {
		t.Fatalf("a third pending message: %v, want an InboxFullError with RetryAfter", err)
	}
	ma.blocking.Store(false)
	ma.open()
	waitTurns(t, a, res.SessionID, 3)
	if msgs, _ := ledgerMessages(t, a, res.SessionID); strings.Join(msgs, "|") != "one|two|three" {
		t.Errorf("the refused message was kept: %q", msgs)
	}

	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: "no-such-token", Message: "x"}); !errors.Is(err, agent.ErrUnknownToken) {
		t.Errorf("unknown token: %v", err)
	}
	if _, err := b.GetSession(ctx, "no-such-session"); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("unknown session: %v", err)
	}
	if err := b.DeleteSession(ctx, res.SessionID); err != nil {
		t.Fatal(err)
	}
	for name, rt := range map[string]*agent.Runtime{"A": a, "B": b} {
		if _, err := rt.GetSession(ctx, res.SessionID); !errors.Is(err, agent.ErrSessionNotFound) {
			t.Errorf("host %s reads the deleted session: %v", name, err)
		}
		if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "x"}); !errors.Is(err, agent.ErrUnknownToken) {
			t.Errorf("host %s continues the deleted session: %v", name, err)
		}
		if page, _ := rt.ListSessions(ctx, 0, ""); len(page.Sessions) != 0 {
			t.Errorf("host %s lists the deleted session: %+v", name, page.Sessions)
		}
	}
}

// TestLedgerTakeoverContinuesFromTheCommittedTurns runs the takeover on the
// memory driver and on PostgreSQL.
func TestLedgerTakeoverContinuesFromTheCommittedTurns(t *testing.T) {
	t.Run("mem", func(t *testing.T) { takeoverContinues(t, memkv.New(), nil) })
	// On a real PostgreSQL table the start-up check accepts the store
	// without AllowProcessLocal.
	t.Run("postgres", func(t *testing.T) {
		store, err := kv.Open(context.Background(), pgtest.TableURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		takeoverContinues(t, store, func(c *agent.Config) { c.Ledger.AllowProcessLocal = false })
	})
}

// takeoverContinues: a session started on A, taken over by B while A is
// in a turn (A's ledger stops), continues on B from exactly the committed
// turns; A's waiting request answers with the turn B committed, and both
// hosts read the same transcript.
func takeoverContinues(t *testing.T, store *kv.DB, opt func(*agent.Config)) {
	ctx := context.Background()
	ma, mb := newGate(t), newGate(t)
	a := ledgerHost(t, store, ma, opt)
	b := ledgerHost(t, store, mb, opt)
	res := start(t, a, "one")
	waitReleased(t, a, res.SessionID)
	ma.blocking.Store(true)
	done := make(chan agent.TurnResult, 1)
	go func() {
		r, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two", IdempotencyKey: "k2"})
		if err != nil {
			t.Errorf("continue on A: %v", err)
		}
		done <- r
	}()
	<-ma.entered
	// A's ledger stops while A is in turn 2, its turn canceled: the
	// commit never happens, and the message A had accepted is not lost.
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	a.Ledger().Close(stopped)
	waitTurns(t, b, res.SessionID, 2)
	// A's request, still waiting, answers with the turn B committed.
	if r := <-done; r.Turn.Result != "re: two" || r.Queued {
		t.Errorf("A's continue answered %+v; want the turn B committed", r)
	}
	if got := mb.lastRequest(); strings.Join(got, "|") != "one|two" {
		t.Errorf("B's model was sent %q; want the committed turn and the message", got)
	}
	r3, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three"})
	if err != nil || r3.Turn.Result != "re: three" {
		t.Fatalf("continue on B: %+v %v", r3, err)
	}
	for name, rt := range map[string]*agent.Runtime{"A": a, "B": b} {
		msgs, ids := ledgerMessages(t, rt, res.SessionID)
		if strings.Join(msgs, "|") != "one|two|three" || ids[1] != "k2" {
			t.Errorf("host %s reads %q %q", name, msgs, ids)
		}
	}
}

// recordingMemory is a memory backend recording what it is given.
type recordingMemory struct {
	mu   sync.Mutex
	recs []memory.Record
}

func (m *recordingMemory) AppendTurn(_ context.Context, rec memory.Record, _ memory.Info) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, rec)
	return nil
}

func (m *recordingMemory) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs)
}

func TestLedgerFencedCommitWritesNoMemoryHookOrSample(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	ma := newGate(t)
	mem := &recordingMemory{}
	var hooks atomic.Int64
	exp := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "plain"}, {Name: "warm", Instructions: "Be warm."}}}
	a := ledgerHost(t, store, ma, func(c *agent.Config) {
		c.Memory.Backend = mem
		c.Agent.Experiments = []abtest.Experiment{exp}
		c.Agent.Hooks.AfterTurn = func(context.Context, agent.TurnInfo) error { hooks.Add(1); return nil }
	})
	b := ledgerHost(t, store, newGate(t), nil)

	ma.blocking.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := a.StartSession(ctx, agent.StartRequest{Message: "one"})
		done <- err
	}()
	<-ma.entered
	page, err := b.ListSessions(ctx, 0, "")
	if err != nil || len(page.Sessions) != 1 {
		t.Fatalf("B lists %+v, %v", page, err)
	}
	// B deletes the session while A is in its turn: A's commit is fenced.
	if err := b.DeleteSession(ctx, page.Sessions[0].ID); err != nil {
		t.Fatal(err)
	}
	ma.open()
	if err := <-done; !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("the start whose session was deleted mid-turn: %v", err)
	}
	// A's handler has returned (the start's wait ended with the
	// deletion, which the handler's refused commit precedes); close A so
	// nothing of the turn can still be running.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := hooks.Load(); n != 0 {
		t.Errorf("the AfterTurn hook ran %d times for a turn whose commit was refused", n)
	}
	if n := mem.count(); n != 0 {
		t.Errorf("the memory journal got %d records for a turn whose commit was refused", n)
	}
	for _, e := range a.ABReport(ctx).Experiments {
		for _, v := range e.Variants {
			if v.Sessions != 0 {
				t.Errorf("an A/B sample was recorded for a turn whose commit was refused: %+v", v)
			}
		}
	}
}

func TestLedgerToolSeesTheSameIdempotencyKeyOnEveryAttempt(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	var mu sync.Mutex
	var keys []string
	charge := tool.Tool{
		Spec: model.ToolSpec{Name: "charge", Description: "charges", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(_ context.Context, env *tool.Env, _ json.RawMessage) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			keys = append(keys, env.IdempotencyKey)
			return "charged", nil
		},
	}
	withTool := func(c *agent.Config) { c.Agent.Tools = []tool.Tool{charge} }
	ma := newGate(t)
	a := ledgerHost(t, store, ma, withTool)
	b := ledgerHost(t, store, newGate(t), withTool)
	res := start(t, a, "one")
	waitReleased(t, b, res.SessionID)
	r, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "tool:pay"})
	if err != nil || r.Turn.Status != agent.StatusCompleted {
		t.Fatalf("%+v %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := res.SessionID + "/2/1"
	if len(keys) != 1 || keys[0] != want {
		t.Errorf("the tool saw the keys %q, want [%s] ({sessionId}/{commitSeq+1}/{n})", keys, want)
	}
}

func TestLedgerReminderFiresOnceThroughTheInbox(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	a := ledgerHost(t, store, newGate(t), nil)
	b := ledgerHost(t, store, newGate(t), nil)
	res := start(t, a, "one")
	// The same reminder fired twice (claimed by two hosts) is one event.
	for _, rt := range []*agent.Runtime{a, b} {
		if err := agent.FireLedgerReminder(rt, res.SessionID, "rem-1", "ping"); err != nil {
			t.Fatal(err)
		}
	}
	waitTurns(t, a, res.SessionID, 2)
	// A third message after it shows whether a second ping was queued
	// before it: the inbox runs in order.
	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "after"}); err != nil {
		t.Fatal(err)
	}
	waitTurns(t, b, res.SessionID, 3) // the continue may have been queued for A
	msgs, ids := ledgerMessages(t, b, res.SessionID)
	if strings.Join(msgs, "|") != "one|ping|after" || ids[1] != "reminder/rem-1" {
		t.Fatalf("the session holds %q %q; want the reminder once", msgs, ids)
	}
	// And through the scheduler: a due reminder becomes one turn.
	if _, err := a.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, Message: "later"}); err != nil {
		t.Fatal(err)
	}
	waitTurns(t, b, res.SessionID, 4)
	msgs, _ = ledgerMessages(t, b, res.SessionID)
	if fmt.Sprint(msgs) != "[one ping after later]" {
		t.Errorf("after the scheduled reminder: %q", msgs)
	}
}

// TestLedgerModeAdoptsALocalModeSession: a session served in serving
// mode local is adopted by the ledger when a host of serving mode ledger
// is first asked for it: its token continues it, its history is the
// ledger's committed transcript (the model sees it, every host lists it),
// and a host still in serving mode local then refuses it
// (ErrSessionMoved) instead of writing a second history. A second ledger
// host adopting it at once changes nothing.
func TestLedgerModeAdoptsALocalModeSession(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	cfg := func(root string, m model.Model) agent.Config {
		return agent.Config{Agent: agent.Agent{Name: "ledger-agent", Model: m, NoWorkspaceTools: true}, StateRoot: root, Store: store,
			Logger: slog.New(slog.DiscardHandler)}
	}
	localRoot := t.TempDir()
	local, err := agent.Open(ctx, cfg(localRoot, newGate(t)))
	if err != nil {
		t.Fatal(err)
	}
	res := start(t, local, "one")
	if _, err := local.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two", IdempotencyKey: "k2"}); err != nil {
		t.Fatal(err)
	}
	if err := local.Close(); err != nil {
		t.Fatal(err)
	}
	lcfg := func(root string, m model.Model) agent.Config {
		c := cfg(root, m)
		c.Serving, c.Ledger = agent.ServingLedger, agent.LedgerOptions{AllowProcessLocal: true}
		return c
	}
	g := newGate(t)
	led := open(t, lcfg(t.TempDir(), g))
	other := open(t, lcfg(t.TempDir(), newGate(t)))
	// Both ledger hosts are asked for it at once.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := other.GetSession(ctx, res.SessionID); err != nil {
			t.Errorf("the other ledger host reading the session: %v", err)
		}
	}()
	got, err := led.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three"})
	wg.Wait()
	if err != nil || got.SessionID != res.SessionID {
		t.Fatalf("continue with a local-mode token: %+v %v; want the session continued", got, err)
	}
	if got.Queued {
		waitTurns(t, led, res.SessionID, 3)
	}
	if users := g.lastRequest(); strings.Join(users, "|") != "one|two|three" && !got.Queued {
		t.Errorf("the model was sent %q; want the session's history and the new message", users)
	}
	for name, rt := range map[string]*agent.Runtime{"led": led, "other": other} {
		msgs, _ := ledgerMessages(t, rt, res.SessionID)
		if strings.Join(msgs, "|") != "one|two|three" {
			t.Errorf("host %s lists %q; want the local turns, then the ledger's", name, msgs)
		}
	}
	n := 0
	for s, err := range led.Ledger().Sessions(ctx) {
		if err != nil || s.ID != res.SessionID || s.CommitSeq != 3 {
			t.Errorf("the ledger holds %+v (%v); want the adopted session with 3 turns", s, err)
		}
		n++
	}
	if n != 1 {
		t.Errorf("the ledger holds %d sessions; want 1", n)
	}
	// A retry of the keyed turn run before the move is its answer, not a
	// new turn.
	again, err := led.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two", IdempotencyKey: "k2"})
	if err != nil || !again.Replayed {
		t.Errorf("the keyed turn of serving mode local, retried: %+v %v; want its answer", again, err)
	}
	// A host still in serving mode local refuses it now.
	back := open(t, cfg(localRoot, newGate(t)))
	if _, err := back.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "on local"}); !errors.Is(err, agent.ErrSessionMoved) {
		t.Errorf("serving mode local after the move: %v; want ErrSessionMoved", err)
	}
}

// TestLedgerHolderReadsNoCommittedTurnAgain: the host that ran a session's
// previous turns builds the next one from its local copy, reading only the
// control record; a host taking the session over reads each committed turn
// once.
func TestLedgerHolderReadsNoCommittedTurnAgain(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	var mu sync.Mutex
	reads := [2]map[string]int{{}, {}} // each host's reads per turn key
	host := func(i int) func(*agent.Config) {
		return func(c *agent.Config) {
			c.Ledger.Store = store.WithObserver(func(_ context.Context, o kv.Observation) {
				if o.Op == kv.OpGet && strings.Contains(o.Key, "/turns/") {
					mu.Lock()
					reads[i][o.Key]++
					mu.Unlock()
				}
			})
		}
	}
	once := func(name string, m map[string]int) {
		for key, n := range m {
			if n > 1 {
				t.Errorf("%s read %s %d times; want once at most", name, key, n)
			}
		}
	}
	a := ledgerHost(t, store, newGate(t), host(0))
	b := ledgerHost(t, store, newGate(t), host(1))
	res := start(t, a, "one")
	waitReleased(t, a, res.SessionID)
	mu.Lock()
	clear(reads[0]) // the start may read turn 1 for its answer; what follows may not
	mu.Unlock()
	for _, msg := range []string{"two", "three"} {
		waitReleased(t, a, res.SessionID)
		if r, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: msg}); err != nil || r.Queued {
			t.Fatalf("continue on A: %+v %v", r, err)
		}
	}
	// A may read a turn it just committed once, for its answer (when the
	// turn was flushed before the wait read it), never the history its
	// local copy holds: turn 1 is never read.
	mu.Lock()
	for key := range reads[0] {
		if strings.HasSuffix(key, "/turns/"+keys.Seq(1)) {
			t.Errorf("A read turn 1 (%s) while it ran the session; its local copy has it", key)
		}
	}
	once("A", reads[0])
	mu.Unlock()
	waitReleased(t, a, res.SessionID)
	if r, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "four"}); err != nil || r.Turn.Result != "re: four" {
		t.Fatalf("continue on B: %+v %v", r, err)
	}
	// B reads the three turns it lacks, and perhaps its own turn 4 for
	// the answer (when it was flushed before the wait read it): each once.
	mu.Lock()
	defer mu.Unlock()
	if len(reads[1]) < 3 {
		t.Errorf("B read %d committed turns taking over a session of 3 turns; want all three", len(reads[1]))
	}
	once("B", reads[1])
}

// TestLedgerUnreadableMessagesAreDeadLetteredAtOnce: an event no agentkit
// reads (not JSON, no message, a session's first message without its
// metadata) goes to the dead letters after one attempt, naming why; a
// message of a newer format is tried again instead (a newer host may read
// it), and the session's readable messages go on.
func TestLedgerUnreadableMessagesAreDeadLetteredAtOnce(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	// A 2 s lease: retries wait lease/20, doubling.
	a := ledgerHost(t, store, newGate(t), func(c *agent.Config) { c.Ledger.MaxAttempts = 3; c.Ledger.Lease = 2 * time.Second })
	l := a.Ledger()
	for _, tc := range []struct{ session, payload, want string }{
		{"not-json", `"just a string"`, "is not a message this agentkit reads: json"},
		{"no-message", `{"v":1,"source":"api"}`, "it has no message"},
		{"no-metadata", `{"v":1,"source":"api","message":"hi"}`, "carries no session metadata"},
	} {
		if _, err := l.Deliver(ctx, tc.session, ledger.Event{ID: "e1", Payload: json.RawMessage(tc.payload)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Await(ctx, tc.session, "e1"); !errors.Is(err, ledger.ErrDeadLettered) {
			t.Fatalf("%s: Await %v; want dead-lettered", tc.session, err)
		}
		var got []ledger.DeadLetter
		for d, err := range l.DeadLetters(ctx, tc.session) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, d)
		}
		if len(got) != 1 || got[0].Attempts != 1 || !strings.Contains(got[0].LastError, tc.want) {
			t.Fatalf("%s: dead letters %+v; want one after 1 attempt, its error naming %q", tc.session, got, tc.want)
		}
	}

	// A newer format is not dead-lettered at once.
	if _, err := l.Deliver(ctx, "newer", ledger.Event{ID: "e1", Payload: json.RawMessage(`{"v":99,"message":"hi"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Await(ctx, "newer", "e1"); !errors.Is(err, ledger.ErrDeadLettered) {
		t.Fatalf("newer format: Await %v; want dead-lettered after maxAttempts", err)
	}
	for d, err := range l.DeadLetters(ctx, "newer") {
		if err != nil || d.Attempts != 3 || !strings.Contains(d.LastError, "newer than this agentkit's") {
			t.Fatalf("newer format: dead letter %+v %v; want after 3 attempts, naming the format", d, err)
		}
	}

	// A readable session on the same host is served.
	res := start(t, a, "hello")
	if s := waitTurns(t, a, res.SessionID, 1); s.Turns != 1 {
		t.Fatalf("session %+v", s)
	}
}

// TestLedgerKeyedRetryAfterManyMessages: in serving mode ledger a retry
// with an Idempotency-Key (and a reminder claimed again) is the same
// message even after more later messages than the ledger's window of
// recent ids: the ledger keeps keys for its IdempotencyWindow. Past
// ledger.maxKeys kept keys a keyed message is refused (InboxFullError
// with Keys), an unkeyed one still queued.
func TestLedgerKeyedRetryAfterManyMessages(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	edit := func(c *agent.Config) { c.Ledger.DedupWindow, c.Ledger.MaxKeys = 2, 3 }
	a := ledgerHost(t, store, newGate(t), edit)
	b := ledgerHost(t, store, newGate(t), edit)
	res := start(t, a, "one")
	cont := func(rt *agent.Runtime, msg, key string) (agent.TurnResult, error) {
		return rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: msg, IdempotencyKey: key})
	}
	if _, err := cont(a, "early", "k-early"); err != nil {
		t.Fatal(err)
	}
	if err := agent.FireLedgerReminder(a, res.SessionID, "rem-1", "ping"); err != nil {
		t.Fatal(err)
	}
	waitTurns(t, a, res.SessionID, 3)
	for i := range 4 {
		if _, err := cont(a, fmt.Sprint("later ", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	waitTurns(t, b, res.SessionID, 7)
	r, err := cont(b, "early", "k-early")
	if err != nil || r.Queued || !r.Replayed || r.Turn.Result != "re: early" {
		t.Fatalf("the retry of k-early five messages later, on another host: %+v, %v; want the first turn replayed", r, err)
	}
	if err := agent.FireLedgerReminder(b, res.SessionID, "rem-1", "ping"); err != nil {
		t.Fatal(err)
	}
	if _, err := cont(b, "last", ""); err != nil { // a second ping would be queued before it
		t.Fatal(err)
	}
	waitTurns(t, b, res.SessionID, 8)
	msgs, _ := ledgerMessages(t, b, res.SessionID)
	if want := "one|early|ping|later 0|later 1|later 2|later 3|last"; strings.Join(msgs, "|") != want {
		t.Fatalf("the session holds %q; want %q", strings.Join(msgs, "|"), want)
	}
	// k-early and rem-1 have left the window, and k-2 leaves it with
	// k-4's turn: three kept keys. At maxKeys 3 a new key waits, a
	// message without one does not.
	for _, k := range []string{"k-2", "k-3", "k-4"} {
		if _, err := cont(a, k, k); err != nil {
			t.Fatal(err)
		}
	}
	waitTurns(t, a, res.SessionID, 11)
	_, err = cont(a, "k-5", "k-5")
	var full *agent.InboxFullError
	if !errors.As(err, &full) || !errors.Is(err, agent.ErrInboxFull) || full.Keys < 3 || full.RetryAfter < time.Hour {
		t.Fatalf("a keyed message past maxKeys: %v; want an InboxFullError with Keys and a wait of about the window", err)
	}
	if !strings.Contains(err.Error(), "ledger.maxKeys") {
		t.Errorf("the refusal says %q; want the setting named", err)
	}
	if _, err := cont(a, "no key", ""); err != nil {
		t.Fatalf("a message without a key past maxKeys: %v", err)
	}
}
