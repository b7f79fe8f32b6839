package sessiondb

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/kvtest"
	"agentkit/kv/sqlitekv"
)

// tmpfsDir returns a folder on a tmpfs when there is one (as sqlitekv's
// tests do): the conformance suite makes tens of thousands of durable
// writes.
func tmpfsDir(t testing.TB) string {
	dir, err := os.MkdirTemp(testenv.Getenv("SQLITEKV_TEST_TMPFS", "/dev/shm"), "sessiondb-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestStoreConformance runs the kv conformance suite against the embedded
// store of a session database.
func TestStoreConformance(t *testing.T) {
	kvtest.Run(t, kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener {
			db, err := Open(context.Background(), filepath.Join(tmpfsDir(t), "sessions.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			store, err := db.Store(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return func(t testing.TB) *kv.DB {
				k, err := kv.New("sessiondb", store)
				if err != nil {
					t.Fatal(err)
				}
				return k
			}
		},
	})
}

// TestStoreWritesInTheSessionWrite: keys written through Tx.Store commit
// with the write's events, or not at all; the SQLite driver opened on the
// file reads them.
func TestStoreWritesInTheSessionWrite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sessions.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := db.Store(ctx)
	if err != nil {
		t.Fatal(err)
	}
	store, err := kv.New("sqlite", st)
	if err != nil {
		t.Fatal(err)
	}
	// view is the store as the write tx sees it (kv.TxViewer).
	view := func(tx *Tx) *kv.DB {
		v, err := store.InTx(tx)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	fill(t, db, "a", 0)
	err = db.Write(ctx, func(tx *Tx) error {
		if err := tx.Append(Record{SessionID: "a", Seq: 1, At: t0, Type: "e", Data: []byte(`{}`)}); err != nil {
			return err
		}
		return view(tx).Put(tx.Context(), "k/kept", []byte("v"))
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Write(ctx, func(tx *Tx) error {
		if err := view(tx).Put(tx.Context(), "k/dropped", []byte("v")); err != nil {
			return err
		}
		return tx.Append(Record{SessionID: "a", Seq: 1, At: t0, Type: "e", Data: []byte(`{}`)}) // a duplicate: fails
	})
	if err == nil {
		t.Fatal("a write with a duplicate event succeeded")
	}
	// A part of a write rolled back alone.
	err = db.Write(ctx, func(tx *Tx) error {
		if err := tx.Append(Record{SessionID: "a", Seq: 2, At: t0, Type: "e", Data: []byte(`{}`)}); err != nil {
			return err
		}
		_ = tx.Savepoint(func() error {
			if err := view(tx).Put(tx.Context(), "k/part", []byte("v")); err != nil {
				return err
			}
			return kv.ErrConflict
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	other, err := sqlitekv.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var keys []string
	for k, err := range other.ListKeys(ctx, "k/") {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if len(keys) != 1 || keys[0] != "k/kept" {
		t.Errorf("the SQLite driver on the file lists %q; want [k/kept]", keys)
	}
	if recs, _ := db.After(ctx, "a", 0, 10); len(recs) != 2 {
		t.Errorf("%d events; want 2 (the savepoint kept the write's event)", len(recs))
	}
}

// TestTxViewIsOnlyOfItsOwnDatabase: the embedded store runs inside writes
// of its own session database and nothing else; a store without the
// capability says so.
func TestTxViewIsOnlyOfItsOwnDatabase(t *testing.T) {
	ctx := context.Background()
	open := func() (*DB, *kv.DB) {
		db, err := Open(ctx, filepath.Join(t.TempDir(), "sessions.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := db.Store(ctx)
		if err != nil {
			t.Fatal(err)
		}
		store, err := kv.New("sqlite", st)
		if err != nil {
			t.Fatal(err)
		}
		return db, store
	}
	a, storeA := open()
	_, storeB := open()
	err := a.Write(ctx, func(tx *Tx) error {
		if _, err := storeB.InTx(tx); err == nil || !strings.Contains(err.Error(), "another session database") {
			t.Errorf("B's store inside A's write: %v; want a refusal", err)
		}
		if _, err := storeA.InTx("not a transaction"); err == nil {
			t.Error("a store view of a string was given")
		}
		v, err := storeA.InTx(tx)
		if err != nil {
			return err
		}
		return v.Put(ctx, "k/in", []byte("v"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := storeA.Get(ctx, "k/in"); err != nil || string(got) != "v" {
		t.Errorf("after the write: %q, %v", got, err)
	}
	plain, _ := kv.New("plain", kv.Funcs{Put: func(context.Context, string, []byte) error { return nil }})
	if _, err := plain.InTx(nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("InTx on a store without the capability: %v; want ErrUnsupported", err)
	}
}
