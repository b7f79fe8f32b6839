package sqlitekv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"agentkit/internal/proctest"
	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/kvtest"
)

func TestMain(m *testing.M) {
	proctest.Main(m, map[string]func() error{
		"incr":   childIncrement,
		"writer": childWriter,
		"lister": childLister,
		"crash":  childCrash,
	})
}

func openT(t testing.TB, path string, opts *Options) *kv.DB {
	t.Helper()
	db, err := Open(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func backend(db *kv.DB) *store { return db.Backend().(*store) }

// fastTempDir returns a folder on a tmpfs when there is one
// (SQLITEKV_TEST_TMPFS, default /dev/shm). The conformance suite writes
// tens of thousands of keys one durable transaction at a time; at a few
// milliseconds per fsync on a shared disk that takes minutes. On a tmpfs
// fsync returns at once and everything else SQLite does is real. The crash,
// multi-process and focused tests and the benchmarks use the real disk.
func fastTempDir(t testing.TB) string {
	dir, err := os.MkdirTemp(testenv.Getenv("SQLITEKV_TEST_TMPFS", "/dev/shm"), "sqlitekv-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// harness opens every client on one database file with its own pools, as
// another process would, so the cross-client checks race two clients.
func harness(tempDir func(testing.TB) string) kvtest.Harness {
	return kvtest.Harness{
		Shared: true,
		NewNamespace: func(t testing.TB) kvtest.Opener {
			path := filepath.Join(tempDir(t), "kv.db")
			return func(t testing.TB) *kv.DB {
				db, err := Open(context.Background(), path, nil)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, harness(fastTempDir))
}

func TestOpenURLForms(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	t.Chdir(base)
	if err := os.Mkdir(filepath.Join(base, "folder"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ url, file, sync string }{
		{"sqlite:" + filepath.Join(base, "abs.db"), filepath.Join(base, "abs.db"), "2"},
		{"sqlite://" + filepath.Join(base, "three.db"), filepath.Join(base, "three.db"), "2"},
		{"sqlite:rel/kv.db", filepath.Join(base, "rel", "kv.db"), "2"},
		{"sqlite:sp%20ace.db", filepath.Join(base, "sp ace.db"), "2"},
		{"sqlite:odd%3Fname%23.db", filepath.Join(base, "odd?name#.db"), "2"},
		{"sqlite:" + filepath.Join(base, "folder"), filepath.Join(base, "folder", "kv.db"), "2"},
		{"sqlite:new-folder/", filepath.Join(base, "new-folder", "kv.db"), "2"},
		{"sqlite:n.db?synchronous=normal&busy_timeout=5s", filepath.Join(base, "n.db"), "1"},
		{"sqlite:m.db?synchronous=FULL&busy_timeout=250", filepath.Join(base, "m.db"), "2"},
	} {
		db, err := kv.Open(ctx, c.url)
		if err != nil {
			t.Fatalf("open %q: %v", c.url, err)
		}
		if db.Name() != "sqlite" {
			t.Errorf("open %q: driver %q", c.url, db.Name())
		}
		if err := db.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatalf("%q: put: %v", c.url, err)
		}
		if _, err := os.Stat(c.file); err != nil {
			t.Errorf("open %q: no database at %s: %v", c.url, c.file, err)
		}
		var sync string
		if err := backend(db).w.QueryRow("PRAGMA synchronous").Scan(&sync); err != nil || sync != c.sync {
			t.Errorf("open %q: PRAGMA synchronous = %q (%v), want %s", c.url, sync, err, c.sync)
		}
		db.Close()
	}
	for _, c := range []struct{ url, want string }{
		{"sqlite://otherhost/x.db", "host"},
		{"sqlite:x.db?synchronous=off", "synchronous"},
		{"sqlite:x.db?busy_timeout=soon", "busy_timeout"},
		{"sqlite:x.db?journal=delete", "unknown URL parameter \"journal\""},
		{"sqlite:", "no database path"},
	} {
		if db, err := kv.Open(ctx, c.url); err == nil {
			db.Close()
			t.Errorf("open %q succeeded", c.url)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("open %q: %v; want it to mention %q", c.url, err, c.want)
		}
	}
}

func TestWALAndSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	db := openT(t, path, nil)
	s := backend(db)
	var mode string
	if err := s.r.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q (%v), want wal", mode, err)
	}
	var busy int
	if err := s.r.QueryRow("PRAGMA busy_timeout").Scan(&busy); err != nil || busy != int(DefaultBusyTimeout.Milliseconds()) {
		t.Fatalf("busy_timeout %d (%v), want %d", busy, err, DefaultBusyTimeout.Milliseconds())
	}
	if err := db.Put(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Fatalf("no WAL file beside the database: %v", err)
	}
}

func TestNewerFormatRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	db := openT(t, path, nil)
	if _, err := backend(db).w.Exec("UPDATE kv_meta SET format = 2"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err := Open(context.Background(), path, nil)
	if err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open of a newer format: %v; want an error saying it is newer", err)
	}
}

func TestForeignTableRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.db")
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec("CREATE TABLE kv (name TEXT, body TEXT)"); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	if _, err := Open(context.Background(), path, nil); err == nil || !strings.Contains(err.Error(), "another program") {
		t.Fatalf("open of a database with someone else's kv table: %v", err)
	}
}

// TestTooLarge lowers SQLite's length limit on the writer connection to
// show a value past it fails with kv.ErrTooLarge and stores nothing.
func TestTooLarge(t *testing.T) {
	ctx := context.Background()
	db := openT(t, filepath.Join(t.TempDir(), "kv.db"), nil)
	conn, err := backend(db).w.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.Limit(conn, sqlite3.SQLITE_LIMIT_LENGTH, 1000); err != nil {
		t.Fatal(err)
	}
	conn.Close() // back to the one-connection writer pool, limit kept
	err = db.Put(ctx, "big", make([]byte, 2000))
	if !errors.Is(err, kv.ErrTooLarge) {
		t.Fatalf("put past the limit: %v, want kv.ErrTooLarge", err)
	}
	if _, err := db.Get(ctx, "big"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the refused value is there: %v", err)
	}
	if err := db.Put(ctx, "small", make([]byte, 100)); err != nil {
		t.Fatalf("put under the limit: %v", err)
	}
}

// holdWriteLock opens a separate connection to path and keeps a write
// transaction open on it (with an uncommitted row) until release is called.
func holdWriteLock(t *testing.T, path string) (release func()) {
	t.Helper()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := raw.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "INSERT INTO kv (key, value, version) VALUES ('uncommitted', x'00', -1)"); err != nil {
		t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			conn.ExecContext(ctx, "ROLLBACK")
			conn.Close()
			raw.Close()
		}
	}
	t.Cleanup(release)
	return release
}

