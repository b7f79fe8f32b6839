package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/internal/testenv/pgtest"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	_ "agentkit/kv/pgkv"
	"agentkit/record"
	"agentkit/storage"
)

// hooked is one host's handle on a shared store: every operation passes
// through before, which a test uses to pause a host between two steps or
// to make a write land and lose its answer.
type hooked struct {
	db     *kv.DB
	mu     sync.Mutex
	before func(op kv.Op, key string) error // nil: pass
	lost   func(op kv.Op, key string) bool  // true: apply the write, then fail
	// twice, when set, makes a write matching it apply and then run again,
	// returning the second outcome: a driver that retried after a lost
	// answer, whose retry finds its own first write.
	twice func(op kv.Op, key string) bool
}

var errLostAnswer = errors.New("connection reset after the write was sent")

// opReadDone is the hook's op once a GetWithVersion has read its value.
const opReadDone kv.Op = "get_with_version done"

func (h *hooked) hook(op kv.Op, key string) error {
	h.mu.Lock()
	f := h.before
	h.mu.Unlock()
	if f != nil {
		return f(op, key)
	}
	return nil
}

func (h *hooked) isLost(op kv.Op, key string) bool {
	h.mu.Lock()
	f := h.lost
	h.mu.Unlock()
	return f != nil && f(op, key)
}

func (h *hooked) set(before func(kv.Op, string) error, lost func(kv.Op, string) bool) {
	h.mu.Lock()
	h.before, h.lost = before, lost
	h.mu.Unlock()
}

func (h *hooked) funcs() kv.Funcs {
	db := h.db
	write := func(op kv.Op, key string, do func() error) error {
		if err := h.hook(op, key); err != nil {
			return err
		}
		err := do()
		if err == nil && h.isLost(op, key) {
			return errLostAnswer
		}
		h.mu.Lock()
		twice := h.twice
		h.mu.Unlock()
		if err == nil && twice != nil && twice(op, key) {
			return do()
		}
		return err
	}
	return kv.Funcs{
		Put: func(ctx context.Context, k string, v []byte) error {
			return write(kv.OpPut, k, func() error { return db.Put(ctx, k, v) })
		},
		Get: func(ctx context.Context, k string) ([]byte, error) {
			if err := h.hook(kv.OpGet, k); err != nil {
				return nil, err
			}
			return db.Get(ctx, k)
		},
		Delete: func(ctx context.Context, k string) error {
			return write(kv.OpDelete, k, func() error { return db.Delete(ctx, k) })
		},
		List: func(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
			return db.List(ctx, p)
		},
		CAS: kv.CASFuncs{
			GetWithVersion: func(ctx context.Context, k string) ([]byte, kv.Version, error) {
				if err := h.hook(kv.OpGetWithVersion, k); err != nil {
					return nil, "", err
				}
				v, ver, err := db.GetWithVersion(ctx, k)
				if herr := h.hook(opReadDone, k); herr != nil {
					return nil, "", herr
				}
				return v, ver, err
			},
			PutIfAbsent: func(ctx context.Context, k string, v []byte) (kv.Version, error) {
				var ver kv.Version
				err := write(kv.OpPutIfAbsent, k, func() (err error) { ver, err = db.PutIfAbsent(ctx, k, v); return err })
				return ver, err
			},
			PutIfVersion: func(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
				var ver kv.Version
				err := write(kv.OpPutIfVersion, k, func() (err error) { ver, err = db.PutIfVersion(ctx, k, v, e); return err })
				return ver, err
			},
			ListKeys: db.ListKeys,
		},
	}
}

// host is one host's view of the agent "a" in a shared store.
type host struct {
	*hooked
	s    *storage.Sessions
	name string
}

// batchMode makes newHost give its hosts the batch capability (set by
// sharedStores for its batch subtests).
var batchMode bool

func newHost(t *testing.T, shared *kv.DB, name string) *host {
	t.Helper()
	h := &hooked{db: shared}
	var backend any = h.funcs()
	if batchMode {
		backend = batchBackend{h: h, f: h.funcs()}
	}
	b := define(t, storage.Config{Backend: backend, Name: name})
	if b.Capabilities().Batch != batchMode {
		t.Fatalf("the host's store has the batch capability %v; want %v", b.Capabilities().Batch, batchMode)
	}
	return &host{hooked: h, s: agent(t, b, "a").Sessions(), name: name}
}

// batchBackend is a hooked store with the batch capability: the methods of
// its funcs, and WriteBatch, which passes every op of the batch through
// the hooks (a pause or a failure happens before anything is applied),
// then applies the batch atomically on the shared store; a lost answer or
// a second run applies to the whole batch.
type batchBackend struct {
	h *hooked
	f kv.Funcs
}

