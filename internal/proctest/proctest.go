// Package proctest runs parts of a driver's tests in separate OS processes:
// the test binary starts itself again in a child role (selected by an
// environment variable), so tests can race two processes on one store, hold
// a lock from another process, or kill a writer with SIGKILL.
//
// A test package opts in from TestMain:
//
//	func TestMain(m *testing.M) {
//		proctest.Main(m, map[string]func() error{"writer": writer})
//	}
//
// and a test starts a child with Start(t, "writer", "STORE=…").
package proctest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/internal/testenv"
)

// RoleEnv names the environment variable that selects a child's role.
const RoleEnv = "AGENTKIT_KV_CHILD_ROLE"

// Main runs the role named by RoleEnv and exits, or, when it is unset, runs
// the tests. A role returning an error exits with status 1 after printing
// the error to stderr.
func Main(m *testing.M, roles map[string]func() error) {
	role := os.Getenv(RoleEnv)
	if role == "" {
		os.Exit(m.Run())
	}
	run, ok := roles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "proctest: unknown child role %q\n", role)
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "proctest: role %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Child is a running copy of the test binary in a role. Its stdout is read
// line by line; its stderr is kept for failure messages.
type Child struct {
	t      testing.TB
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

// Start runs the test binary in role with extra environment variables
// (KEY=VALUE). The child is killed at the end of the test if still alive,
// and, on Linux, when the test process dies (testenv.DieWithParent), so a
// test binary killed with SIGKILL leaves no child behind.
func Start(t testing.TB, role string, env ...string) *Child {
	t.Helper()
	cmd := command(role, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{t: t, role: role, cmd: cmd, stdin: stdin, lines: make(chan string, 1<<16),
		stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", role, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.Kill()
		<-c.done
	})
	return c
}

// command is the command Start runs: the test binary in role, with env
// added to this process's environment, killed when this process dies.
func command(role string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), RoleEnv+"="+role), env...)
	testenv.DieWithParent(cmd)
	return cmd
}

// PID returns the child's process id.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// Send writes one line to the child's stdin.
func (c *Child) Send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		c.t.Fatalf("child %s: write to stdin: %v\n%s", c.role, err, c.stderr)
	}
}

// Expect waits for the next line of output and fails the test unless it
// starts with prefix. It returns the line.
func (c *Child) Expect(prefix string, timeout time.Duration) string {
	c.t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.done
			c.t.Fatalf("child %s exited (%v) before printing %q; stderr:\n%s", c.role, c.err, prefix, c.stderr)
		}
		if !strings.HasPrefix(line, prefix) {
			c.t.Fatalf("child %s printed %q, want a line starting with %q; stderr:\n%s", c.role, line, prefix, c.stderr)
		}
		return line
	case <-time.After(timeout):
		c.t.Fatalf("child %s printed nothing for %v (waiting for %q); stderr:\n%s", c.role, timeout, prefix, c.stderr)
		return ""
	}
}

// Kill sends SIGKILL (a no-op once the child has exited).
func (c *Child) Kill() {
	c.cmd.Process.Kill()
}

// Wait closes the child's stdin, waits for it to exit and returns every
// line it printed that Expect did not consume, and its exit error.
func (c *Child) Wait() ([]string, error) {
	c.stdin.Close()
	var rest []string
	for line := range c.lines {
		rest = append(rest, line)
	}
	<-c.done
	return rest, c.err
}

// Stderr returns what the child wrote to stderr so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// ReadLine reads one line from stdin, for child roles waiting for a go.
func ReadLine(r *bufio.Reader) (string, error) {
	s, err := r.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
