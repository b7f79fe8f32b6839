package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"iter"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/internal/testenv"
	"agentkit/internal/testenv/natstest"
	"agentkit/internal/testenv/pgtest"
	"agentkit/internal/testenv/redistest"
	"agentkit/kv"
	_ "agentkit/kv/natskv"
	_ "agentkit/kv/pgkv"
	_ "agentkit/kv/rediskv"
	_ "agentkit/kv/sqlitekv"
)

// backend is a real store the ledger's protocol test and benchmarks run on:
// open gives a new client (its own connections, as another host would
// have) on one namespace made for the test and removed after it.
type backend struct {
	name string
	open func(t testing.TB) *kv.DB
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openOrSkip opens u, or reports the server unavailable (a failure in CI).
func openOrSkip(t testing.TB, what, howto, u string) *kv.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := kv.Open(ctx, u)
	if err == nil {
		_, _, err = db.GetWithVersion(ctx, "agentkit/v1/probe")
		if errors.Is(err, kv.ErrNotFound) {
			err = nil
		}
	}
	if err != nil {
		testenv.Unavailable(t, what, howto, err)
	}
	return db
}

func postgresBackend(t testing.TB) backend {
	u := pgtest.TableURL(t)
	return backend{"postgres", func(t testing.TB) *kv.DB { return openClient(t, u) }}
}

func redisBackend(t testing.TB) backend {
	u := redistest.URL(t, "ledgertest-")
	return backend{"redis", func(t testing.TB) *kv.DB { return openClient(t, u) }}
}

func natsBackend(t testing.TB) backend {
	u := natstest.URL(t, "ledgertest_")
	first := openOrSkip(t, "NATS with JetStream", natstest.Howto, u)
	t.Cleanup(func() { first.Close() })
	return backend{"nats", func(t testing.TB) *kv.DB { return openClient(t, u) }}
}

func sqliteBackend(t testing.TB) backend {
	u := "sqlite:" + filepath.Join(t.TempDir(), "kv.db")
	first := openOrSkip(t, "SQLite", "", u)
	t.Cleanup(func() { first.Close() })
	return backend{"sqlite", func(t testing.TB) *kv.DB { return openClient(t, u) }}
}

func openClient(t testing.TB, u string) *kv.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := kv.Open(ctx, u)
	if err != nil {
		t.Fatalf("open a client: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

var backends = []struct {
	name string
	make func(testing.TB) backend
}{
	{"postgres", postgresBackend},
	{"redis", redisBackend},
	{"nats", natsBackend},
	{"sqlite", sqliteBackend},
}

// gate wraps a real store for one host so a test can freeze the host (its
// calls wait) or kill it (its calls fail and land nowhere).
type gate struct {
	db     *kv.DB
	dead   atomic.Bool
	mu     sync.Mutex
	until  time.Time
	wakeup chan struct{}
}

var (
	_ kv.Store = (*gate)(nil)
	_ kv.CAS   = (*gate)(nil)
)

var errKilled = errors.New("host killed")

func (g *gate) freeze(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.until = time.Now().Add(d)
	g.wakeup = make(chan struct{})
	w := g.wakeup
	time.AfterFunc(d, func() { close(w) })
}

func (g *gate) enter() error {
	g.mu.Lock()
	w, until := g.wakeup, g.until
	g.mu.Unlock()
	if w != nil && time.Now().Before(until) {
		<-w
	}
	if g.dead.Load() {
		return errKilled
	}
	return nil
}

func (g *gate) Put(ctx context.Context, k string, v []byte) error {
	if err := g.enter(); err != nil {
		return err
	}
	return g.db.Put(ctx, k, v)
}

func (g *gate) Get(ctx context.Context, k string) ([]byte, error) {
	if err := g.enter(); err != nil {
		return nil, err
	}
	return g.db.Get(ctx, k)
}

func (g *gate) Delete(ctx context.Context, k string) error {
	if err := g.enter(); err != nil {
		return err
	}
	return g.db.Delete(ctx, k)
}

func (g *gate) List(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
	if err := g.enter(); err != nil {
		return func(yield func(kv.Entry, error) bool) { yield(kv.Entry{}, err) }
	}
	return g.db.List(ctx, p)
}

func (g *gate) GetWithVersion(ctx context.Context, k string) ([]byte, kv.Version, error) {
	if err := g.enter(); err != nil {
		return nil, "", err
	}
	return g.db.GetWithVersion(ctx, k)
}

func (g *gate) PutIfAbsent(ctx context.Context, k string, v []byte) (kv.Version, error) {
	if err := g.enter(); err != nil {
		return "", err
	}
	return g.db.PutIfAbsent(ctx, k, v)
}

func (g *gate) PutIfVersion(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
	if err := g.enter(); err != nil {
		return "", err
	}
	return g.db.PutIfVersion(ctx, k, v, e)
}

func (g *gate) ListKeys(ctx context.Context, p string) iter.Seq2[string, error] {
	if err := g.enter(); err != nil {
		return func(yield func(string, error) bool) { yield("", err) }
	}
	return g.db.ListKeys(ctx, p)
}
