package actor

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"agentkit/internal/privfile/privfiletest"
)

// An actors folder an older version left readable by others, with
// world-readable databases: opening the host makes the folder owner-only,
// and opening each database (the system database, the author's, the
// schedule index) makes it and its -wal and -shm files owner-only.
func TestExistingFilesAreTightened(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "actors")
	use := func(h *Host) {
		t.Helper()
		a := actorOf(t, defineStatus(t, h), "a1")
		if _, err := a.SetState(ctx, []byte(`{"status":"x"}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Schedule(ctx, After(3600e9), "h", nil); err != nil {
			t.Fatal(err)
		}
		db, err := a.SQL(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS t (x); INSERT INTO t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
	}
	h1 := openHost(t, Options{Dir: dir})
	use(h1) // h1 stays open: the -wal and -shm files stay
	privfiletest.Loosen(t, dir, false)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h2 := openHost(t, Options{Dir: dir})
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("the actors folder after Open: %v, %v; want 0700", st.Mode(), err)
	}
	use(h2)
	privfiletest.CheckOwnerOnly(t, dir, indexFile, indexFile+"-wal", "agent/a1/system.db", "agent/a1/system.db-wal", "agent/a1/data.db", "agent/a1/data.db-wal")
}