// TestBusyTimeoutAndReaders holds the write lock from another connection:
// reads and listings still work (WAL), a write waits out the busy timeout
// and fails with an error that says so (not a conflict), and works once the
// lock is released.
func TestBusyTimeoutAndReaders(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kv.db")
	db := openT(t, path, &Options{BusyTimeout: 150 * time.Millisecond})
	if err := db.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	release := holdWriteLock(t, path)

	if v, err := db.Get(ctx, "a"); err != nil || string(v) != "1" {
		t.Fatalf("get while another connection writes: %q, %v", v, err)
	}
	var keys []string
	for k, err := range db.ListKeys(ctx, "") {
		if err != nil {
			t.Fatalf("list while another connection writes: %v", err)
		}
		keys = append(keys, k)
	}
	if !slices.Equal(keys, []string{"a"}) {
		t.Fatalf("listed %q, want [a] (never the other connection's uncommitted row)", keys)
	}
	err := db.Put(ctx, "b", []byte("2"))
	if err == nil || errors.Is(err, kv.ErrConflict) || !strings.Contains(err.Error(), "busy timeout") {
		t.Fatalf("put while locked: %v; want a busy-timeout error that is not a conflict", err)
	}
	_, verA, _ := db.GetWithVersion(ctx, "a")
	if _, err := db.PutIfVersion(ctx, "a", []byte("x"), verA); err == nil || errors.Is(err, kv.ErrConflict) {
		t.Fatalf("conditional put while locked: %v; a lock timeout must not look like a lost condition", err)
	}
	release()
	if err := db.Put(ctx, "b", []byte("2")); err != nil {
		t.Fatalf("put after the lock was released: %v", err)
	}
}

