package stateroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"agentkit/internal/privfile"
)

// CreatePrivate creates path as an empty file with FilePerm when it does
// not exist, so that a program that opens it next (SQLite) keeps that mode,
// and takes group and other permissions away from an existing one and its
// SQLite -wal, -shm and -journal files. SQLite treats an empty file as a
// new database.
func CreatePrivate(path string) error {
	if err := privfile.CreateSQLite(path); err != nil {
		return fmt.Errorf("stateroot: %w", err)
	}
	return nil
}

// restrict removes group and other permissions from path, if it exists.
// Symlinks are left alone (chmod would follow them).
func restrict(path string) error {
	if err := privfile.Tighten(path); err != nil {
		return fmt.Errorf("stateroot: %w", err)
	}
	return nil
}

// tightenRoot makes the root folder owner-only and reports whether it had
// wider permissions: a root made by an older version, whose contents need
// tightening too.
func tightenRoot(dir string) (bool, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return false, fmt.Errorf("stateroot: %w", err)
	}
	if st.Mode().Perm()&0o077 == 0 {
		return false, nil
	}
	if err := os.Chmod(dir, st.Mode().Perm()&^0o077); err != nil {
		return false, fmt.Errorf("stateroot: making state root %s owner-only: %w", dir, err)
	}
	return true, nil
}

// tightenAll removes group and other permissions from every file and
// folder under dir. Open runs it once, for a root found with wider
// permissions; an owner-only root is not walked again.
func tightenAll(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("stateroot: making %s owner-only: %w", dir, err)
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		return restrict(path)
	})
}
