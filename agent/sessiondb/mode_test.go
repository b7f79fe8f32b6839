package sessiondb

import (
	"context"
	"path/filepath"
	"testing"

	"agentkit/internal/privfile/privfiletest"
)

// The session database holds transcripts and tokens: Open creates it and
// its -wal and -shm files owner-only on its own (not only when the state
// root prepared the file), and tightens a database an older version left
// world-readable, -wal and -shm included.
func TestFilesAreOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "sessions.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fill(t, db, "s1", 3)
	privfiletest.CheckOwnerOnly(t, dir, "sessions.db", "sessions.db-wal", "sessions.db-shm")

	privfiletest.Loosen(t, dir, true)
	if _, err := Exists(ctx, path, "s1"); err != nil {
		t.Fatal(err)
	}
	privfiletest.CheckOwnerOnly(t, dir, "sessions.db", "sessions.db-wal", "sessions.db-shm")

	privfiletest.Loosen(t, dir, true)
	db2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	privfiletest.CheckOwnerOnly(t, dir, "sessions.db", "sessions.db-wal", "sessions.db-shm")
}
