package sqlitekv

import (
	"context"
	"path/filepath"
	"testing"

	"agentkit/internal/privfile/privfiletest"
	"agentkit/kv"
)

// The database and its -wal and -shm files hold transcripts and tokens:
// a store opened through kv.Open (sqlite:PATH) creates every one of them
// 0600 whatever the umask gives.
func TestNewDatabaseFilesAreOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "new") // created by the open: 0700
	db, err := kv.Open(ctx, "sqlite:"+filepath.Join(dir, "kv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Put(ctx, "sessions/s1", []byte("a transcript")); err != nil {
		t.Fatal(err)
	}
	privfiletest.CheckOwnerOnly(t, filepath.Dir(dir), "new", "new/kv.db", "new/kv.db-wal", "new/kv.db-shm")
}

// Files an older version left world-readable (the database, and a -wal
// and -shm still there because another process has it open) are made
// owner-only by a writing open and by a read-only one.
func TestExistingDatabaseFilesAreTightened(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	for _, readOnly := range []bool{false, true} {
		dir := t.TempDir()
		url := "sqlite:" + filepath.Join(dir, "kv.db")
		holder, err := kv.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if err := holder.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		privfiletest.Loosen(t, dir, true)
		db, err := kv.OpenWith(ctx, url, kv.OpenOptions{ReadOnly: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := db.Get(ctx, "k"); err != nil || string(v) != "v" {
			t.Fatalf("read-only %v: Get = %q, %v", readOnly, v, err)
		}
		privfiletest.CheckOwnerOnly(t, dir, "kv.db", "kv.db-wal", "kv.db-shm")
		db.Close()
		holder.Close()
	}
}
