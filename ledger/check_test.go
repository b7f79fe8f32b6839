package ledger

import (
	"context"
	"errors"
	"iter"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
	_ "agentkit/kv/sqlitekv"
	"agentkit/storage"
)

// durableMem is a memkv store that does not say it is process-local, as a
// stand-in for a durable store in the start-up checks.
type durableMem struct{ s *memkv.Store }

func (d durableMem) core() kv.Funcs {
	return kv.Funcs{Put: d.s.Put, Get: d.s.Get, Delete: d.s.Delete, List: d.s.List}
}

func TestCheckStore(t *testing.T) {
	ctx := context.Background()
	sqlite, err := kv.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sqlite.Close()
	d := durableMem{memkv.NewStore()}
	mustDB := func(b any) *kv.DB {
		db, err := kv.New("custom", b)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	withCAS := func(f kv.Funcs, c kv.CASFuncs) kv.Funcs { f.CAS = c; return f }
	casOf := func(s *memkv.Store) kv.CASFuncs {
		return kv.CASFuncs{GetWithVersion: s.GetWithVersion, PutIfAbsent: s.PutIfAbsent, PutIfVersion: s.PutIfVersion, ListKeys: s.ListKeys}
	}
	noDelete := d.core()
	noDelete.Delete = nil
	for _, tc := range []struct {
		name  string
		store *kv.DB
		allow bool
		is    error
		want  []string
	}{
		{"sqlite", sqlite, false, nil, nil},
		{"memory driver in a test", memkv.New(), true, nil, nil},
		{"nil", nil, false, storage.ErrNoCAS, []string{"nil"}},
		{"no CAS group", mustDB(d.core()), false, storage.ErrNoCAS, []string{"CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys)"}},
		{"no Delete", mustDB(withCAS(noDelete, kv.CASFuncsOf(d.s))), false, storage.ErrNoCAS, []string{"lacks Delete"}},
		{"process-local CAS beside a durable store", mustDB(withCAS(d.core(), kv.CASFuncsOf(memkv.NewStore()))), false, storage.ErrSplitCAS, []string{"process memory"}},
		{"durable plain and CAS of the same store", mustDB(withCAS(d.core(), casOf(d.s))), false, nil, nil},
		// Another store's methods in the CAS group, with no word on where
		// it keeps its data: the probe finds the split.
		{"another store's CAS methods beside a durable store", mustDB(withCAS(d.core(), casOf(memkv.NewStore()))), false, storage.ErrSplitCAS,
			[]string{"the plain methods (Put, Get, Delete, List)", "the CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys)", "not found by GetWithVersion", "not found by Get"}},
		{"memory driver outside tests", memkv.New(), false, ErrMemoryStore, []string{"memory driver", "shared durable store"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckStore(tc.store, tc.allow)
			if tc.is == nil {
				if err != nil {
					t.Fatalf("CheckStore: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.is) {
				t.Fatalf("CheckStore: %v; want %v", err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error %q does not say %q", err, w)
				}
			}
			// Open runs the same check.
			_, oerr := Open(Options{Store: tc.store, Agent: "a", Handler: commitEcho, AllowProcessLocal: tc.allow})
			if !errors.Is(oerr, tc.is) {
				t.Fatalf("Open: %v; want %v", oerr, tc.is)
			}
		})
	}
}

func TestOpenValidatesOptions(t *testing.T) {
	store := memkv.New()
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Store: store, Agent: "a", AllowProcessLocal: true}, "Handler is nil"},
		{Options{Store: store, Handler: commitEcho, AllowProcessLocal: true}, "Agent is empty"},
		{Options{Tuning: Tuning{DriftAllowance: 1}, Store: store, Agent: "a", Handler: commitEcho, AllowProcessLocal: true}, "DriftAllowance is 1"},
		{Options{Tuning: Tuning{MaxPending: -1}, Store: store, Agent: "a", Handler: commitEcho, AllowProcessLocal: true}, "MaxPending is -1"},
	} {
		if _, err := Open(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open: %v; want an error containing %q", err, tc.want)
		}
	}
	l, err := Open(Options{Store: store, Agent: "a", Handler: commitEcho, AllowProcessLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	if l.Lease() != DefaultLease || l.Margin() != DefaultLease/5 || !strings.Contains(l.HostID(), "-") {
		t.Fatalf("defaults: lease %s, margin %s, host %q", l.Lease(), l.Margin(), l.HostID())
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// countingStore counts a backend's calls by kind.
type countingStore struct {
	kv.Store
	kv.CAS
	mu     sync.Mutex
	counts map[string]int
}

func newCounting(s *memkv.Store) *countingStore {
	return &countingStore{Store: s, CAS: s, counts: map[string]int{}}
}

func (c *countingStore) count(op string) {
	c.mu.Lock()
	c.counts[op]++
	c.mu.Unlock()
}

func (c *countingStore) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

func (c *countingStore) reset() {
	c.mu.Lock()
	c.counts = map[string]int{}
	c.mu.Unlock()
}

func (c *countingStore) ProcessLocal() bool { return true }
func (c *countingStore) Put(ctx context.Context, k string, v []byte) error {
	c.count("put")
	return c.Store.Put(ctx, k, v)
}
func (c *countingStore) Delete(ctx context.Context, k string) error {
	c.count("delete")
	return c.Store.Delete(ctx, k)
}
func (c *countingStore) Get(ctx context.Context, k string) ([]byte, error) {
	c.count("get")
	return c.Store.Get(ctx, k)
}
func (c *countingStore) GetWithVersion(ctx context.Context, k string) ([]byte, kv.Version, error) {
	c.count("get")
	return c.CAS.GetWithVersion(ctx, k)
}
func (c *countingStore) PutIfAbsent(ctx context.Context, k string, v []byte) (kv.Version, error) {
	c.count("cas")
	return c.CAS.PutIfAbsent(ctx, k, v)
}
func (c *countingStore) PutIfVersion(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
	c.count("cas")
	return c.CAS.PutIfVersion(ctx, k, v, e)
}
func (c *countingStore) List(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
	c.count("list")
	return c.Store.List(ctx, p)
}
func (c *countingStore) ListKeys(ctx context.Context, p string) iter.Seq2[string, error] {
	c.count("list")
	return c.CAS.ListKeys(ctx, p)
}

// TestStoreCallsPerMessage pins the cost of one message on a session this
// host served last (its control record cached): the acknowledgement is one
// compare-and-set and no read; delivery to release is three
// compare-and-sets and one put (the turn's flush). A payload over
// InlineLimit adds its blob's put and, after the commit, its delete.
func TestStoreCallsPerMessage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload string
		ack     map[string]int
		total   map[string]int
		keyed   bool // keyed events, with a window of 1: each turn keeps the key its event pushes out
	}{
		{"inline payload", `"hi"`, map[string]int{"cas": 1}, map[string]int{"cas": 3, "put": 1}, false},
		{"blob payload", `"` + strings.Repeat("x", 100) + `"`, map[string]int{"cas": 1, "put": 1}, map[string]int{"cas": 3, "put": 2, "delete": 1}, false},
		{"keyed, past the window", `"hi"`, map[string]int{"get": 1, "cas": 1}, map[string]int{"get": 1, "cas": 3, "put": 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counting := newCounting(memkv.NewStore())
			db, err := kv.New("counting", counting)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{}, 1)
			// The worker waits for proceed before its turn, so the calls
			// counted when Deliver returns are the acknowledgement's own,
			// not the acknowledgement's plus whatever the worker has done
			// by then on a loaded machine.
			proceed := make(chan struct{})
			window, warm := 0, 1
			if tc.keyed {
				window, warm = 1, 2
			}
			l, err := Open(Options{Store: db, Agent: "a", AllowProcessLocal: true, InlineLimit: 64, Tuning: Tuning{DedupWindow: window},
				Handler: func(ctx context.Context, tr *Turn) error {
					_, err := tr.Commit(ctx, nil)
					return err
				},
				Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			l.opts.test.step = func(name string) {
				switch name {
				case "turn:start":
					<-proceed
				case "release:after-write":
					done <- struct{}{}
				}
			}
			defer l.Close(context.Background())
			defer close(proceed)
			ctx := context.Background()
			// A first message warms the cache (two fill a window of 1 and
			// keep a key).
			for _, id := range []string{"warm", "warm2"}[:warm] {
				if _, err := l.Deliver(ctx, "s", Event{ID: id, Payload: []byte(tc.payload), Keyed: tc.keyed}); err != nil {
					t.Fatal(err)
				}
				proceed <- struct{}{}
				<-done
			}
			for i := range 3 {
				counting.reset()
				if _, err := l.Deliver(ctx, "s", Event{ID: string(rune('a' + i)), Payload: []byte(tc.payload), Keyed: tc.keyed}); err != nil {
					t.Fatal(err)
				}
				if got := counting.snapshot(); !mapsEqual(got, tc.ack) {
					t.Fatalf("store calls to acknowledge: %v; want %v", got, tc.ack)
				}
				proceed <- struct{}{}
				<-done
				if got := counting.snapshot(); !mapsEqual(got, tc.total) {
					t.Fatalf("store calls from delivery to release: %v; want %v", got, tc.total)
				}
			}
		})
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
