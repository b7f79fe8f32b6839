package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/agent"
	"agentkit/internal/testenv/natstest"
	"agentkit/internal/testenv/pgtest"
	"agentkit/kv"
	"agentkit/kv/memkv"
	_ "agentkit/kv/natskv" // the nats:// driver
	"agentkit/model"
	"agentkit/tool"
)

// gate is one host's handle on a shared store, with a seam to take the
// store away (down) or to hold an operation until the test releases it.
type gate struct {
	db   *kv.DB
	down atomic.Bool
	mu   sync.Mutex
	hold func(op kv.Op, key string) // called before each operation
	// lost, when it returns true, makes a write land and then fail, as a
	// connection cut after the write was sent.
	lost func(op kv.Op, key string) bool
}

var errStoreDown = errors.New("connection refused (test outage)")

func (g *gate) before(op kv.Op, key string) error {
	g.mu.Lock()
	h := g.hold
	g.mu.Unlock()
	if h != nil {
		h(op, key)
	}
	if g.down.Load() {
		return errStoreDown
	}
	return nil
}

// holdAt makes the next op on a key with the suffix wait until release is
// closed; reached is closed when it gets there.
func (g *gate) holdAt(op kv.Op, suffix string) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	g.mu.Lock()
	g.hold = func(o kv.Op, key string) {
		if o != op || !strings.HasSuffix(key, suffix) {
			return
		}
		hit := false
		once.Do(func() { hit = true })
		if hit {
			close(reached)
			<-release
		}
	}
	g.mu.Unlock()
	return reached, release
}

// landed reports whether a write that succeeded must report a lost answer.
func (g *gate) landed(op kv.Op, key string) error {
	g.mu.Lock()
	f := g.lost
	g.mu.Unlock()
	if f != nil && f(op, key) {
		return errStoreDown
	}
	return nil
}

func (g *gate) funcs() kv.Funcs {
	db := g.db
	return kv.Funcs{
		Put: func(ctx context.Context, k string, v []byte) error {
			if err := g.before(kv.OpPut, k); err != nil {
				return err
			}
			return db.Put(ctx, k, v)
		},
		Get: func(ctx context.Context, k string) ([]byte, error) {
			if err := g.before(kv.OpGet, k); err != nil {
				return nil, err
			}
			return db.Get(ctx, k)
		},
		Delete: func(ctx context.Context, k string) error {
			if err := g.before(kv.OpDelete, k); err != nil {
				return err
			}
			return db.Delete(ctx, k)
		},
		List: func(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
			if err := g.before(kv.OpList, p); err != nil {
				return func(yield func(kv.Entry, error) bool) { yield(kv.Entry{}, err) }
			}
			return db.List(ctx, p)
		},
		CAS: kv.CASFuncs{
			GetWithVersion: func(ctx context.Context, k string) ([]byte, kv.Version, error) {
				if err := g.before(kv.OpGetWithVersion, k); err != nil {
					return nil, "", err
				}
				return db.GetWithVersion(ctx, k)
			},
			PutIfAbsent: func(ctx context.Context, k string, v []byte) (kv.Version, error) {
				if err := g.before(kv.OpPutIfAbsent, k); err != nil {
					return "", err
				}
				ver, err := db.PutIfAbsent(ctx, k, v)
				if err == nil {
					err = g.landed(kv.OpPutIfAbsent, k)
				}
				return ver, err
			},
			PutIfVersion: func(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
				if err := g.before(kv.OpPutIfVersion, k); err != nil {
					return "", err
				}
				ver, err := db.PutIfVersion(ctx, k, v, e)
				if err == nil {
					err = g.landed(kv.OpPutIfVersion, k)
				}
				return ver, err
			},
			ListKeys: func(ctx context.Context, p string) iter.Seq2[string, error] {
				if err := g.before(kv.OpListKeys, p); err != nil {
					return func(yield func(string, error) bool) { yield("", err) }
				}
				return db.ListKeys(ctx, p)
			},
		},
	}
}

