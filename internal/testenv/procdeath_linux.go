//go:build linux

package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// DieWithParent makes the process cmd starts receive SIGKILL when the
// process that started it dies (Linux's parent-death signal), so a test
// binary killed with SIGKILL, which runs no cleanup, leaves no child
// behind. Call it before cmd.Start. The signal follows the OS thread that
// started the child; the Go runtime keeps its threads while the program
// runs, except one a goroutine locked (runtime.LockOSThread) and left
// locked when it ended, so do not start children from such a goroutine.
// On other systems DieWithParent does nothing.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// Alive reports whether the process pid runs: it exists and is not a
// zombie (a process that ended and was not reaped yet, as an orphan stays
// where PID 1 does not reap). Linux only.
func Alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// hold anything, spaces and ')' included.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return true
	}
	state := data[i+2]
	return state != 'Z' && state != 'X'
}