func (b batchBackend) Put(ctx context.Context, k string, v []byte) error { return b.f.Put(ctx, k, v) }
func (b batchBackend) Get(ctx context.Context, k string) ([]byte, error) { return b.f.Get(ctx, k) }
func (b batchBackend) Delete(ctx context.Context, k string) error        { return b.f.Delete(ctx, k) }
func (b batchBackend) List(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
	return b.f.List(ctx, p)
}
func (b batchBackend) GetWithVersion(ctx context.Context, k string) ([]byte, kv.Version, error) {
	return b.f.CAS.GetWithVersion(ctx, k)
}
func (b batchBackend) PutIfAbsent(ctx context.Context, k string, v []byte) (kv.Version, error) {
	return b.f.CAS.PutIfAbsent(ctx, k, v)
}
func (b batchBackend) PutIfVersion(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
	return b.f.CAS.PutIfVersion(ctx, k, v, e)
}
func (b batchBackend) ListKeys(ctx context.Context, p string) iter.Seq2[string, error] {
	return b.f.CAS.ListKeys(ctx, p)
}

func (b batchBackend) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	opOf := map[kv.BatchKind]kv.Op{kv.BatchPut: kv.OpPut, kv.BatchPutIfAbsent: kv.OpPutIfAbsent, kv.BatchPutIfVersion: kv.OpPutIfVersion, kv.BatchDelete: kv.OpDelete}
	for _, op := range ops {
		if err := b.h.hook(opOf[op.Kind], op.Key); err != nil {
			return nil, err
		}
	}
	vers, err := b.h.db.WriteBatch(ctx, ops)
	if err != nil {
		return nil, unwrapKV(err)
	}
	b.h.mu.Lock()
	twice := b.h.twice
	b.h.mu.Unlock()
	for _, op := range ops {
		if b.h.isLost(opOf[op.Kind], op.Key) {
			return nil, errLostAnswer
		}
		if twice != nil && twice(opOf[op.Kind], op.Key) {
			vers, err := b.h.db.WriteBatch(ctx, ops)
			return vers, unwrapKV(err)
		}
	}
	return vers, nil
}

// unwrapKV returns the driver's error inside a *kv.Error, as a backend
// returns it (the *DB wrapping this backend adds its own).
func unwrapKV(err error) error {
	var ke *kv.Error
	if errors.As(err, &ke) {
		return ke.Err
	}
	return err
}

// events returns events with sequence numbers from..to, tagged with who
// wrote them.
func events(who string, from, to int64) []json.RawMessage {
	var out []json.RawMessage
	for i := from; i <= to; i++ {
		out = append(out, json.RawMessage(fmt.Sprintf(`{"seq":%d,"by":%q}`, i, who)))
	}
	return out
}

func request(h *host, id string, base storage.BatchRef, baseSeq int64, n int64) storage.CommitRequest {
	return storage.CommitRequest{
		Writer: h.name, Base: base, BatchID: storage.NewBatchID(),
		Meta:   storage.SessionMeta{ID: id, ChannelID: "http", LastSeq: baseSeq + n, TokenDigest: keys.TokenDigest("tok-" + id), UpdatedAt: time.Unix(1700000000+baseSeq+n, 0).UTC()},
		Events: events(h.name, baseSeq+1, baseSeq+n),
	}
}

func commit(t *testing.T, h *host, req storage.CommitRequest) storage.CommitResult {
	t.Helper()
	res, err := h.s.Commit(context.Background(), req)
	if err != nil {
		t.Fatalf("%s: Commit: %v", h.name, err)
	}
	return res
}

