//go:build !unix

package stateroot

import (
	"errors"
	"os"
)

// acquire is not implemented off Unix: serving needs flock.
func acquire(dir string) (*os.File, error) {
	return nil, errors.New("stateroot: locking a state root needs a Unix system (flock)")
}

func release(f *os.File) error { return f.Close() }