// sharedStores runs f on a memory store and on PostgreSQL (a fresh table).
func sharedStores(t *testing.T, f func(t *testing.T, shared *kv.DB)) {
	t.Run("mem", func(t *testing.T) { f(t, memkv.New()) })
	t.Run("postgres", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db, err := kv.Open(ctx, pgtest.TableURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		f(t, db)
	})
}

// host opens a runtime of agent "fo" on its own state root over store.
func host(t *testing.T, store any, m model.Model, obs agent.Observer) *agent.Runtime {
	t.Helper()
	if m == nil {
		m = echoModel(t)
	}
	return open(t, agent.Config{
		Agent: agent.Agent{Name: "fo", Model: m}, Store: store, Observer: obs,
		Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}},
	})
}

// userMessages returns a session's user messages, in order.
func userMessages(t *testing.T, rt *agent.Runtime, id string) []string {
	t.Helper()
	page, err := rt.Events(context.Background(), id, 0, agent.MaxPageSize)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range page.Events {
		if e.Type == agent.EventTurnStarted {
			out = append(out, e.Message)
		}
	}
	return out
}

// TestAHostWithAnOlderCopyNeverOverwritesNewerTurns is defect 1 of the
// hardening issue: A serves a session, B continues it, A continues it
// again from its older local copy.
func TestAHostWithAnOlderCopyNeverOverwritesNewerTurns(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared *kv.DB) {
		ctx := context.Background()
		recA := &recorder{}
		a := host(t, shared, recA, nil)
		b := host(t, shared, nil, nil)
		res := start(t, a, "one on A")
		if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two on B"}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three on A"}); err != nil {
			t.Fatal(err)
		}
		// A's model saw B's turn before answering.
		reqs := recA.requests()
		var seen []string
		for _, m := range reqs[len(reqs)-1].Messages {
			if m.Role == model.RoleUser {
				seen = append(seen, m.Content)
			}
		}
		if strings.Join(seen, "|") != "one on A|two on B|three on A" {
			t.Errorf("A's model saw %q", seen)
		}
		// A fourth host sees every acknowledged turn.
		c := host(t, shared, nil, nil)
		if _, err := c.GetSession(ctx, res.SessionID); err != nil {
			t.Fatal(err)
		}
		if got := userMessages(t, c, res.SessionID); strings.Join(got, "|") != "one on A|two on B|three on A" {
			t.Errorf("a new host sees %q", got)
		}
		if f := a.Info().MirrorForks + b.Info().MirrorForks; f != 0 {
			t.Errorf("%d forks in a plain failover", f)
		}
	})
}

// TestAnOutageKeepsTheLosingTurnAsAFork: A cannot reach the store, runs a
// turn from its copy and acknowledges it; B commits a turn meanwhile. When
// the store is back, A's turn loses the head: it stays on A as a fork,
// counted, the store keeps B's turn, and A's next turn starts from the
// store's history.
func TestAnOutageKeepsTheLosingTurnAsAFork(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared *kv.DB) {
		ctx := context.Background()
		g := &gate{db: shared}
		obs := &observer{}
		recA := &recorder{}
		a := host(t, g.funcs(), recA, obs)
		b := host(t, shared, nil, nil)
		res := start(t, a, "one on A")

		g.down.Store(true)
		r2, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two on A, store down"})
		if err != nil || r2.Turn.Status != agent.StatusCompleted {
			t.Fatalf("a turn during the outage: %+v %v; want it to run from the local copy", r2, err)
		}
		if a.Info().MirrorBacklog != 1 {
			t.Errorf("backlog %d during the outage", a.Info().MirrorBacklog)
		}
		if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two on B"}); err != nil {
			t.Fatal(err)
		}
		g.down.Store(false)
		// A's next turn settles the backlog first: its lost turn is a fork.
		if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three on A"}); err != nil {
			t.Fatal(err)
		}
		info := a.Info()
		if info.MirrorForks != 1 || info.MirrorBacklog != 0 {
			t.Errorf("info after the store came back: forks %d backlog %d", info.MirrorForks, info.MirrorBacklog)
		}
		obs.mu.Lock()
		forked := obs.forks[res.SessionID]
		obs.mu.Unlock()
		if forked != 3 { // turn.started, model.call, turn.finished of the lost turn
			t.Errorf("observer saw %d forked events, want 3", forked)
		}
		want := "one on A|two on B|three on A"
		if got := userMessages(t, a, res.SessionID); strings.Join(got, "|") != want {
			t.Errorf("A's session %q, want %q", got, want)
		}
		c := host(t, shared, nil, nil)
		if _, err := c.GetSession(ctx, res.SessionID); err != nil {
			t.Fatal(err)
		}
		if got := userMessages(t, c, res.SessionID); strings.Join(got, "|") != want {
			t.Errorf("the store's session %q, want %q", got, want)
		}
	})
}