// history loads the session from scratch and returns its events as
// "by:seq" strings.
func history(t *testing.T, h *host, id string) []string {
	t.Helper()
	l, err := h.s.Load(context.Background(), id, storage.BatchRef{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	var out []string
	for _, b := range l.Batches {
		for _, e := range b.Events {
			var ev struct {
				Seq int64
				By  string
			}
			if err := json.Unmarshal(e, &ev); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%s:%d", ev.By, ev.Seq))
		}
	}
	return out
}

func want(parts ...string) []string { return parts }

// sharedStores runs f on a memory store and on PostgreSQL, each with
// hosts that write one op at a time and with hosts that have the batch
// capability (batchMode).
func sharedStores(t *testing.T, f func(t *testing.T, shared func() *kv.DB)) {
	for _, mode := range []struct {
		name  string
		batch bool
	}{{"one-by-one", false}, {"batch", true}} {
		t.Run(mode.name, func(t *testing.T) {
			batchMode = mode.batch
			defer func() { batchMode = false }()
			sharedStoresOnce(t, f)
		})
	}
}

func sharedStoresOnce(t *testing.T, f func(t *testing.T, shared func() *kv.DB)) {
	t.Run("mem", func(t *testing.T) {
		db := memkv.New()
		f(t, func() *kv.DB { return db })
	})
	t.Run("postgres", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db, err := kv.Open(ctx, pgtest.TableURL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		f(t, func() *kv.DB { return db })
	})
}

func TestCommitChainsBatchesAndLoadFollowsThem(t *testing.T) {
	h := newHost(t, memkv.New(), "A")
	var base storage.BatchRef
	var seq int64
	for i := range 3 {
		res := commit(t, h, request(h, "s1", base, seq, int64(i+1)))
		if res.Outcome != storage.Committed || res.Batch.Number != int64(i+1) {
			t.Fatalf("commit %d: %+v", i, res)
		}
		base, seq = res.Batch, seq+int64(i+1)
	}
	if got := history(t, h, "s1"); !slices.Equal(got, want("A:1", "A:2", "A:3", "A:4", "A:5", "A:6")) {
		t.Errorf("history %q", got)
	}
	l, err := h.s.Load(context.Background(), "s1", storage.BatchRef{Number: 2})
	if err != nil || len(l.Batches) != 1 || l.Batches[0].Number != 3 || l.Head.LastSeq != 6 || l.Head.Writer != "A" || l.Diverged {
		t.Errorf("Load after batch 2: %+v %v", l, err)
	}
	l, err = h.s.Load(context.Background(), "s1", base)
	if err != nil || len(l.Batches) != 0 {
		t.Errorf("Load at the head: %+v %v", l, err)
	}
	if _, err := h.s.Load(context.Background(), "nope", storage.BatchRef{}); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Load of a session the store lacks: %v", err)
	}
}

// TestAnOlderHostNeverOverwritesNewerBatches is the failover case: A
// commits, B takes over and commits, A comes back with its old copy.
func TestAnOlderHostNeverOverwritesNewerBatches(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
		r1 := commit(t, a, request(a, "s1", storage.BatchRef{}, 0, 3))
		// B loads the session and commits turn 2.
		l, err := b.s.Load(context.Background(), "s1", storage.BatchRef{})
		if err != nil || len(l.Batches) != 1 {
			t.Fatalf("B's load: %+v %v", l, err)
		}
		r2 := commit(t, b, request(b, "s1", l.Head.Tip(), 3, 3))
		if r2.Outcome != storage.Committed {
			t.Fatalf("B: %+v", r2)
		}
		// A, still at batch 1, commits its own turn 2: it must lose.
		r3 := commit(t, a, request(a, "s1", r1.Batch, 3, 3))
		if r3.Outcome != storage.Behind || r3.Head.BatchID != r2.Batch.ID || r3.Head.Writer != "B" {
			t.Fatalf("A's stale commit: %+v; want Behind with B's head", r3)
		}
		if got := history(t, a, "s1"); !slices.Equal(got, want("A:1", "A:2", "A:3", "B:4", "B:5", "B:6")) {
			t.Errorf("history after A's stale commit %q", got)
		}
	})
}

// pauseAt makes the host block at its first op on a key with the suffix
// until release is closed; reached is closed when it gets there.
func pauseAt(h *host, op kv.Op, suffix string) (reached, release chan struct{}) {
	reached, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.set(func(o kv.Op, key string) error {
		if o == op && strings.HasSuffix(key, suffix) {
			hit := false
			once.Do(func() { hit = true })
			if hit {
				close(reached)
				<-release
			}
		}
		return nil
	}, nil)
	return reached, release
}

// reach waits for a paused host to get to its pause point.
func reach(t *testing.T, reached chan struct{}, what string) {
	t.Helper()
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never got to its pause point", what)
	}
}

type commitOut struct {
	res storage.CommitResult
	err error
}

func commitAsync(h *host, req storage.CommitRequest) chan commitOut {
	ch := make(chan commitOut, 1)
	go func() {
		res, err := h.s.Commit(context.Background(), req)
		ch <- commitOut{res, err}
	}()
	return ch
}

