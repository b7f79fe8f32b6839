package filekv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockName is the lock file in the root. It is never removed: removing a
// lock file another process has open would let two processes lock two
// different files of the same name.
const lockName = ".lock"

// LockedError is returned by Open when another open store holds the folder:
// another process, or an earlier Open in this process that was not closed.
// Check for it with errors.As.
type LockedError struct {
	Dir string // the root folder, absolute
	PID int    // the holder's process id as it wrote it, or 0 if unknown
}

// Error says which folder is locked, by whom, and what to do.
func (e *LockedError) Error() string {
	who := "another process"
	switch {
	case e.PID == os.Getpid():
		who = fmt.Sprintf("this process (PID %d, an earlier Open not yet closed)", e.PID)
	case e.PID > 0:
		who = fmt.Sprintf("another process (PID %d)", e.PID)
	default:
		who += " (PID unknown)"
	}
	return fmt.Sprintf("filekv: the folder %s is locked by %s; the file driver serves one process at a time: stop that process, close the other store, or use a folder of its own (or the sqlite driver, which several processes can share)", e.Dir, who)
}

// lockRoot takes the exclusive lock on dir's lock file and records this
// process's id in it. The lock lasts as long as the returned file is open;
// the kernel releases it when the process dies, however it dies. readOnly
// neither creates the lock file nor writes to it.
func lockRoot(dir string, readOnly bool) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	flags := os.O_RDWR | os.O_CREATE
	if readOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("filekv: open the lock file: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &LockedError{Dir: dir, PID: readPID(path)}
		}
		return nil, fmt.Errorf("filekv: lock %s: %w", path, err)
	}
	if readOnly {
		return f, nil
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err = f.Truncate(0); err == nil {
		_, err = f.WriteAt(pid, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("filekv: write the lock file %s: %w", path, err)
	}
	return f, nil
}

// readPID returns the process id in a lock file, or 0.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
