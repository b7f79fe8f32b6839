package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"agentkit/agent"
)

func init() {
	register(command{name: "run", summary: "run one turn of the agent and print the answer and continuation token", run: runRun})
}

const runUsage = `run [--dir DIR] [--state-root DIR] [--storage URL] [--continue TOKEN] [--json] MESSAGE

Runs one turn: a new session with MESSAGE, or with --continue a follow-up in
the session the token names. The agent is DIR/agentkit.yaml; without --dir,
the current folder's agentkit.yaml, or when there is none the built-in agent
(the echo model, no set-up). Without --state-root the turn runs in a fresh
temporary state root, removed afterwards (so memory starts empty). Prints the
answer, then the session id and the continuation token.`

func runRun(e *env, args []string) error {
	var dir, stateRoot, storage, token, logLevel string
	var asJSON bool
	var timeouts timeoutFlags
	fs := newFlags(e, "run", runUsage)
	fs.StringVar(&dir, "dir", "", "the project folder, holding agentkit.yaml (default: the current folder if it has one, else the built-in agent)")
	fs.StringVar(&stateRoot, "state-root", "", "the state root to use and keep (default: a temporary one, removed afterwards)")
	fs.StringVar(&storage, "storage", "", "store URL, overriding storage: in agentkit.yaml")
	fs.StringVar(&token, "continue", "", "continue the session of this continuation token instead of starting one")
	fs.BoolVar(&asJSON, "json", false, "print the answer as the JSON of POST /v1/sessions")
	fs.StringVar(&logLevel, "log-level", "warn", "log level on standard error: debug, info, warn or error")
	timeouts.register(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := timeouts.check(); err != nil {
		return err
	}
	message := strings.Join(pos, " ")
	if strings.TrimSpace(message) == "" {
		return usagef("run needs a MESSAGE; usage: agentkit run [flags] MESSAGE")
	}
	log, err := newLogger(e.stderr, "text", logLevel)
	if err != nil {
		return err
	}
	p, err := findProject(dir)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rc, closeStore, err := p.runtimeConfig(ctx, "", storage)
	if err != nil {
		return err
	}
	defer closeStore()
	timeouts.apply(&rc)
	ephemeral := stateRoot == ""
	if ephemeral {
		if token != "" && rc.Store == nil {
			return usagef("--continue needs the session's --state-root (or a shared --storage): a temporary state root holds no sessions")
		}
		if stateRoot, err = os.MkdirTemp("", "agentkit-run-"); err != nil {
			return err
		}
		defer os.RemoveAll(stateRoot)
	}
	rc.StateRoot = stateRoot
	rc.Logger = log
	rt, err := agent.Open(ctx, rc)
	if err != nil {
		return err
	}
	defer rt.Close()

	var res agent.TurnResult
	if token != "" {
		res, err = rt.Continue(ctx, agent.ContinueRequest{Token: token, Message: message})
	} else {
		res, err = rt.StartSession(ctx, agent.StartRequest{Message: message, ChannelID: "cli"})
	}
	if err != nil {
		return err
	}
	if asJSON {
		b, _ := json.MarshalIndent(res, "", "  ")
		fmt.Fprintf(e.stdout, "%s\n", b)
	} else {
		fmt.Fprintln(e.stdout, res.Turn.Result)
		fmt.Fprintf(e.stdout, "\nsession: %s\ncontinuation token: %s\n", res.SessionID, res.ContinuationToken)
	}
	if ephemeral && rc.Store == nil {
		fmt.Fprintln(e.stderr, "(the state root was temporary and is removed; run with --state-root DIR to keep the session and --continue TOKEN to go on with it)")
	}
	if res.Turn.Status != agent.StatusCompleted {
		return fmt.Errorf("the turn %s: %s", res.Turn.Status, res.Turn.Result)
	}
	return nil
}