// TestRacingCommitsOneWinsAndTheLoserWritesNothingTheWinnerNeeds runs two
// hosts from the same base and interleaves their steps.
func TestRacingCommitsOneWinsAndTheLoserWritesNothingTheWinnerNeeds(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		for _, c := range []struct {
			name      string
			pauseOp   kv.Op
			pauseKey  string
			winner    string
			wantChain []string
		}{
			// A has written its batch 2 and pauses before the head; B
			// finds 2 taken, writes 3, and wins the head.
			{"A paused before its head write", kv.OpPutIfVersion, "/head", "B", want("A:1", "B:2", "B:3")},
			// A pauses before its batch write; B writes batch 2 and the
			// head; A then finds the head moved.
			{"A paused before its batch write", kv.OpPutIfAbsent, "/events/00000000000000000002", "B", want("A:1", "B:2", "B:3")},
			// A pauses after reading the head; B commits; A's batch write
			// takes number 3 and its head write loses.
			{"A paused after reading the head", opReadDone, "/head", "B", want("A:1", "B:2", "B:3")},
		} {
			t.Run(c.name, func(t *testing.T) {
				id := "s-" + storage.NewBatchID()[:8]
				a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
				r1 := commit(t, a, request(a, id, storage.BatchRef{}, 0, 1))
				reached, release := pauseAt(a, c.pauseOp, c.pauseKey)
				done := commitAsync(a, request(a, id, r1.Batch, 1, 2))
				reach(t, reached, "A")
				rb := commit(t, b, request(b, id, r1.Batch, 1, 2))
				close(release)
				ra := <-done
				if ra.err != nil {
					t.Fatalf("A: %v", ra.err)
				}
				if rb.Outcome != storage.Committed || ra.res.Outcome != storage.Behind {
					t.Fatalf("A %v, B %v; want B committed and A behind", ra.res.Outcome, rb.Outcome)
				}
				if got := history(t, a, id); !slices.Equal(got, c.wantChain) {
					t.Errorf("history %q, want %q", got, c.wantChain)
				}
				// The loser removed its unlinked batch: the session holds
				// the two batches of the chain only.
				var batchKeys []string
				for k, err := range shared().ListKeys(context.Background(), "agentkit/v1/a/sessions/"+id+"/events/") {
					if err != nil {
						t.Fatal(err)
					}
					batchKeys = append(batchKeys, k)
				}
				if len(batchKeys) != 2 {
					t.Errorf("batch keys %q; want the two the head links", batchKeys)
				}
			})
		}
	})
}

// TestHeadRaceWonByTheFirstBatchWriter pauses B (which found number 2
// taken and wrote 3) before its head write, so A, whose batch 2 came
// first, wins the head; B's batch 3 is removed and B is behind.
func TestHeadRaceWonByTheFirstBatchWriter(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		id := "s-" + storage.NewBatchID()[:8]
		a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
		r1 := commit(t, a, request(a, id, storage.BatchRef{}, 0, 1))
		aReached, aRelease := pauseAt(a, kv.OpPutIfVersion, "/head")
		aDone := commitAsync(a, request(a, id, r1.Batch, 1, 2))
		reach(t, aReached, "A") // A wrote batch 2
		bReached, bRelease := pauseAt(b, kv.OpPutIfVersion, "/head")
		bDone := commitAsync(b, request(b, id, r1.Batch, 1, 2))
		reach(t, bReached, "B") // B wrote batch 3
		close(aRelease)
		ra := <-aDone
		close(bRelease)
		rb := <-bDone
		if ra.err != nil || rb.err != nil || ra.res.Outcome != storage.Committed || rb.res.Outcome != storage.Behind {
			t.Fatalf("A %+v %v, B %+v %v", ra.res, ra.err, rb.res, rb.err)
		}
		if got := history(t, a, id); !slices.Equal(got, want("A:1", "A:2", "A:3")) {
			t.Errorf("history %q", got)
		}
		if _, err := shared().Get(context.Background(), "agentkit/v1/a/sessions/"+id+"/events/00000000000000000003"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("B's unlinked batch 3 is still there: %v", err)
		}
	})
}