// TestDeleteIsHonouredByAHostThatStillHasTheSession: B deletes a session
// while A is writing a turn of it (A is held just before its head write);
// A's write finds the tombstone, A drops its copy, and nothing of the
// session comes back.
func TestDeleteIsHonouredByAHostThatStillHasTheSession(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared *kv.DB) {
		ctx := context.Background()
		g := &gate{db: shared}
		a := host(t, g.funcs(), nil, nil)
		b := host(t, shared, nil, nil)
		res := start(t, a, "one")
		if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two on B"}); err != nil {
			t.Fatal(err)
		}
		reached, release := g.holdAt(kv.OpPutIfVersion, "/head")
		done := make(chan error, 1)
		go func() {
			_, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three on A"})
			done <- err
		}()
		select {
		case <-reached:
		case <-time.After(30 * time.Second):
			t.Fatal("A's commit never got to its head write")
		}
		if err := b.DeleteSession(ctx, res.SessionID); err != nil {
			t.Fatal(err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("A's turn across the delete: %v", err)
		}
		// A's turn was acknowledged before the delete reached it; the
		// delete wins: A's copy is gone, and the store keeps the tombstone
		// only.
		if _, err := a.GetSession(ctx, res.SessionID); !errors.Is(err, agent.ErrSessionNotFound) {
			t.Errorf("A's copy after the delete: %v", err)
		}
		if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "four"}); !errors.Is(err, agent.ErrUnknownToken) {
			t.Errorf("A's token after the delete: %v", err)
		}
		var left []string
		for k, err := range shared.ListKeys(ctx, "agentkit/v1/fo/") {
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(k, res.SessionID) || strings.Contains(k, res.ContinuationToken) {
				left = append(left, k)
			}
		}
		if len(left) != 1 || !strings.HasSuffix(left[0], "/head") {
			t.Errorf("left in the store: %q; want the tombstone", left)
		}
		// A host that never had it cannot bring it back either.
		c := host(t, shared, nil, nil)
		if _, err := c.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "five"}); !errors.Is(err, agent.ErrUnknownToken) {
			t.Errorf("a new host with the token: %v", err)
		}
	})
}

// TestDeleteReachesAHostWithAnIdleCopy: B deletes a session A holds; A's
// next turn of it finds the tombstone before it runs.
func TestDeleteReachesAHostWithAnIdleCopy(t *testing.T) {
	ctx := context.Background()
	shared := memkv.New()
	recA := &recorder{}
	a := host(t, shared, recA, nil)
	b := host(t, shared, nil, nil)
	res := start(t, a, "one")
	if err := b.DeleteSession(ctx, res.SessionID); err != nil {
		t.Fatal(err)
	}
	calls := len(recA.requests())
	if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"}); !errors.Is(err, agent.ErrUnknownToken) {
		t.Errorf("a turn of a session deleted on another host: %v", err)
	}
	if len(recA.requests()) != calls {
		t.Error("the turn of a deleted session reached the model")
	}
	if page, _ := a.ListSessions(ctx, 10, ""); len(page.Sessions) != 0 {
		t.Errorf("A still lists %+v", page.Sessions)
	}
}

