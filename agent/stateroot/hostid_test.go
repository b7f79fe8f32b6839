package stateroot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestHostIDIsStableAndUniquePerStateRoot(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, err := r.HostID()
	if err != nil || len(id) < 10 || strings.ContainsAny(id, " /\n") {
		t.Fatalf("HostID = %q, %v", id, err)
	}
	again, _ := r.HostID()
	r.Close()
	r, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	reopened, _ := r.HostID()
	if again != id || reopened != id {
		t.Errorf("host ids %q, %q, %q: want one stable id", id, again, reopened)
	}
	if st, err := os.Stat(filepath.Join(dir, HostIDFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("HOST_ID: %v %v; want mode 0600", st.Mode(), err)
	}
	other, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if oid, _ := other.HostID(); oid == id {
		t.Errorf("two state roots share the host id %q", id)
	}
	if err := os.WriteFile(filepath.Join(dir, HostIDFile), []byte("two words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.HostID(); err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("a damaged HOST_ID: %v", err)
	}
}
