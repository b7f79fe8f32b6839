// Package privfile creates the files that hold state or secrets owner-only
// and tightens existing ones: transcripts, tokens and keys are the owning
// user's alone, whatever the umask and whichever path creates them.
//
// SQLite creates a database's -wal, -shm and -journal files itself, giving
// each the mode of the database file (exactly, whatever the umask). So a
// database created empty with FilePerm before SQLite first opens it keeps
// all of its files owner-only; CreateSQLite does that, and takes group and
// other permissions off a database and its companion files that already
// exist. TightenSQLite does the second half alone, for opens that must not
// create anything.
//
// A file the process does not own cannot be tightened by it (chmod fails
// with EPERM): that is not an error, and the file is left for its owner to
// tighten. Symbolic links are followed for the database (SQLite follows
// them too, and keeps the companion files beside the target), never for a
// companion file.
package privfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// The modes of files and folders that hold state or secrets.
const (
	FilePerm = 0o600
	DirPerm  = 0o700
)

// SQLiteSuffixes are the companion files SQLite keeps beside a database.
var SQLiteSuffixes = []string{"-wal", "-shm", "-journal"}

// CreateSQLite prepares the database file at path for SQLite to open for
// writing: it creates it empty with FilePerm when it does not exist (SQLite
// takes an empty file for a new database), and otherwise takes group and
// other permissions off it and off its -wal, -shm and -journal files.
func CreateSQLite(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, FilePerm)
	if err == nil {
		return f.Close()
	}
	if !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	return TightenSQLite(path)
}

// TightenSQLite takes group and other permissions off the database at path
// and its -wal, -shm and -journal files, those that exist. It creates
// nothing.
func TightenSQLite(path string) error {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	if err := Tighten(path); err != nil {
		return err
	}
	for _, s := range SQLiteSuffixes {
		if err := Tighten(path + s); err != nil {
			return err
		}
	}
	return nil
}

// Tighten takes group and other permissions off the file or folder at path
// if it exists and has any. A symbolic link is left alone (chmod would
// follow it), and so is a file of another owner.
func Tighten(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode()&fs.ModeSymlink != 0 || st.Mode().Perm()&0o077 == 0 {
		return nil
	}
	err = os.Chmod(path, st.Mode().Perm()&^0o077)
	if err != nil && !errors.Is(err, fs.ErrPermission) && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("making %s owner-only: %w", path, err)
	}
	return nil
}

// TightenOpen takes group and other permissions off an open file, if it
// has any, through its descriptor (so a rename or a link swapped in since
// the open cannot redirect it). A file of another owner is left alone.
func TightenOpen(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := f.Chmod(st.Mode().Perm() &^ 0o077); err != nil && !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("making %s owner-only: %w", f.Name(), err)
	}
	return nil
}
