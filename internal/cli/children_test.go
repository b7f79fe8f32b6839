package cli_test

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// childRoleEnv selects the role of a copy of this test binary that a test
// starts as a child process (TestMain runs the role instead of the tests).
const childRoleEnv = "AGENTKIT_CLI_TEST_ROLE"

// childRoles are the roles a copy of this test binary can run.
var childRoles = map[string]func() error{"start-serve": startServeChild}

// startServeChild is the role "start-serve": it starts agentkit serve as
// the tests do (serveCommand), with the binary, project folder and state
// root the environment names, sharing its own stdout and stderr with the
// server, prints "pid N" and waits to be killed.
func startServeChild() error {
	bin, dir, root := os.Getenv("AGENTKIT_TEST_BIN"), os.Getenv("AGENTKIT_TEST_DIR"), os.Getenv("AGENTKIT_TEST_ROOT")
	if bin == "" || dir == "" || root == "" {
		return errors.New("set AGENTKIT_TEST_BIN, AGENTKIT_TEST_DIR and AGENTKIT_TEST_ROOT")
	}
	cmd := serveCommand(bin, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	fmt.Println("pid", cmd.Process.Pid)
	time.Sleep(10 * time.Minute) // until the test kills this process
	return errors.New("not killed within 10 minutes")
}
