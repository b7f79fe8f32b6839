//go:build linux

package cli_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentkit/internal/testenv"
)

// TestServeDiesWithTheTestProcess: a process that starts agentkit serve as
// the tests do (TestLedgerChaos included) and is then killed with SIGKILL,
// as a test binary killed by a timeout or by hand is, running no cleanup,
// takes the server with it.
func TestServeDiesWithTheTestProcess(t *testing.T) {
	dir := writeProject(t, "name: orphan\nmodel:\n  provider: echo\n")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), childRoleEnv+"=start-serve",
		"AGENTKIT_TEST_BIN="+agentkitBin, "AGENTKIT_TEST_DIR="+dir, "AGENTKIT_TEST_ROOT="+t.TempDir())
	// The server writes to this pipe too, and the test holds its read end
	// open throughout: the server never dies of a broken pipe. Both are
	// files, so waiting for the helper does not wait for the server too.
	helper.Stdout = w
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	helper.Stderr = errFile
	stderr := func() string { b, _ := os.ReadFile(errFile.Name()); return string(b) }
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	helperDone := make(chan struct{})
	go func() { helper.Wait(); close(helperDone) }()
	t.Cleanup(func() {
		helper.Process.Kill()
		<-helperDone
	})

	// The helper prints the server's pid, and the server its address.
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	pid, listening := 0, false
	deadline := time.After(90 * time.Second)
	for pid == 0 || !listening {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the helper's output ended before the server listened; stderr:\n%s", stderr())
			}
			if n, found := strings.CutPrefix(line, "pid "); found {
				pid, _ = strconv.Atoi(n)
			}
			listening = listening || strings.HasPrefix(line, "listening on ")
		case <-deadline:
			t.Fatalf("no pid and address from the helper within 90s; stderr:\n%s", stderr())
		}
	}
	t.Cleanup(func() {
		if testenv.Alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL) // the server outlived its parent: do not leave it behind
		}
	})
	if !testenv.Alive(pid) {
		t.Fatalf("the server (pid %d) is not running after it printed its address", pid)
	}

	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-helperDone
	// Wait for the server to be gone: poll its pid, with a deadline.
	gone := time.Now().Add(20 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(gone) {
			t.Fatalf("agentkit serve (pid %d) still runs 20s after the process that started it was killed with SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