// TestListPagesStayComplete lists more keys than one page while the loop
// body writes new keys, overwrites and deletes keys already yielded: every
// key that existed before is yielded once, in order.
func TestListPagesStayComplete(t *testing.T) {
	ctx := context.Background()
	db := openT(t, filepath.Join(fastTempDir(t), "kv.db"), &Options{Synchronous: SyncNormal})
	backend(db).pageRows = 7
	const n = 3*7 + 5
	var want []string
	for i := range n {
		k := fmt.Sprintf("p/%05d", i*2)
		want = append(want, k)
		if err := db.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	db.Put(ctx, "p", []byte("the prefix itself, no slash"))
	db.Put(ctx, "q/0", []byte("outside"))
	var got []string
	i := 0
	for e, err := range db.List(ctx, "p/") {
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(e.Key, "-new") {
			got = append(got, e.Key)
		}
		// Writes between pages: new keys on both sides of the cursor,
		// and the delete of a key already seen.
		if err := db.Put(ctx, fmt.Sprintf("p/%05d-new", i*7%(2*n)), []byte("n")); err != nil {
			t.Fatal(err)
		}
		if len(got) > 1 {
			if err := db.Delete(ctx, got[len(got)-2]); err != nil {
				t.Fatal(err)
			}
		}
		i++
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listing while writing: %d keys, want %d", len(got), len(want))
	}
}

// TestListBigValuesPagesEarly stores values whose total passes the page's
// byte budget: the listing still returns each once.
func TestListBigValuesPagesEarly(t *testing.T) {
	ctx := context.Background()
	db := openT(t, filepath.Join(fastTempDir(t), "kv.db"), &Options{Synchronous: SyncNormal})
	big := make([]byte, 1<<20)
	for i := range 10 {
		big[0] = byte(i)
		if err := db.Put(ctx, fmt.Sprintf("big/%02d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	for e, err := range db.List(ctx, "big/") {
		if err != nil {
			t.Fatal(err)
		}
		if e.Key != fmt.Sprintf("big/%02d", i) || len(e.Value) != 1<<20 || e.Value[0] != byte(i) {
			t.Fatalf("entry %d: %q with %d bytes", i, e.Key, len(e.Value))
		}
		i++
	}
	if i != 10 {
		t.Fatalf("listed %d big values, want 10", i)
	}
}

// TestCloseDuringListing closes the store while a listing is between
// pages: the listing ends with an error matching kv.ErrClosed.
func TestCloseDuringListing(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(fastTempDir(t), "kv.db"), &Options{Synchronous: SyncNormal})
	if err != nil {
		t.Fatal(err)
	}
	backend(db).pageRows = 2
	for i := range 5 {
		db.Put(ctx, fmt.Sprintf("k%d", i), []byte("v"))
	}
	n := 0
	var last error
	for _, err := range db.List(ctx, "") {
		if err != nil {
			last = err
			break
		}
		if n++; n == 1 {
			db.Close()
		}
	}
	if !errors.Is(last, kv.ErrClosed) {
		t.Fatalf("listing after Close: %d entries then %v; want an error matching kv.ErrClosed", n, last)
	}
}
