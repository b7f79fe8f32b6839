//go:build linux

package proctest

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentkit/internal/testenv"
)

func TestMain(m *testing.M) {
	Main(m, map[string]func() error{
		// spawner starts a sleeper as Start does, prints its pid and
		// waits to be killed.
		"spawner": func() error {
			cmd := command("sleeper")
			if err := cmd.Start(); err != nil {
				return err
			}
			fmt.Println("pid", cmd.Process.Pid)
			time.Sleep(10 * time.Minute)
			return nil
		},
		"sleeper": func() error {
			time.Sleep(10 * time.Minute)
			return nil
		},
	})
}

// TestChildDiesWithItsParent: a child started as Start starts one dies
// when the process that started it is killed with SIGKILL, which runs no
// cleanup.
func TestChildDiesWithItsParent(t *testing.T) {
	spawner := Start(t, "spawner")
	pid, err := strconv.Atoi(strings.TrimPrefix(spawner.Expect("pid ", 30*time.Second), "pid "))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if testenv.Alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL) // it outlived its parent: do not leave it behind
		}
	})
	if !testenv.Alive(pid) {
		t.Fatalf("the sleeper (pid %d) is not running", pid)
	}
	spawner.Kill()
	spawner.Wait()
	// Poll the pid, with a deadline.
	deadline := time.Now().Add(20 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the sleeper (pid %d) still runs 20s after its parent was killed with SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
