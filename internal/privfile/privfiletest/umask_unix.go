//go:build unix

package privfiletest

import (
	"syscall"
	"testing"
)

// CommonUmask sets the process's umask to 022, the common default, for the
// rest of the test (and the processes it starts), so that a file created
// without an explicit owner-only mode would come out 0644 and fail
// CheckOwnerOnly, even where the test runs under a stricter umask.
func CommonUmask(t testing.TB) {
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
}
