// Package privfiletest checks in tests that files holding state or secrets
// are the owner's alone, as package privfile makes them.
package privfiletest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// CheckOwnerOnly walks dir and fails t for every regular file under it
// whose mode is not 0600 and every folder below it whose mode is not 0700
// (dir itself is the caller's and is not checked), and for each name in
// want (a path relative to dir, such as "kv.db-wal") that the walk did not
// find, so a check that saw nothing never passes.
func CheckOwnerOnly(t testing.TB, dir string, want ...string) {
	t.Helper()
	var seen, bad []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking (a -shm at close)
			}
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		seen = append(seen, rel)
		switch mode := info.Mode(); {
		case mode.IsDir() && path != dir:
			if mode.Perm() != 0o700 {
				bad = append(bad, fmt.Sprintf("folder %s has mode %v; want drwx------", rel, mode))
			}
		case mode.IsRegular():
			if mode.Perm() != 0o600 {
				bad = append(bad, fmt.Sprintf("file %s has mode %v; want -rw-------", rel, mode))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
	for _, w := range want {
		if !slices.Contains(seen, filepath.FromSlash(w)) {
			t.Errorf("%s holds no %s (it holds %q): the check saw less than it should", dir, w, seen)
		}
	}
}

// Loosen gives every file under dir mode 0644 and, with folders, every
// folder below it 0755, as versions before owner-only files made them, so
// a test can check that opening tightens them.
func Loosen(t testing.TB, dir string, folders bool) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir() && path != dir && folders:
			return os.Chmod(path, 0o755)
		case d.Type().IsRegular():
			return os.Chmod(path, 0o644)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
