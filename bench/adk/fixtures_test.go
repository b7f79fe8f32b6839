package adkbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/pgkv"
)

// defaultServer is the PostgreSQL server used unless
// AGENTKIT_TEST_POSTGRES names another (the same variable as kv/pgkv's
// tests).
const defaultServer = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// runID makes this process's PostgreSQL schemas and tables unique, so
// concurrent runs do not collide.
var runID = func() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}()

var (
	serverOnce sync.Once
	serverErr  error
)

// pgServer returns the PostgreSQL URL, or skips (fails in CI) when the
// server is not reachable.
func pgServer(tb testing.TB) string {
	tb.Helper()
	u := testenv.Getenv("AGENTKIT_TEST_POSTGRES", defaultServer)
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var conn *pgx.Conn
		if conn, serverErr = pgx.Connect(ctx, u); serverErr == nil {
			serverErr = conn.Ping(ctx)
			conn.Close(ctx)
		}
	})
	if serverErr != nil {
		testenv.Unavailable(tb, "PostgreSQL", "Start one and set AGENTKIT_TEST_POSTGRES to its URL (default "+defaultServer+").", serverErr)
	}
	return u
}

var (
	nameMu  sync.Mutex
	nameSeq int
)

// pgName returns a fresh schema or table name: adkbench_{run}_{what}{n}.
func pgName(what string) string {
	nameMu.Lock()
	defer nameMu.Unlock()
	nameSeq++
	return fmt.Sprintf("adkbench_%s_%s%d", runID, what, nameSeq)
}

// newADK opens a fresh ADK store on db ("sqlite": the file dir/adk/adk.db
// with the journal setting mode; "postgres": a new schema), closed when tb
// ends.
func newADK(tb testing.TB, db, mode, dir string) *adkStore {
	tb.Helper()
	s, err := openADK(context.Background(), tb, db, mode, dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return s
}

func openADK(ctx context.Context, tb testing.TB, db, mode, dir string) (*adkStore, error) {
	if db == "postgres" {
		return openADKPostgres(ctx, pgServer(tb), pgName("adk"))
	}
	// The folder's name tells the two sides' files apart in strace's
	// output (scripts/bench.sh fsyncs).
	if err := os.MkdirAll(filepath.Join(dir, "adk"), 0o755); err != nil {
		return nil, err
	}
	return openADKSQLite(ctx, filepath.Join(dir, "adk", "adk.db"), mode)
}

// newAK opens a fresh agentkit runtime on the state root dir/agentkit/state,
// with its store on db ("sqlite": the default store; "postgres": a new pgkv
// table), closed when tb ends.
func newAK(tb testing.TB, db, dir string) *akRuntime {
	tb.Helper()
	a, err := openAK(context.Background(), tb, db, dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := a.Close(context.Background()); err != nil {
			tb.Error(err)
		}
	})
	return a
}

func openAK(ctx context.Context, tb testing.TB, db, dir string) (*akRuntime, error) {
	root := filepath.Join(dir, "agentkit", "state")
	if db == "postgres" {
		return openAKPostgres(ctx, root, pgServer(tb), pgName("kv"))
	}
	return openAKSQLite(ctx, root)
}

// Fixtures shared by the benchmarks of one process (the filled sessions of
// the load benchmarks), built on first use and released by TestMain.
var fixtures struct {
	sync.Mutex
	dir    string
	values map[string]any
	close  []func(context.Context) error
}