// TestLostAnswersAreNeverReportedAsConflicts makes writes land and lose
// their answer, then retries the same request.
func TestLostAnswersAreNeverReportedAsConflicts(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		for _, c := range []struct {
			name  string
			op    kv.Op
			key   string
			other bool // B commits on top before A retries
		}{
			{"head write", kv.OpPutIfVersion, "/head", false},
			{"head write, then another host commits on top", kv.OpPutIfVersion, "/head", true},
			{"batch write", kv.OpPutIfAbsent, "/events/00000000000000000002", false},
			{"first head write", kv.OpPutIfAbsent, "/head", false},
		} {
			t.Run(c.name, func(t *testing.T) {
				id := "s-" + storage.NewBatchID()[:8]
				a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
				base, seq := storage.BatchRef{}, int64(0)
				if c.key != "/head" || c.op != kv.OpPutIfAbsent {
					r1 := commit(t, a, request(a, id, storage.BatchRef{}, 0, 1))
					base, seq = r1.Batch, 1
				}
				var once sync.Once
				a.set(nil, func(op kv.Op, key string) bool {
					hit := false
					if op == c.op && strings.HasSuffix(key, c.key) {
						once.Do(func() { hit = true })
					}
					return hit
				})
				req := request(a, id, base, seq, 2)
				if _, err := a.s.Commit(context.Background(), req); !errors.Is(err, errLostAnswer) {
					t.Fatalf("first attempt: %v; want the lost answer", err)
				}
				var wantHist []string
				for i := int64(1); i <= seq+2; i++ {
					wantHist = append(wantHist, fmt.Sprintf("A:%d", i))
				}
				if c.other {
					l, err := b.s.Load(context.Background(), id, storage.BatchRef{})
					if err != nil {
						t.Fatal(err)
					}
					commit(t, b, request(b, id, l.Head.Tip(), l.Head.LastSeq, 1))
					wantHist = append(wantHist, fmt.Sprintf("B:%d", seq+3))
				}
				req.Retry = true
				res := commit(t, a, req)
				if res.Outcome != storage.Committed || res.Batch.ID != req.BatchID {
					t.Fatalf("retry: %+v; want its own batch committed", res)
				}
				if got := history(t, a, id); !slices.Equal(got, wantHist) {
					t.Errorf("history %q, want %q", got, wantHist)
				}
			})
		}
	})
}

// TestAConflictWithItsOwnWriteIsASuccess: the head write lands and the
// store (or a driver retrying after a lost answer) then reports a
// conflict: Commit reads the head again and reports its own success.
func TestAConflictWithItsOwnWriteIsASuccess(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		id := "s-" + storage.NewBatchID()[:8]
		a := newHost(t, shared(), "A")
		r1 := commit(t, a, request(a, id, storage.BatchRef{}, 0, 1))
		var once sync.Once
		a.mu.Lock()
		a.twice = func(op kv.Op, key string) bool {
			hit := false
			if op == kv.OpPutIfVersion && strings.HasSuffix(key, "/head") {
				once.Do(func() { hit = true })
			}
			return hit
		}
		a.mu.Unlock()
		req := request(a, id, r1.Batch, 1, 1)
		res := commit(t, a, req)
		if res.Outcome != storage.Committed || res.Batch.ID != req.BatchID {
			t.Fatalf("a conflict with its own landed write: %+v; want Committed", res)
		}
		if got := history(t, a, id); !slices.Equal(got, want("A:1", "A:2")) {
			t.Errorf("history %q", got)
		}
	})
}

// TestAKnownHeadSavesAReadAndAStaleOneIsSafe: a commit given the head it
// last wrote skips reading it; given a head another host has moved past,
// it still loses and writes nothing the winner needs.
func TestAKnownHeadSavesAReadAndAStaleOneIsSafe(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		id := "s-" + storage.NewBatchID()[:8]
		a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
		var headReads atomic.Int64
		a.set(func(op kv.Op, key string) error {
			if op == kv.OpGetWithVersion && strings.HasSuffix(key, "/head") {
				headReads.Add(1)
			}
			return nil
		}, nil)
		r1 := commit(t, a, request(a, id, storage.BatchRef{}, 0, 1))
		if r1.Version == "" {
			t.Fatal("Commit returned no head version")
		}
		req := request(a, id, r1.Batch, 1, 1)
		req.Known = &storage.KnownHead{Head: r1.Head, Version: r1.Version}
		headReads.Store(0)
		r2 := commit(t, a, req)
		if r2.Outcome != storage.Committed || headReads.Load() != 0 {
			t.Fatalf("commit with a known head: %v, %d head reads", r2.Outcome, headReads.Load())
		}
		l, err := b.s.Load(context.Background(), id, storage.BatchRef{})
		if err != nil {
			t.Fatal(err)
		}
		commit(t, b, request(b, id, l.Head.Tip(), 2, 1))
		stale := request(a, id, r2.Batch, 2, 1)
		stale.Known = &storage.KnownHead{Head: r2.Head, Version: r2.Version}
		if res := commit(t, a, stale); res.Outcome != storage.Behind {
			t.Fatalf("commit with a stale known head: %+v; want Behind", res)
		}
		if got := history(t, a, id); !slices.Equal(got, want("A:1", "A:2", "B:3")) {
			t.Errorf("history %q", got)
		}
	})
}

