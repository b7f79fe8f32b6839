package actor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/sqlitekv"
)

// childEnv selects a child role of the test binary.
const childEnv = "AGENTKIT_ACTOR_CHILD"

func TestMain(m *testing.M) {
	testenv.RunChildRole(m, childEnv, map[string]func() error{"migrate": childMigrate})
}

// childMigrate opens the store and actors folder the parent names, and
// writes to the legacy actor s1, which migrates it. It kills itself with
// SIGKILL when the migration reaches the step ACTOR_KILL_AT.
func childMigrate() error {
	ctx := context.Background()
	store, err := sqlitekv.Open(ctx, os.Getenv("ACTOR_KV"), nil)
	if err != nil {
		return err
	}
	h, err := Open(Options{Dir: os.Getenv("ACTOR_DIR"), Store: store, Agent: legacyAgent, HostID: "crash-host"})
	if err != nil {
		return err
	}
	c, err := Define(h, "session", func() json.RawMessage { return json.RawMessage(`{}`) })
	if err != nil {
		return err
	}
	kill := os.Getenv("ACTOR_KILL_AT")
	testHook = func(step string) {
		fmt.Println("step", step)
		if step == kill {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	a, err := c.Actor("s1")
	if err != nil {
		return err
	}
	if _, err := a.SetState(ctx, []byte(`{"status":"patched"}`)); err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}

// migrationSteps are the hook points of a migration, in order.
var migrationSteps = []string{"claimed", "filled", "built", "linked", "created", "marked", "deleted-one", "deleted", "done"}

// TestMigrationSurvivesSIGKILLAtEveryStep kills a migrating process at each
// step and checks that the actor stays whole: before the database is
// durable and marked, another host still reads the key-value records;
// after, it refuses naming the migrating host; the migrating host always
// reads every record, and its next write finishes the migration with each
// record exactly once and the old keys gone.
func TestMigrationSurvivesSIGKILLAtEveryStep(t *testing.T) {
	const n = 40
	for _, step := range append(slices.Clone(migrationSteps), "none") {
		t.Run(step, func(t *testing.T) {
			ctx := context.Background()
			root := t.TempDir()
			kvPath, dir := filepath.Join(root, "kv.db"), filepath.Join(root, "actors")
			store, err := sqlitekv.Open(ctx, kvPath, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { store.Close() })
			seedLegacy(t, store, "s1", n, time.Now().Add(time.Hour))

			out, killed := runChild(t, "ACTOR_KV="+kvPath, "ACTOR_DIR="+dir, "ACTOR_KILL_AT="+step)
			if step == "none" {
				if killed || !strings.Contains(out, "done") {
					t.Fatalf("the child without a kill did not finish:\n%s", out)
				}
			} else if !killed || !strings.Contains(out, "step "+step+"\n") {
				t.Fatalf("the child was not killed at %s:\n%s", step, out)
			}
			reached := slices.Index(migrationSteps, step)
			if step == "none" {
				reached = len(migrationSteps)
			}
			wantState := legacyStateJSON
			if step == "none" {
				wantState = `{"status":"patched","lastReply":"old","at":12345678901234567890}`
			}

			// Another host, without the database.
			_, cb := legacyHost(t, store, filepath.Join(root, "other"), "host-b")
			b := actorOf(t, cb, "s1")
			if reached < slices.Index(migrationSteps, "marked") {
				checkLegacyReads(t, b, n, wantState)
			} else if _, err := b.State(ctx); !errors.Is(err, ErrMigrated) || !strings.Contains(err.Error(), "crash-host") {
				t.Fatalf("another host after the marker = %v; want a refusal naming crash-host", err)
			}

			// The migrating host, restarted.
			_, ca := legacyHost(t, store, dir, "crash-host")
			a := actorOf(t, ca, "s1")
			checkLegacyReads(t, a, n, wantState)
			st, err := a.SetState(ctx, []byte(`{"status":"patched"}`))
			if err != nil {
				t.Fatalf("the write after the crash: %v", err)
			}
			if want := `{"status":"patched","lastReply":"old","at":12345678901234567890}`; string(st) != want {
				t.Fatalf("state after the redone migration = %s, want %s", st, want)
			}
			checkLegacyReads(t, a, n, `{"status":"patched","lastReply":"old","at":12345678901234567890}`)
			checkMigrated(t, store, dir)
		})
	}
}

// checkMigrated checks the end of a migration: the marker alone is left in
// the store, naming crash-host, and no temporary file is left.
func checkMigrated(t *testing.T, store *kv.DB, dir string) {
	t.Helper()
	left := storeKeys(t, store, legacyKey(t, "s1", ""))
	if len(left) != 1 || !strings.HasSuffix(left[0], "/migrated") {
		t.Fatalf("the store holds %v after the migration; want only the marker", left)
	}
	raw, _ := store.Get(context.Background(), left[0])
	var m markerRecord
	if json.Unmarshal(raw, &m) != nil || m.State != markerMigrated || m.Host != "crash-host" {
		t.Fatalf("marker %s", raw)
	}
	for _, f := range files(t, dir) {
		if strings.Contains(f, ".tmp-") {
			t.Errorf("a temporary file is left: %s", f)
		}
	}
}

// runChild runs the test binary in the migrate role and returns its output
// and whether SIGKILL ended it.
func runChild(t *testing.T, env ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"=migrate"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return out.String(), true
		}
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	return out.String(), false
}
