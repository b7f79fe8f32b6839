package sqlitekv

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"agentkit/kv"
	"agentkit/kv/kvtest"
)

// openPool opens a pool on the SQLite file at path as a program that keeps
// the store in its own database would: WAL, synchronous=FULL, a busy
// timeout.
func openPool(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestEmbeddedConformance runs the conformance suite against the store's
// tables in a database the test opens itself, each client with its own
// pool, as another program sharing the file would.
func TestEmbeddedConformance(t *testing.T) {
	kvtest.Run(t, kvtest.Harness{
		Shared: true,
		NewNamespace: func(t testing.TB) kvtest.Opener {
			path := filepath.Join(fastTempDir(t), "own.db")
			pool := openPool(t, path)
			if _, err := pool.Exec(`CREATE TABLE mine (x)`); err != nil {
				t.Fatal(err)
			}
			if err := CreateTables(context.Background(), pool); err != nil {
				t.Fatal(err)
			}
			pool.Close()
			return func(t testing.TB) *kv.DB {
				pool := openPool(t, path)
				e := NewEmbedded(pool)
				db, err := kv.New("sqlite-embedded", embeddedCloser{e, pool})
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	})
}

// embeddedCloser closes the test's pool with the store.
type embeddedCloser struct {
	*Embedded
	pool *sql.DB
}

func (c embeddedCloser) Close() error { return errors.Join(c.Embedded.Close(), c.pool.Close()) }

// TestEmbeddedWritesInTheCallersTransaction: on a connection holding a
// transaction, Embedded's writes (a batch too) commit or roll back with
// it; a store opened on the file with Open sees what was committed.
func TestEmbeddedWritesInTheCallersTransaction(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "own.db")
	pool := openPool(t, path)
	defer pool.Close()
	if err := CreateTables(ctx, pool); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := NewEmbedded(conn)
	defer e.Close()
	run := func(commit bool, key string) {
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		if err := e.Put(ctx, key+"/put", []byte("p")); err != nil {
			t.Fatal(err)
		}
		if _, err := e.WriteBatch(ctx, []kv.BatchOp{{Kind: kv.BatchPutIfAbsent, Key: key + "/batch", Value: []byte("b")}}); err != nil {
			t.Fatal(err)
		}
		// A failed batch inside the transaction undoes itself only.
		_, err := e.WriteBatch(ctx, []kv.BatchOp{
			{Kind: kv.BatchPut, Key: key + "/lost", Value: []byte("l")},
			{Kind: kv.BatchPutIfAbsent, Key: key + "/batch", Value: []byte("again")},
		})
		if !errors.Is(err, kv.ErrConflict) {
			t.Fatalf("a conflicting batch: %v", err)
		}
		end := "ROLLBACK"
		if commit {
			end = "COMMIT"
		}
		if _, err := conn.ExecContext(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	run(true, "kept")
	run(false, "dropped")
	store, err := Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var got []string
	for k, err := range store.ListKeys(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, k)
	}
	if want := []string{"kept/batch", "kept/put"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Open's store sees %q; want %q", got, want)
	}
}
