package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"agentkit/ledger"
	agentstorage "agentkit/storage"
)

func init() {
	register(command{name: "deadletters", summary: "list, replay or drop the dead letters of serving mode ledger", run: runDeadLetters})
}

const deadLettersUsage = `deadletters ls [--session ID] | replay SESSION EVENT | drop SESSION EVENT [flags]

  ls      lists the dead letters (messages that failed every attempt):
          session, event id, attempts, when, last error; --json prints one
          JSON object a line, with the payload
  replay  puts a dead-lettered message back at the end of its session's
          inbox with its attempts reset and the same event id; a serving
          host picks the session up at its janitor's next scan
  drop    deletes a dead letter for good

The store is the ledger's: --storage, else ledger.store: or storage: in
agentkit.yaml. The command never runs a turn nor holds a session. The agent name comes from
agentkit.yaml (--dir, default the current folder) or --agent.`

type deadLetterFlags struct {
	dir, storage, agent, session string
	json                         bool
}

func runDeadLetters(e *env, args []string) error {
	if len(args) == 0 {
		return usagef("deadletters: name a subcommand: ls, replay or drop (run \"agentkit deadletters -h\" for the usage)")
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		fmt.Fprintln(e.stdout, "Usage: agentkit "+deadLettersUsage)
		return nil
	}
	sub := args[0]
	switch sub {
	case "ls", "replay", "drop":
	default:
		return usagef("deadletters: unknown subcommand %q; use ls, replay or drop", sub)
	}
	var f deadLetterFlags
	fs := newFlags(e, "deadletters "+sub, deadLettersUsage)
	fs.StringVar(&f.dir, "dir", "", "the project folder, holding agentkit.yaml (default: the current folder if it has one)")
	fs.StringVar(&f.storage, "storage", "", "URL of the store holding the ledger, overriding ledger.store: and storage: in agentkit.yaml")
	fs.StringVar(&f.agent, "agent", "", "the agent name, overriding name: in agentkit.yaml")
	if sub == "ls" {
		fs.StringVar(&f.session, "session", "", "list the dead letters of this session only")
		fs.BoolVar(&f.json, "json", false, "print one JSON object a line, payload included")
	}
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	switch {
	case sub == "ls" && len(pos) != 0:
		return usagef("deadletters ls takes no arguments, got %q; name a session with --session ID", pos[0])
	case sub != "ls" && len(pos) != 2:
		return usagef("deadletters %s: wrong number of arguments; usage: agentkit deadletters %s SESSION EVENT", sub, sub)
	case sub != "ls" && (pos[0] == "" || pos[1] == ""):
		return usagef("deadletters %s: the session id and the event id must not be empty", sub)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, closeAll, err := openPassiveLedger(ctx, f)
	if err != nil {
		return err
	}
	defer closeAll()
	switch sub {
	case "ls":
		return listDeadLetters(ctx, e.stdout, l, f.session, f.json)
	case "replay":
		d, err := l.Replay(ctx, pos[0], pos[1])
		if err != nil {
			return deadLetterError(err)
		}
		switch {
		case d.Duplicate && d.State == ledger.StateCommitted:
			fmt.Fprintf(e.stdout, "event %s of session %s is not dead-lettered: turn %d consumed it; nothing changed\n", d.EventID, d.SessionID, d.CommitSeq)
		// InboxSeq numbers the messages a session's inbox has ever taken;
		// it is not a count of the messages ahead.
		case d.Duplicate:
			fmt.Fprintf(e.stdout, "event %s of session %s is already pending in its inbox (inbox sequence number %d); nothing changed\n", d.EventID, d.SessionID, d.InboxSeq)
		case d.Holder != "":
			fmt.Fprintf(e.stdout, "replayed: event %s is back at the end of session %s's inbox (inbox sequence number %d) with its attempts reset; host %s runs it\n", d.EventID, d.SessionID, d.InboxSeq, d.Holder)
		default:
			fmt.Fprintf(e.stdout, "replayed: event %s is back at the end of session %s's inbox (inbox sequence number %d) with its attempts reset; a serving host takes it at its next janitor scan\n", d.EventID, d.SessionID, d.InboxSeq)
		}
		return nil
	default: // drop
		if err := l.Drop(ctx, pos[0], pos[1]); err != nil {
			return deadLetterError(err)
		}
		fmt.Fprintf(e.stdout, "dropped: the dead letter of event %s of session %s is gone\n", pos[1], pos[0])
		return nil
	}
}

// openPassiveLedger opens the agent's store and a ledger over it that
// never holds a session.
func openPassiveLedger(ctx context.Context, f deadLetterFlags) (*ledger.Ledger, func(), error) {
	p, err := findProject(f.dir)
	if err != nil {
		return nil, nil, err
	}
	name, storage := f.agent, f.storage
	if p.file != nil {
		if name == "" {
			name = p.file.Name
		}
		if storage == "" {
			// The coordination store: ledger.store, else the agent's.
			storage = p.file.LedgerStore
		}
		if storage == "" {
			storage = p.file.Storage
		}
	}
	if name == "" {
		return nil, nil, usagef("deadletters: no agent name: run it in a project folder (agentkit.yaml), give --dir, or --agent NAME")
	}
	if storage == "" {
		return nil, nil, usagef("deadletters: no store: serving mode ledger keeps its dead letters in the agent's shared store; give --storage URL, or run it where agentkit.yaml sets storage: (or ledger.store:)")
	}
	db, err := openStore(ctx, kvFlags{storage: storage}, false)
	if err != nil {
		return nil, nil, err
	}
	l, err := ledger.Open(ledger.Options{
		Store: db, Agent: name, Passive: true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		db.Close()
		if errors.Is(err, agentstorage.ErrNoCAS) || errors.Is(err, ledger.ErrMemoryStore) {
			return nil, nil, usagef("--storage: %v", err)
		}
		return nil, nil, err
	}
	return l, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l.Close(cctx)
		db.Close()
	}, nil
}

// deadLetterJSON is one line of deadletters ls --json.
type deadLetterJSON struct {
	SessionID string          `json:"sessionId"`
	EventID   string          `json:"eventId"`
	Attempts  int             `json:"attempts"`
	LastError string          `json:"lastError,omitempty"`
	At        time.Time       `json:"at"`
	Payload   json.RawMessage `json:"payload,omitempty"`
}

func listDeadLetters(ctx context.Context, w io.Writer, l *ledger.Ledger, session string, asJSON bool) error {
	var tw *tabwriter.Writer
	n := 0
	for d, err := range l.DeadLetters(ctx, session) {
		if err != nil {
			return fmt.Errorf("listing the dead letters: %w", err)
		}
		if asJSON {
			b, err := json.Marshal(deadLetterJSON{SessionID: d.SessionID, EventID: d.EventID, Attempts: d.Attempts, LastError: d.LastError, At: d.At.UTC(), Payload: d.Payload})
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
				return err
			}
			continue
		}
		if tw == nil {
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tEVENT\tATTEMPTS\tWHEN\tLAST ERROR")
		}
		lastErr := d.LastError
		if lastErr == "" {
			// The ledger records an attempt's error with its next write: a
			// host that stopped during the attempt (or just after it) left
			// none.
			lastErr = noErrorRecorded
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", printableKey(d.SessionID), printableKey(d.EventID), d.Attempts,
			d.At.UTC().Format(time.RFC3339), clipText(oneLineText(lastErr), 200))
		n++
	}
	if tw != nil {
		return tw.Flush()
	}
	if !asJSON && n == 0 {
		if session != "" {
			fmt.Fprintf(w, "no dead letters in session %s\n", session)
		} else {
			fmt.Fprintln(w, "no dead letters")
		}
	}
	return nil
}

// noErrorRecorded is the LAST ERROR of a dead letter whose attempts left
// no error in the ledger.
const noErrorRecorded = "none recorded: the host stopped during the attempt, before it could record one (a crash, a kill or a lost lease)"

// oneLineText folds line breaks and tabs into spaces, so a table row stays
// one line.
func oneLineText(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
}

// deadLetterError words the ledger's refusals for the command line.
func deadLetterError(err error) error {
	var be *ledger.BusyError
	switch {
	case errors.Is(err, ledger.ErrNotDeadLettered):
		return fmt.Errorf("%s (agentkit deadletters ls lists them)", strings.TrimPrefix(err.Error(), "ledger: "))
	case errors.As(err, &be):
		return fmt.Errorf("session %s's inbox is full (%d messages pending); nothing was replayed: retry in %s", be.SessionID, be.Pending, be.RetryAfter)
	case errors.Is(err, ledger.ErrDeleted):
		return fmt.Errorf("%s; its dead letters went with it", strings.TrimPrefix(err.Error(), "ledger: "))
	}
	return err
}