func TestDeleteLeavesATombstoneEveryWriterHonours(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		ctx := context.Background()
		id := "s-" + storage.NewBatchID()[:8]
		a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
		r1 := commit(t, a, request(a, id, storage.BatchRef{}, 0, 1))
		if err := a.s.PutToken(ctx, keys.TokenDigest("tok-"+id), id); err != nil {
			t.Fatal(err)
		}
		if err := a.s.PutMeta(ctx, r1.Head.SessionMeta); err != nil {
			t.Fatal(err)
		}
		idx, err := a.s.PutIndex(ctx, r1.Head.SessionMeta)
		if err != nil {
			t.Fatal(err)
		}
		// A pauses before its head write; B deletes the session.
		reached, release := pauseAt(a, kv.OpPutIfVersion, "/head")
		done := commitAsync(a, request(a, id, r1.Batch, 1, 1))
		reach(t, reached, "A")
		tomb := storage.Head{SessionMeta: storage.SessionMeta{ID: id, UpdatedAt: time.Now()}, Writer: "B"}
		if err := b.s.Delete(ctx, tomb, "tok-"+id); err != nil {
			t.Fatal(err)
		}
		close(release)
		ra := <-done
		if ra.err != nil || ra.res.Outcome != storage.Deleted {
			t.Fatalf("A's commit across the delete: %+v %v; want Deleted", ra.res, ra.err)
		}
		var left []string
		for k, err := range shared().ListKeys(ctx, "agentkit/v1/a/") {
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(k, id) {
				left = append(left, k)
			}
		}
		if len(left) != 1 || !strings.HasSuffix(left[0], "/head") {
			t.Errorf("keys left after the delete: %q; want the tombstone only (index %s)", left, idx)
		}
		// Every later path honours the tombstone.
		if _, err := a.s.Load(ctx, id, storage.BatchRef{}); !errors.Is(err, storage.ErrSessionDeleted) {
			t.Errorf("Load: %v", err)
		}
		if res := commit(t, a, request(a, id, r1.Batch, 1, 1)); res.Outcome != storage.Deleted {
			t.Errorf("a later commit: %+v", res)
		}
		if res := commit(t, b, request(b, id, storage.BatchRef{}, 0, 1)); res.Outcome != storage.Deleted {
			t.Errorf("a commit from scratch: %+v", res)
		}
		if _, err := a.s.ResolveToken(ctx, "tok-"+id); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("ResolveToken: %v", err)
		}
		if err := b.s.Delete(ctx, tomb, ""); err != nil {
			t.Errorf("deleting again: %v", err)
		}
	})
}

func TestUnlinkedBatchesAreSkipped(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	a := newHost(t, db, "A")
	r1 := commit(t, a, request(a, "s1", storage.BatchRef{}, 0, 1))
	// A host died after writing batch 2 and before the head.
	dead := storage.Batch{SessionID: "s1", Number: 2, ID: "dead", Prev: 1, PrevID: r1.Batch.ID, Events: events("dead", 2, 2)}
	data, _ := record.Marshal(storage.KindEventBatch, dead)
	if err := db.Put(ctx, "agentkit/v1/a/sessions/s1/events/00000000000000000002", data); err != nil {
		t.Fatal(err)
	}
	res := commit(t, a, request(a, "s1", r1.Batch, 1, 1))
	if res.Outcome != storage.Committed || res.Batch.Number != 3 {
		t.Fatalf("commit over an unlinked batch: %+v", res)
	}
	if got := history(t, a, "s1"); !slices.Equal(got, want("A:1", "A:2")) {
		t.Errorf("history %q", got)
	}
}

// limited is a store with a value limit it reports, like NATS's driver.
type limited struct {
	*memkv.Store
	limit int
}

func (l limited) MaxValueSize() int { return l.limit }

func (l limited) Put(ctx context.Context, k string, v []byte) error {
	if len(v) > l.limit {
		return fmt.Errorf("%w: %d bytes", kv.ErrTooLarge, len(v))
	}
	return l.Store.Put(ctx, k, v)
}

func (l limited) PutIfAbsent(ctx context.Context, k string, v []byte) (kv.Version, error) {
	if len(v) > l.limit {
		return "", fmt.Errorf("%w: %d bytes", kv.ErrTooLarge, len(v))
	}
	return l.Store.PutIfAbsent(ctx, k, v)
}

func (l limited) PutIfVersion(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
	if len(v) > l.limit {
		return "", fmt.Errorf("%w: %d bytes", kv.ErrTooLarge, len(v))
	}
	return l.Store.PutIfVersion(ctx, k, v, e)
}

