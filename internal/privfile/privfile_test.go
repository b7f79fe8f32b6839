package privfile_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"agentkit/internal/privfile"
	"agentkit/internal/privfile/privfiletest"
)

// openWAL opens path with SQLite in WAL mode and writes a row, so the
// -wal and -shm files exist until the returned database is closed.
func openWAL(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS t (x); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	return db
}

// A database CreateSQLite made keeps SQLite's -wal and -shm files
// owner-only: SQLite gives them the database's mode.
func TestCreateSQLiteMakesEveryFileOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "a.db")
	if err := privfile.CreateSQLite(path); err != nil {
		t.Fatal(err)
	}
	openWAL(t, path)
	privfiletest.CheckOwnerOnly(t, dir, "a.db", "a.db-wal", "a.db-shm")

	// Rollback-journal mode: the -journal file too.
	path = filepath.Join(dir, "b.db")
	if err := privfile.CreateSQLite(path); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(PERSIST)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE t (x); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	privfiletest.CheckOwnerOnly(t, dir, "b.db", "b.db-journal")
}

// An existing database and its companion files with wider modes, as older
// versions left them, are tightened by CreateSQLite and TightenSQLite.
func TestExistingDatabaseIsTightened(t *testing.T) {
	privfiletest.CommonUmask(t)
	for _, tighten := range []func(string) error{privfile.CreateSQLite, privfile.TightenSQLite} {
		dir := t.TempDir()
		path := filepath.Join(dir, "a.db")
		openWAL(t, path) // kept open: -wal and -shm exist
		if err := os.WriteFile(path+"-journal", nil, 0o644); err != nil {
			t.Fatal(err)
		}
		privfiletest.Loosen(t, dir, true)
		if err := tighten(path); err != nil {
			t.Fatal(err)
		}
		privfiletest.CheckOwnerOnly(t, dir, "a.db", "a.db-wal", "a.db-shm", "a.db-journal")
	}
}

// TightenSQLite creates nothing.
func TestTightenSQLiteCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	if err := privfile.TightenSQLite(filepath.Join(dir, "none.db")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("TightenSQLite of a missing database created %s", ents[0].Name())
	}
}

// A database reached through a symbolic link is tightened where it is,
// with the companion files beside it (where SQLite keeps them); a
// companion that is a link is not followed.
func TestSymlinks(t *testing.T) {
	privfiletest.CommonUmask(t)
	dir, elsewhere := t.TempDir(), t.TempDir()
	real := filepath.Join(elsewhere, "real.db")
	for _, p := range []string{real, real + "-wal"} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(elsewhere, "outside")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.db")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, real+"-shm"); err != nil {
		t.Fatal(err)
	}
	if err := privfile.CreateSQLite(link); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{real: 0o600, real + "-wal": 0o600, outside: 0o644} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v); want %v", filepath.Base(p), st.Mode().Perm(), err, want)
		}
	}
}

func TestTightenOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := privfile.TightenOpen(f); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("after TightenOpen the mode is %v; want 0600", st.Mode().Perm())
	}
}

// A folder keeps its owner's permissions and loses the others'.
func TestTightenFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := privfile.Tighten(dir); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("after Tighten the folder's mode is %v; want 0700", st.Mode().Perm())
	}
}