// TestALostAnswerIsNotTakenForAnotherHostsWrite: the head write of a
// debounced commit lands but its answer is lost; more events follow; the
// turn's end retries the same commit, finds it landed, and commits the
// rest: no fork, every event in the store.
func TestALostAnswerIsNotTakenForAnotherHostsWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		shared := memkv.New()
		g := &gate{db: shared}
		var once sync.Once
		g.lost = func(op kv.Op, key string) bool {
			hit := false
			if op == kv.OpPutIfAbsent && strings.HasSuffix(key, "/head") {
				once.Do(func() { hit = true })
			}
			return hit
		}
		m := echoModel(t, model.EchoStep{Tool: "list_files"}, model.EchoStep{Text: "done", Delay: "1m"})
		rt, err := agent.Open(context.Background(), agent.Config{
			Agent: agent.Agent{Name: "lost", Model: m}, StateRoot: t.TempDir(), Store: g.funcs(),
			Policy: agent.Policy{Debounce: 10 * time.Second}, Logger: discard, Memory: agent.Memory{Off: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		res := start(t, rt, "go")
		info := rt.Info()
		if info.MirrorDropped != 1 || info.MirrorForks != 0 || info.MirrorBacklog != 0 {
			t.Errorf("after the turn: failed writes %d (want the one lost answer), forks %d, backlog %d", info.MirrorDropped, info.MirrorForks, info.MirrorBacklog)
		}
		seqs := storedSeqs(t, shared, keysWith(t, shared, "agentkit/v1/lost/sessions/"+res.SessionID+"/events/"))
		if fmt.Sprint(seqs) != "[[1 2 3 4] [5 6]]" {
			t.Errorf("stored batches %v; want the debounced batch once and the rest", seqs)
		}
	})
}

// TestTheBackgroundRetryLandsWithoutAnotherTurn: after an outage, a
// session whose turn was refused reaches the store with no further turn,
// through the background retry.
func TestTheBackgroundRetryLandsWithoutAnotherTurn(t *testing.T) {
	ctx := context.Background()
	shared := memkv.New()
	g := &gate{db: shared}
	obs := &observer{}
	a := host(t, g.funcs(), nil, obs)
	g.down.Store(true)
	res := start(t, a, "during the outage")
	if a.Info().MirrorBacklog != 1 {
		t.Fatalf("backlog %d", a.Info().MirrorBacklog)
	}
	g.down.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for a.Info().MirrorBacklog != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the backlog was not retried within 30s")
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not asserting time
	}
	b := host(t, shared, nil, nil)
	r, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "on B"})
	if err != nil || r.SessionID != res.SessionID {
		t.Fatalf("B with the token after the retry: %+v %v", r, err)
	}
	if got := userMessages(t, b, res.SessionID); strings.Join(got, "|") != "during the outage|on B" {
		t.Errorf("B sees %q", got)
	}
}

// TestLargeToolOutputsRestoreOverNATS: a session with a 3 MiB tool output
// (over NATS's 1 MiB value limit) reaches the store in parts and restores
// on another host.
func TestLargeToolOutputsRestoreOverNATS(t *testing.T) {
	u := natstest.URL(t, "agent_large_")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := kv.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	big := strings.Repeat("0123456789abcdef", 3<<20/16) // 3 MiB
	dump := toolT{Spec: model.ToolSpec{Name: "dump"}, Run: func(context.Context, *tool.Env, json.RawMessage) (string, error) { return big, nil }}
	m := echoModel(t, model.EchoStep{Tool: "dump"}, model.EchoStep{Text: "dumped"})
	a := open(t, agent.Config{Agent: agent.Agent{Name: "big", Model: m, Tools: []toolT{dump}}, Store: db})
	res := start(t, a, "dump it")
	if info := a.Info(); info.MirrorDropped != 0 || info.MirrorBacklog != 0 {
		t.Fatalf("writing the 3 MiB batch to NATS: dropped %d backlog %d", info.MirrorDropped, info.MirrorBacklog)
	}
	rec := &recorder{}
	b := open(t, agent.Config{Agent: agent.Agent{Name: "big", Model: rec}, Store: db, Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}})
	if _, err := b.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "and?"}); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, msg := range rec.requests()[0].Messages {
		if msg.Role == model.RoleTool && msg.Content == big {
			found = true
		}
	}
	if !found {
		t.Error("the other host's model did not get the 3 MiB tool output back")
	}
}
