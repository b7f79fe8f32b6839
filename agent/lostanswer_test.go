package agent_test

import (
	"context"
	"errors"
	"iter"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
)

// batchGate is a store with the batch capability whose operations a test
// can fail (before they run) or answer with an error after they landed
// (a lost answer).
type batchGate struct {
	db   *kv.DB
	mu   sync.Mutex
	fail func(op kv.Op, key string) error // before the operation
	lose func(op kv.Op, key string) bool  // after it landed
}

func (g *batchGate) hooks() (func(kv.Op, string) error, func(kv.Op, string) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fail, g.lose
}

func (g *batchGate) before(op kv.Op, key string) error {
	if f, _ := g.hooks(); f != nil {
		return f(op, key)
	}
	return nil
}

func (g *batchGate) Put(ctx context.Context, k string, v []byte) error {
	if err := g.before(kv.OpPut, k); err != nil {
		return err
	}
	return g.db.Put(ctx, k, v)
}
func (g *batchGate) Get(ctx context.Context, k string) ([]byte, error) {
	if err := g.before(kv.OpGet, k); err != nil {
		return nil, err
	}
	return g.db.Get(ctx, k)
}
func (g *batchGate) Delete(ctx context.Context, k string) error { return g.db.Delete(ctx, k) }
func (g *batchGate) List(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
	return g.db.List(ctx, p)
}
func (g *batchGate) GetWithVersion(ctx context.Context, k string) ([]byte, kv.Version, error) {
	if err := g.before(kv.OpGetWithVersion, k); err != nil {
		return nil, "", err
	}
	return g.db.GetWithVersion(ctx, k)
}
func (g *batchGate) PutIfAbsent(ctx context.Context, k string, v []byte) (kv.Version, error) {
	return g.db.PutIfAbsent(ctx, k, v)
}
func (g *batchGate) PutIfVersion(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
	return g.db.PutIfVersion(ctx, k, v, e)
}
func (g *batchGate) ListKeys(ctx context.Context, p string) iter.Seq2[string, error] {
	return g.db.ListKeys(ctx, p)
}
func (g *batchGate) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	if err := g.before(kv.OpWriteBatch, ops[0].Key); err != nil {
		return nil, err
	}
	vers, err := g.db.WriteBatch(ctx, ops)
	if err != nil {
		var ke *kv.Error
		if errors.As(err, &ke) {
			err = ke.Err
		}
		return nil, err
	}
	if _, lose := g.hooks(); lose != nil && lose(kv.OpWriteBatch, ops[0].Key) {
		return nil, errStoreDown
	}
	return vers, nil
}

// TestALostAnswerAtATurnsEndIsSettledBeforeTheNextCommit: a turn's commit
// (sent alongside the local write of its events) lands and its answer is
// lost; the next turn cannot read the head first (the store is out of
// reach for that read) and runs from the local copy. Its commit must not
// take the first turn's landed batch for another host's: the attempt was
// recorded with the events, so it is found landed and the new turn goes
// on top of it. No fork; every turn in the store once.
//
// It runs in a synctest bubble: the mirror's background retry (a timer,
// retryMin after the lost answer) would otherwise settle the backlog on
// its own whenever the test is held up for a second on a loaded machine,
// before the check that the session is owed or before the third turn.
// In the bubble the timer fires only when every goroutine is idle, so the
// third turn is the one that settles it.
func TestALostAnswerAtATurnsEndIsSettledBeforeTheNextCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		shared := memkv.New()
		g := &batchGate{db: shared}
		a := host(t, g, nil, nil)
		if !a.Store().Capabilities().Batch {
			t.Fatal("the gated store has no batch capability; the test would not reach the batched commit")
		}
		res := start(t, a, "one")
		var once sync.Once
		g.mu.Lock()
		g.lose = func(op kv.Op, key string) bool {
			lost := false
			once.Do(func() { lost = true })
			return lost
		}
		g.mu.Unlock()
		if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two, answer lost"}); err != nil {
			t.Fatal(err)
		}
		if a.Info().MirrorBacklog != 1 {
			t.Fatalf("backlog %d after a lost answer; want the session", a.Info().MirrorBacklog)
		}
		var headReads sync.Once
		g.mu.Lock()
		g.lose = nil
		g.fail = func(op kv.Op, key string) error {
			var err error
			if op == kv.OpGetWithVersion && strings.HasSuffix(key, "/head") {
				headReads.Do(func() { err = errStoreDown })
			}
			return err
		}
		g.mu.Unlock()
		if _, err := a.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three"}); err != nil {
			t.Fatal(err)
		}
		if info := a.Info(); info.MirrorForks != 0 || info.MirrorBacklog != 0 {
			t.Errorf("after the third turn: %d forks, backlog %d; want none", info.MirrorForks, info.MirrorBacklog)
		}
		c := host(t, shared, nil, nil)
		if _, err := c.GetSession(ctx, res.SessionID); err != nil {
			t.Fatal(err)
		}
		if got := userMessages(t, c, res.SessionID); strings.Join(got, "|") != "one|two, answer lost|three" {
			t.Errorf("the store's session: %q", got)
		}
	})
}
