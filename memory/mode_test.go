package memory

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"agentkit/internal/privfile/privfiletest"
)

// A journal folder an older version (or a copy) left readable by others,
// with a world-readable journal and lock file: the next append makes all
// of them owner-only.
func TestExistingJournalIsTightened(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "memory")
	j, err := NewJournal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Append(ctx, turnRecord("s", 1)); err != nil {
		t.Fatal(err)
	}
	j.Close()
	privfiletest.Loosen(t, dir, true)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	j, err = NewJournal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Append(ctx, turnRecord("s", 2)); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != dirPerm {
		t.Errorf("the journal folder: %v, %v; want %v", st.Mode(), err, os.FileMode(dirPerm))
	}
	privfiletest.CheckOwnerOnly(t, dir, JournalName, lockName)
}
