package reminder

import (
	"os"
	"path/filepath"
	"testing"
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
