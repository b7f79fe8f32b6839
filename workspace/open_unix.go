//go:build unix

package workspace

import "syscall"

// nonBlock opens a named pipe without waiting for its other end.
const nonBlock = syscall.O_NONBLOCK
