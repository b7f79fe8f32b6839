//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package memory

import "os"

// lockFile does nothing here: without flock only one Journal per folder is
// supported, serialised by its mutex.
func lockFile(*os.File) error { return nil }

// unlockFile does nothing here.
func unlockFile(*os.File) error { return nil }
