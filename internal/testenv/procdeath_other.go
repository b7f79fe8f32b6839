//go:build !linux

package testenv

import "os/exec"

// DieWithParent makes the process cmd starts receive SIGKILL when the
// process that started it dies. That needs Linux's parent-death signal;
// here it does nothing, and a test binary killed with SIGKILL may leave
// its children running (a test's cleanup still kills the children it
// started when the test ends normally).
func DieWithParent(cmd *exec.Cmd) {}