func TestLargeBatchesAreStoredInParts(t *testing.T) {
	ctx := context.Background()
	store := limited{memkv.NewStore(), 64 << 10}
	b := define(t, storage.Config{Backend: store})
	s := agent(t, b, "a").Sessions()
	big := strings.Repeat("x", 200<<10)
	evs := []json.RawMessage{json.RawMessage(`{"seq":1}`), json.RawMessage(fmt.Sprintf(`{"seq":2,"output":%q}`, big))}
	req := storage.CommitRequest{Writer: "A", BatchID: storage.NewBatchID(), Meta: storage.SessionMeta{ID: "s1", LastSeq: 2}, Events: evs}
	res, err := s.Commit(ctx, req)
	if err != nil || res.Outcome != storage.Committed {
		t.Fatalf("Commit of a %d-byte batch over a %d-byte limit: %+v %v", len(big), store.limit, res, err)
	}
	var parts int
	for e, err := range store.List(ctx, "agentkit/v1/a/sessions/s1/") {
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(e.Key, "/parts/"+req.BatchID+"/") {
			parts++
		}
		if strings.HasSuffix(e.Key, "/events/00000000000000000001") && !strings.HasPrefix(string(e.Value), `{"v":2,`) {
			t.Errorf("a batch in parts is not format version 2: %.40s", e.Value)
		}
	}
	if parts < 4 {
		t.Errorf("%d parts for a %d-byte batch", parts, len(big))
	}
	l, err := s.Load(ctx, "s1", storage.BatchRef{})
	if err != nil || len(l.Batches) != 1 || len(l.Batches[0].Events) != 2 || string(l.Batches[0].Events[1]) != string(evs[1]) {
		t.Fatalf("Load of the batch in parts: %v", err)
	}
	// A damaged part, even one of the same length that still decodes, is
	// an error, never a silently different batch.
	key := fmt.Sprintf("agentkit/v1/a/sessions/s1/parts/%s/%020d", req.BatchID, 2)
	part, err := store.Store.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Store.Put(ctx, key, []byte(strings.ReplaceAll(string(part), "x", "y"))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx, "s1", storage.BatchRef{}); !errors.Is(err, storage.ErrBadRecord) {
		t.Errorf("Load with a damaged part: %v", err)
	}
}

