package filekv

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"agentkit/internal/privfile/privfiletest"
	"agentkit/kv"
)

// A new store's folders and files are owner-only whatever the umask; a
// store folder a copy left readable by others is made owner-only when it
// is opened, read-only too, but only once it is known to be a store: a
// folder refused as not a store keeps its mode.
func TestStoreFolderIsOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	parent := t.TempDir()
	dir := filepath.Join(parent, "kv")
	db, err := kv.Open(ctx, "file:"+dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Put(ctx, "a/b", []byte("a transcript")); err != nil {
		t.Fatal(err)
	}
	db.Close()
	privfiletest.CheckOwnerOnly(t, parent, "kv", "kv/.format", "kv/a", "kv/a/b.kv")

	for _, readOnly := range []bool{false, true} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		db, err := kv.OpenWith(ctx, "file:"+dir, kv.OpenOptions{ReadOnly: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
		if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("read-only %v: the store folder after the open: %v, %v; want 0700", readOnly, st.Mode(), err)
		}
	}

	other := filepath.Join(parent, "home")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(other, 0o755)
	if err := os.WriteFile(filepath.Join(other, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Open(ctx, "file:"+other); err == nil {
		t.Fatal("a folder of other files was opened as a store")
	}
	if st, _ := os.Stat(other); st.Mode().Perm() != 0o755 {
		t.Errorf("a folder refused as a store has mode %v after the open; want it left at 0755", st.Mode().Perm())
	}
}
