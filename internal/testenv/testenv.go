// Package testenv holds the rules agentkit's tests share for reaching real
// servers: where to find them (environment variables with local defaults) and
// what to do when one is missing (skip with a how-to on a laptop, fail in CI),
// and the TestMain of test binaries that run themselves as child processes.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the CI environment variable is set to anything but
// "" or "false". In CI a missing server fails the run, so a green run always
// means every driver met its real server.
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// Getenv returns the environment variable key, or def when it is unset or
// empty.
func Getenv(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Unavailable reports a server the test cannot reach. In CI it fails the
// test; elsewhere it skips it, saying how to provide the server. what names
// the server ("PostgreSQL at 127.0.0.1:5432"); howto says how to start it or
// which variable to set.
func Unavailable(t testing.TB, what, howto string, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is not reachable (%v); CI requires it. %s", what, err, howto)
	}
	t.Skipf("%s is not reachable (%v); skipping. %s", what, err, howto)
}

// RunChildRole is a TestMain for test binaries that re-run themselves as
// child processes (crash tests kill a child at a chosen step). With the
// environment variable env unset it runs the tests; set, it runs the role
// of that name from roles and exits 0, or 1 with the role's error on
// standard error, or 2 for a role it does not know.
func RunChildRole(m *testing.M, env string, roles map[string]func() error) {
	role := os.Getenv(env)
	if role == "" {
		os.Exit(m.Run())
	}
	run, ok := roles[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