// TestSessionsFromBeforeHeads reads and extends a session written by a
// build without heads: metadata and batches by number, no ids.
func TestSessionsFromBeforeHeads(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	put := func(k, v string) {
		if err := db.Put(ctx, "agentkit/v1/a/sessions/s1/"+k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	put("meta", `{"v":1,"id":"s1","channelId":"http","createdAt":"2026-01-01T00:00:00Z","updatedAt":"2026-01-01T00:00:00Z","turns":2,"lastSeq":2,"batches":3,"continuationToken":"t"}`)
	put("events/00000000000000000001", `{"v":1,"sessionId":"s1","batch":1,"events":[{"seq":1,"by":"old"}]}`)
	// batch 2 was a dropped write
	put("events/00000000000000000003", `{"v":1,"sessionId":"s1","batch":3,"events":[{"seq":2,"by":"old"}]}`)
	a := newHost(t, db, "A")
	if got := history(t, a, "s1"); !slices.Equal(got, want("old:1", "old:2")) {
		t.Errorf("legacy history %q", got)
	}
	if res := commit(t, a, request(a, "s1", storage.BatchRef{Number: 1}, 1, 1)); res.Outcome != storage.Behind {
		t.Errorf("commit on a stale legacy copy: %+v", res)
	}
	res := commit(t, a, request(a, "s1", storage.BatchRef{Number: 3}, 2, 1))
	if res.Outcome != storage.Committed || res.Batch.Number != 4 {
		t.Fatalf("commit on the legacy tip: %+v", res)
	}
	if got := history(t, a, "s1"); !slices.Equal(got, want("old:1", "old:2", "A:3")) {
		t.Errorf("history after the first commit with a head %q", got)
	}
}

func TestNewerRecordsAreRefused(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	a := newHost(t, db, "A")
	db.Put(ctx, "agentkit/v1/a/sessions/s1/head", []byte(`{"v":4,"id":"s1"}`)) // newer than this build's 3
	if _, err := a.s.Load(ctx, "s1", storage.BatchRef{}); !errors.Is(err, storage.ErrNewerFormat) || !strings.Contains(err.Error(), "upgrade agentkit") {
		t.Errorf("a newer head: %v", err)
	}
	db.Put(ctx, "agentkit/v1/a/sessions/s2/meta", []byte(`{"v":1,"id":"s2","batches":1}`))
	db.Put(ctx, "agentkit/v1/a/sessions/s2/events/00000000000000000001", []byte(`{"v":3,"sessionId":"s2","batch":1}`))
	if _, err := a.s.Load(ctx, "s2", storage.BatchRef{}); !errors.Is(err, storage.ErrNewerFormat) {
		t.Errorf("a newer batch: %v", err)
	}
}

func TestListIndexGoesOnPastABadEntry(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	s := agent(t, define(t, storage.Config{Backend: db}), "a").Sessions()
	for i, at := range []time.Time{time.Unix(100, 0), time.Unix(300, 0)} {
		if _, err := s.PutIndex(ctx, storage.SessionMeta{ID: fmt.Sprint("s", i), UpdatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	bad, _ := s.IndexKey("bad", time.Unix(200, 0))
	db.Put(ctx, bad, []byte("not json"))
	var ids []string
	var bads int
	for e, err := range s.ListIndex(ctx) {
		switch {
		case storage.IsRecordError(err):
			bads++
		case err != nil:
			t.Fatal(err)
		default:
			ids = append(ids, e.Meta.ID)
		}
	}
	if !slices.Equal(ids, []string{"s1", "s0"}) || bads != 1 {
		t.Errorf("index %q with %d bad entries", ids, bads)
	}
}

// TestCopiesAreWrittenExactlyWithTheHead: with the batch capability a
// commit's copies (metadata, index entry, token; the previous index entry
// removed) land in the head's batch, and a commit that loses the head
// writes none of them; without it Commit leaves them to the caller.
func TestCopiesAreWrittenExactlyWithTheHead(t *testing.T) {
	sharedStores(t, func(t *testing.T, shared func() *kv.DB) {
		ctx := context.Background()
		id := "s-" + storage.NewBatchID()[:8]
		a, b := newHost(t, shared(), "A"), newHost(t, shared(), "B")
		req := request(a, id, storage.BatchRef{}, 0, 1)
		req.Copies = &storage.Copies{TokenDigest: keys.TokenDigest("tok-" + id)}
		r1 := commit(t, a, req)
		if r1.Copied != batchMode {
			t.Fatalf("Copied %v on a store with batch capability %v", r1.Copied, batchMode)
		}
		prefix := "agentkit/v1/a/"
		keysNow := func() []string {
			var out []string
			for k, err := range shared().ListKeys(ctx, prefix) {
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(k, id) {
					out = append(out, strings.TrimPrefix(k, prefix))
				}
			}
			return out
		}
		if !batchMode {
			if got := keysNow(); len(got) != 2 {
				t.Errorf("keys after a one-by-one commit: %q; want the batch and the head only", got)
			}
			return
		}
		indexKey, _ := a.s.IndexKey(id, req.Meta.UpdatedAt)
		if r1.IndexKey != indexKey {
			t.Errorf("the result names index entry %q; want %q", r1.IndexKey, indexKey)
		}
		if m, _, err := a.s.ReadMeta(ctx, id); err != nil || m.Batches != 1 || m.LastSeq != 1 {
			t.Errorf("the metadata copy: %+v %v; want batch 1, last event 1", m, err)
		}
		if got, err := a.s.ResolveToken(ctx, "tok-"+id); err != nil || got != id {
			t.Errorf("the token: %q %v", got, err)
		}
		// B commits on top; A's commit from the old base loses and leaves
		// no copy of its own.
		l, err := b.s.Load(ctx, id, storage.BatchRef{})
		if err != nil {
			t.Fatal(err)
		}
		rb := request(b, id, l.Head.Tip(), 1, 1)
		rb.Copies = &storage.Copies{PrevIndexKey: r1.IndexKey}
		if res := commit(t, b, rb); res.Outcome != storage.Committed || !res.Copied {
			t.Fatalf("B: %+v", res)
		}
		before := keysNow()
		ra := request(a, id, r1.Batch, 1, 5)
		ra.Copies = &storage.Copies{PrevIndexKey: r1.IndexKey}
		if res := commit(t, a, ra); res.Outcome != storage.Behind || res.Copied {
			t.Fatalf("A from the old base: %+v; want Behind, nothing copied", res)
		}
		if after := keysNow(); !slices.Equal(before, after) {
			t.Errorf("the losing commit changed the keys: %q -> %q", before, after)
		}
		if m, _, err := a.s.ReadMeta(ctx, id); err != nil || m.LastSeq != 2 {
			t.Errorf("the metadata after A lost: %+v %v; want B's (last event 2)", m, err)
		}
		// B's commit moved the index entry: one entry for the session.
		var entries int
		for e, err := range a.s.ListIndex(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			if e.Meta.ID == id {
				entries++
			}
		}
		if entries != 1 {
			t.Errorf("%d index entries for the session; want 1 (the previous removed)", entries)
		}
	})
}