// shared returns the fixture named key, building it on first use. build
// gets a folder of its own and returns the value and how to release it.
func shared[T any](tb testing.TB, key string, build func(ctx context.Context, dir string) (T, func(context.Context) error, error)) T {
	tb.Helper()
	fixtures.Lock()
	defer fixtures.Unlock()
	if v, ok := fixtures.values[key]; ok {
		return v.(T)
	}
	if fixtures.dir == "" {
		d, err := os.MkdirTemp("", "adkbench-")
		if err != nil {
			tb.Fatal(err)
		}
		fixtures.dir = d
		fixtures.values = map[string]any{}
	}
	dir, err := os.MkdirTemp(fixtures.dir, "fixture-")
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	v, release, err := build(context.Background(), dir)
	if err != nil {
		tb.Fatalf("building fixture %s: %v", key, err)
	}
	tb.Logf("fixture %s built in %v", key, time.Since(start).Round(time.Millisecond))
	fixtures.values[key] = v
	fixtures.close = append(fixtures.close, release)
	return v
}

// releaseFixtures closes the shared fixtures, newest first, and removes
// their folder.
func releaseFixtures() error {
	fixtures.Lock()
	defer fixtures.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for i := len(fixtures.close) - 1; i >= 0; i-- {
		errs = append(errs, fixtures.close[i](ctx))
	}
	if fixtures.dir != "" {
		errs = append(errs, os.RemoveAll(fixtures.dir))
	}
	fixtures.values, fixtures.close, fixtures.dir = nil, nil, ""
	return errors.Join(errs...)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := releaseFixtures(); err != nil {
		fmt.Fprintln(os.Stderr, "adkbench: releasing fixtures:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// loadFixture is a session of a given length on one side.
type loadFixture[S any] struct {
	side S
	id   string
}

// adkLoad returns an ADK store on db (SQLite in WAL mode) holding one
// session of n events, in a database of its own (see README: ADK's query
// reads the whole table).
func adkLoad(tb testing.TB, db string, n int) loadFixture[*adkStore] {
	return shared(tb, fmt.Sprintf("adk/%s/%d", db, n), func(ctx context.Context, dir string) (loadFixture[*adkStore], func(context.Context) error, error) {
		s, err := openADK(ctx, tb, db, adkWAL, dir)
		if err != nil {
			return loadFixture[*adkStore]{}, nil, err
		}
		id := fmt.Sprintf("load-%d", n)
		if err := s.fill(ctx, id, n); err != nil {
			return loadFixture[*adkStore]{}, nil, errors.Join(err, s.Close(ctx))
		}
		return loadFixture[*adkStore]{s, id}, s.Close, nil
	})
}

// akLoad returns an agentkit runtime with its store on db holding a
// session of n events. Sessions of every length share the runtime's one
// session database.
func akLoad(tb testing.TB, db string, n int) loadFixture[*akRuntime] {
	a := shared(tb, "agentkit/"+db, func(ctx context.Context, dir string) (*akRuntime, func(context.Context) error, error) {
		a, err := openAK(ctx, tb, db, dir)
		if err != nil {
			return nil, nil, err
		}
		return a, a.Close, nil
	})
	id := shared(tb, fmt.Sprintf("agentkit/%s/%d", db, n), func(ctx context.Context, _ string) (string, func(context.Context) error, error) {
		id, err := a.fill(ctx, n)
		return id, func(context.Context) error { return nil }, err
	})
	return loadFixture[*akRuntime]{a, id}
}

// newAKLog opens the session database dir/agentkit/sessions.db with one
// session, for the append benchmark; on db "postgres" its appends also
// write through to a fresh pgkv table, dropped when tb ends.
func newAKLog(tb testing.TB, db, dir string) *akLog {
	tb.Helper()
	ctx := context.Background()
	var store *kv.DB
	if db == "postgres" {
		var err error
		store, err = pgkv.Open(ctx, pgServer(tb), &pgkv.Options{Table: pgName("kv")})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			if err := errors.Join(store.Backend().(*pgkv.Store).Drop(context.Background()), store.Close()); err != nil {
				tb.Error(err)
			}
		})
	}
	if err := os.MkdirAll(filepath.Join(dir, "agentkit"), 0o755); err != nil {
		tb.Fatal(err)
	}
	l, err := openAKLog(ctx, filepath.Join(dir, "agentkit", sessionsFile), store)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Error(err)
		}
	})
	return l
}
