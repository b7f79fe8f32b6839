//go:build unix

package stateroot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// acquire takes an exclusive, non-blocking flock on dir/serve.lock and
// writes this process's PID into it. The kernel drops the lock when the
// process dies, so a crashed server never leaves the root locked.
func acquire(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, FilePerm)
	if err != nil {
		return nil, fmt.Errorf("stateroot: opening the lock file %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b, _ := os.ReadFile(path)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return nil, &LockedError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("stateroot: locking %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// release empties the PID and drops the lock.
func release(f *os.File) error {
	f.Truncate(0)
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return f.Close()
}
