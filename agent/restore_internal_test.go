package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/storage"
)

// seed writes n sessions straight into a store through the record layer,
// as a host of this build would have committed them (its first start ran
// the token migration on the empty store, which left its marker), session
// i updated at base + i minutes. It returns the ids, oldest first.
func seed(t *testing.T, db *kv.DB, agentName string, n int, base time.Time) []string {
	t.Helper()
	ctx := context.Background()
	b, err := storage.Define(storage.Config{Backend: db, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	as, err := b.Agent(agentName)
	if err != nil {
		t.Fatal(err)
	}
	sessions := as.Sessions()
	if _, err := sessions.MigrateTokens(ctx, "seed", nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		id := fmt.Sprintf("s-%05d", i)
		at := base.Add(time.Duration(i) * time.Minute)
		ev, _ := json.Marshal(Event{SessionID: id, Seq: 1, Type: EventTurnStarted, At: at, Turn: 1, Message: "hi"})
		meta := storage.SessionMeta{ID: id, ChannelID: "http", CreatedAt: at, UpdatedAt: at, Turns: 1, LastSeq: 1, TokenDigest: keys.TokenDigest("tok-" + id)}
		res, err := sessions.Commit(ctx, storage.CommitRequest{Writer: "seed", Meta: meta, BatchID: storage.NewBatchID(), Events: []json.RawMessage{ev}})
		if err != nil || res.Outcome != storage.Committed {
			t.Fatalf("seeding %s: %+v %v", id, res, err)
		}
		meta.Batches = res.Batch.Number
		if err := sessions.PutMeta(ctx, meta); err != nil {
			t.Fatal(err)
		}
		if _, err := sessions.PutIndex(ctx, meta); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// opCounter counts every operation a runtime makes on a store.
type opCounter struct {
	db     *kv.DB
	ops    atomic.Int64
	listed atomic.Int64
}

func (c *opCounter) funcs() kv.Funcs {
	return kv.Funcs{
		Put:    func(ctx context.Context, k string, v []byte) error { c.ops.Add(1); return c.db.Put(ctx, k, v) },
		Get:    func(ctx context.Context, k string) ([]byte, error) { c.ops.Add(1); return c.db.Get(ctx, k) },
		Delete: func(ctx context.Context, k string) error { c.ops.Add(1); return c.db.Delete(ctx, k) },
		List: func(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
			c.ops.Add(1)
			return func(yield func(kv.Entry, error) bool) {
				for e, err := range c.db.List(ctx, p) {
					c.listed.Add(1)
					if !yield(e, err) || err != nil {
						return
					}
				}
			}
		},
	}
}

// TestRestoreCostFollowsTheCapsNotTheStore opens a runtime on a store
// holding 2,000 sessions with caps of 10 sessions, and of 5 sessions by
// age, and counts the store operations.
func TestRestoreCostFollowsTheCapsNotTheStore(t *testing.T) {
	const total = 2000
	db := memkv.New()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ids := seed(t, db, "big", total, base)
	newest := base.Add(total * time.Minute)
	for _, c := range []struct {
		name   string
		policy Policy
		want   int
	}{
		{"MaxSessions 10", Policy{Restore: RestorePolicy{MaxSessions: 10}}, 10},
		{"MaxAge 5m", Policy{Restore: RestorePolicy{MaxAge: 5*time.Minute + 30*time.Second}}, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			cnt := &opCounter{db: db}
			echo, _ := model.NewEcho(nil)
			rt, err := Open(context.Background(), Config{
				Agent: Agent{Name: "big", Model: echo}, StateRoot: t.TempDir(), Store: cnt.funcs(),
				Policy: c.policy, Now: func() time.Time { return newest }, Logger: slog.New(slog.DiscardHandler),
				Memory: Memory{Off: true},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			page, _ := rt.ListSessions(context.Background(), 100, "")
			if len(page.Sessions) != c.want || page.Sessions[0].ID != ids[total-1] || page.Sessions[c.want-1].ID != ids[total-c.want] {
				t.Fatalf("restored %d sessions", len(page.Sessions))
			}
			// Per restored session: its index entry, one listing of its
			// folder and the three keys in it (head, metadata, batch);
			// plus the index listing, one entry read past the cap, and the
			// reminders' hydration listing.
			ops, listed := cnt.ops.Load(), cnt.listed.Load()
			t.Logf("%d store operations, %d listed entries for %d sessions restored out of %d", ops, listed, c.want, total)
			if bound := int64(5*c.want + 5); ops+listed > bound {
				t.Errorf("%d operations and %d listed entries: more than %d, the caps' bound", ops, listed, bound)
			}
		})
	}
}

func TestSessionIndexKeyOrder(t *testing.T) {
	scope, _ := keys.Agent("a")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	older, _ := scope.SessionIndex(t0, "x")
	newer, _ := scope.SessionIndex(t0.Add(time.Nanosecond), "a/b")
	if newer >= older {
		t.Errorf("newer %q does not sort before older %q", newer, older)
	}
	at, seg, ok := keys.ParseSessionIndex(scope.SessionIndexPrefix(), newer)
	if !ok || !at.Equal(t0.Add(time.Nanosecond)) || seg != "a%2Fb" {
		t.Errorf("parsed %v %q %v", at, seg, ok)
	}
	for _, bad := range []string{"agentkit/v1/a/session-index/123/x", "agentkit/v1/a/session-index/00000000000000000001", "other"} {
		if _, _, ok := keys.ParseSessionIndex(scope.SessionIndexPrefix(), bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

// TestTheEmbeddedStoreCommitsInTheEventsWrite: with the embedded default
// store, the bound store runs inside the session database's write
// (kv.TxViewer), and a turn's commit goes with its events without the
// mirror saying it could not.
func TestTheEmbeddedStoreCommitsInTheEventsWrite(t *testing.T) {
	ctx := context.Background()
	echo, _ := model.NewEcho(nil)
	logs := &errorLog{}
	r, err := Open(ctx, Config{Agent: Agent{Name: "a", Model: echo}, StateRoot: t.TempDir(), Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.embedded == nil {
		t.Fatal("the runtime does not run on the embedded default store")
	}
	err = r.db.Write(ctx, func(tx *sessiondb.Tx) error {
		db, err := r.txStore(tx)
		if err != nil {
			return err
		}
		if db.Name() != r.binding.DB().Name() || !db.Capabilities().Batch {
			t.Errorf("the store in the write is %q %+v; want the bound store %q with its batch", db.Name(), db.Capabilities(), r.binding.DB().Name())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the bound store inside the session database's write: %v", err)
	}
	res, err := r.StartSession(ctx, StartRequest{Message: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.agentStore.Sessions().Load(ctx, res.SessionID, storage.BatchRef{}); err != nil {
		t.Errorf("the store has no head for the session: %v", err)
	}
	if n := logs.count.Load(); n != 0 {
		t.Errorf("%d error logs: %s", n, logs.last.Load())
	}
	if _, backlog, _ := r.path.stats(); backlog != 0 {
		t.Errorf("the mirror owes %d sessions", backlog)
	}
}

// errorLog counts error records.
type errorLog struct {
	count atomic.Int64
	last  atomic.Value
}

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	h.count.Add(1)
	h.last.Store(r.Message)
	return nil
}
func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLog) WithGroup(string) slog.Handler      { return h }
