//go:build !unix

package privfiletest

import "testing"

// CommonUmask does nothing where there is no umask.
func CommonUmask(t testing.TB) {}
