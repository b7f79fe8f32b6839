package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentkit/internal/testenv"
)

// agentkitBin is the agentkit binary built once for the tests in this
// package, so the commands are tested as a user runs them.
var agentkitBin string

func TestMain(m *testing.M) {
	if os.Getenv(childRoleEnv) != "" {
		// A copy of this binary started by a test in a child role: it
		// needs no agentkit build of its own.
		testenv.RunChildRole(m, childRoleEnv, childRoles)
	}
	dir, err := os.MkdirTemp("", "agentkit-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentkitBin = filepath.Join(dir, "agentkit")
	build := exec.Command("go", "build", "-o", agentkitBin, "agentkit/cmd/agentkit")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building agentkit:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs the built binary in dir with extra environment variables.
func run(t *testing.T, dir string, env []string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(agentkitBin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running agentkit %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

// cleanEnv is the test's environment without AGENTKIT_* variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGENTKIT_") {
			env = append(env, kv)
		}
	}
	return env
}

func TestKVRoundTripOnEmbeddedStores(t *testing.T) {
	for _, scheme := range []string{"sqlite", "file"} {
		t.Run(scheme, func(t *testing.T) {
			dir := t.TempDir()
			url := scheme + ":" + filepath.Join(dir, "store")
			if scheme == "sqlite" {
				url += ".db"
			}
			for _, step := range []struct {
				args  []string
				stdin string
				want  string
			}{
				{args: []string{"kv", "put", "--storage", url, "agents/a", "one"}},
				{args: []string{"kv", "put", "agents/b", "--storage", url}, stdin: "two\nlines"},
				{args: []string{"kv", "put", "--storage", url, "other", "-"}, stdin: "x"},
				{args: []string{"kv", "get", "--storage", url, "agents/a"}, want: "one"},
				{args: []string{"kv", "get", "--storage", url, "agents/b"}, want: "two\nlines"},
				{args: []string{"kv", "ls", "--storage", url}, want: "agents/a\nagents/b\nother\n"},
				{args: []string{"kv", "ls", "--storage", url, "agents/"}, want: "agents/a\nagents/b\n"},
				{args: []string{"kv", "ls", "--values", "--storage", url, "agents/"}, want: "agents/a\tone\nagents/b\t\"two\\nlines\"\n"},
				{args: []string{"kv", "rm", "--storage", url, "agents/a", "other"}},
				{args: []string{"kv", "ls", "--storage", url}, want: "agents/b\n"},
			} {
				r := run(t, dir, nil, step.stdin, step.args...)
				if r.code != 0 {
					t.Fatalf("agentkit %v: exit %d, stderr %q", step.args, r.code, r.stderr)
				}
				if r.stdout != step.want {
					t.Fatalf("agentkit %v printed %q, want %q", step.args, r.stdout, step.want)
				}
			}
			r := run(t, dir, nil, "", "kv", "get", "--storage", url, "agents/a")
			if r.code != 1 || !strings.Contains(r.stderr, "not found") || !strings.Contains(r.stderr, "agents/a") {
				t.Fatalf("get of a deleted key: exit %d, stderr %q; want exit 1 naming the key and 'not found'", r.code, r.stderr)
			}
		})
	}
}

func TestKVDefaultsToTheStateRootsEmbeddedStore(t *testing.T) {
	dir := t.TempDir()
	r := run(t, dir, nil, "", "kv", "ls")
	if r.code != 1 || !strings.Contains(r.stderr, filepath.Join(".agentkit", "sessions", "sessions.db")) {
		t.Fatalf("ls before any store exists: exit %d, stderr %q; want exit 1 naming .agentkit/sessions/sessions.db", r.code, r.stderr)
	}
	if r := run(t, dir, nil, "", "kv", "put", "k", "v"); r.code != 0 {
		t.Fatalf("put on the default store: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, ".agentkit", "sessions", "sessions.db")); err != nil {
		t.Fatalf("the default store was not created in .agentkit/sessions/sessions.db: %v", err)
	}
	other := t.TempDir()
	env := []string{"AGENTKIT_STATE_ROOT=" + filepath.Join(dir, ".agentkit")}
	if r := run(t, other, env, "", "kv", "get", "k"); r.code != 0 || r.stdout != "v" {
		t.Fatalf("AGENTKIT_STATE_ROOT was not used: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestBadUsageIsOneLineAndExitTwo(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"frobnicate"}, want: "unknown command \"frobnicate\""},
		{args: []string{"kv", "frob"}, want: "use ls, get, put or rm"},
		{args: []string{"kv", "get"}, want: "get KEY"},
		{args: []string{"kv", "ls", "--nope"}, want: "-nope"},
		{args: []string{"kv", "ls", "--storage", "bogus://x"}, want: "no driver for \"bogus\""},
		{args: []string{"kv", "ls", "--values=maybe"}, want: "values"},
		{args: []string{"kv", "ls"}, env: []string{"AGENTKIT_VALUES=maybe"}, want: "AGENTKIT_VALUES"},
	} {
		r := run(t, dir, c.env, "", c.args...)
		if r.code != 2 {
			t.Errorf("agentkit %v: exit %d, want 2 (stderr %q)", c.args, r.code, r.stderr)
		}
		if lines := strings.Count(strings.TrimRight(r.stderr, "\n"), "\n") + 1; lines != 1 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agentkit %v: stderr %q; want one line containing %q", c.args, r.stderr, c.want)
		}
	}
}

func TestVersion(t *testing.T) {
	r := run(t, t.TempDir(), nil, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "agentkit ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("version: exit %d, stdout %q", r.code, r.stdout)
	}
}
