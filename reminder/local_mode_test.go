package reminder

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"agentkit/internal/privfile/privfiletest"
	"agentkit/storage"
)

// The local folder holds reminder messages: owner-only, like the rest of a
// state root, even when it is created outside one.
func TestLocalFolderIsOwnerOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "reminders")
	if _, err := openLocal(dir); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o700 {
			t.Errorf("%s has mode %o; want 0700", d, m)
		}
	}
}

// Reminder files an older version (or a copy) left readable by others, in
// a folder readable by others: opening the folder and loading it makes
// both owner-only.
func TestExistingLocalFilesAreTightened(t *testing.T) {
	privfiletest.CommonUmask(t)
	dir := filepath.Join(t.TempDir(), "reminders")
	l, err := openLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.save(localRecord{Reminder: Reminder{ID: "r1", SessionID: "s1", Message: "call back", State: storage.ReminderPending, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	privfiletest.Loosen(t, dir, true)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err = openLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	recs, bad, err := l.load()
	if err != nil || len(bad) != 0 || len(recs) != 1 {
		t.Fatalf("load = %d records, bad %v, err %v", len(recs), bad, err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the folder: %v, %v; want 0700", st.Mode(), err)
	}
	privfiletest.CheckOwnerOnly(t, dir, "r1.json")
}
