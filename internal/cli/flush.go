package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"agentkit/agent"
)

func init() {
	register(command{name: "flush", summary: "write what this host owes the store, before moving the agent to serving: ledger", run: runFlush})
}

const flushUsage = `flush [--dir DIR] [--state-root DIR] [--storage URL]

Writes what this host's state root owes the store in serving mode local:
turns whose commit the store refused or never answered, and their sessions'
metadata, index entries and tokens, which a running server retries in the
background. The server on the state root must be stopped (flush opens it).
It exits 0 once the store has everything; while the store refuses something it says how many sessions
still owe writes and exits 1, and can be run again.

Run it on every host of serving mode local, with its server stopped, before
switching the agent to serving: ledger. A host of serving mode ledger adopts
a session of serving mode local from the store, and marks it moved there so
that no host of serving mode local writes to it again: a turn a host still
owed the store at that moment would stay on that host only.`

func runFlush(e *env, args []string) error {
	var dir, stateRoot, storage, logLevel string
	fs := newFlags(e, "flush", flushUsage)
	fs.StringVar(&dir, "dir", "", "the project folder, holding agentkit.yaml (default: the current folder if it has one)")
	fs.StringVar(&stateRoot, "state-root", "", "the host's state root (default DIR/.agentkit)")
	fs.StringVar(&storage, "storage", "", "store URL, overriding storage: in agentkit.yaml")
	fs.StringVar(&logLevel, "log-level", "warn", "log level on standard error: debug, info, warn or error")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("flush takes no arguments (got %q)", pos[0])
	}
	log, err := newLogger(e.stderr, "text", logLevel)
	if err != nil {
		return err
	}
	p, err := findProject(dir)
	if err != nil {
		return err
	}
	if stateRoot == "" {
		stateRoot = filepath.Join(p.dir, ".agentkit")
	}
	if _, err := os.Stat(stateRoot); err != nil {
		return usagef("--state-root %s: %v; name the state root of the host to flush", stateRoot, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// What is owed was written in serving mode local, whatever the file
	// says now; nothing needs restoring to write it.
	rc, closeStore, err := p.runtimeConfig(ctx, agent.ServingLocal, storage)
	var ue *usageError
	if errors.As(err, &ue) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%w; this host may still owe the store writes: run agentkit flush again once the store answers", err)
	}
	defer closeStore()
	if rc.Store == nil {
		return usagef("flush writes to a shared store, and this agent uses the embedded default store of its state root, which owes nothing; set --storage or storage: in agentkit.yaml")
	}
	rc.StateRoot, rc.Logger = stateRoot, log
	rc.Policy.Restore.Off = true
	rt, err := agent.Open(ctx, rc)
	if err != nil {
		return err
	}
	owed, err := rt.Flush(ctx)
	if cerr := rt.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if owed > 0 {
		return fmt.Errorf("%d sessions still owe the store writes (it refused them; the log says why); run agentkit flush again", owed)
	}
	fmt.Fprintln(e.stdout, "the store has everything this host wrote; it owes no writes")
	return nil
}
