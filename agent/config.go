package agent

import (
	"log/slog"
	"time"

	"agentkit/kv"
	"agentkit/memory"
	"agentkit/storage"
)

// Serving modes.
const (
	// ServingLocal serves every session from this host's disk, mirrored to
	// the store after every turn: a turn runs on the host that gets it. The
	// default.
	ServingLocal = "local"
	// ServingLedger serves sessions through the session ledger (package
	// ledger) on a shared store: a message is queued in its session's
	// inbox and the turn runs on the one host holding the session's lease,
	// committed with a fenced commit (docs/ledger.md).
	ServingLedger = "ledger"
)

// Config is what Open needs to run an agent.
type Config struct {
	// Agent is the agent to run. Required.
	Agent Agent
	// StateRoot is the host's folder (--state-root). Required. Open
	// creates its layout and holds its lock until Close.
	StateRoot string
	// Store is where sessions are mirrored, host KV lives and reminders
	// are claimed: a *kv.DB (from kv.Open), a kv.Funcs, or any value
	// implementing at least kv.Putter. Nil means the embedded default: the
	// SQLite store inside StateRoot/sessions/sessions.db, opened and closed
	// by the runtime.
	// A store given here is not closed by the runtime.
	Store any
	// StoreName labels the store in Info and logs; empty means the
	// *kv.DB's name ("custom" for other backends).
	StoreName string
	// Evals and ABs are backend-native eval-run and A/B tables
	// (storage.Config.Evals and ABs); nil means the tables derived over
	// Store.
	Evals storage.EvalTable
	ABs   storage.ABTable
	// Policy tunes mirroring and restore; the zero value means the
	// defaults.
	Policy Policy
	// Serving is ServingLocal (or empty) or ServingLedger.
	Serving string
	// Ledger tunes serving mode ledger; the zero value means the ledger's
	// defaults over the agent's store.
	Ledger LedgerOptions
	// Memory configures the memory journal; the zero value is memory on.
	Memory Memory
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
	// Reminders tunes the reminder scheduler; the zero value means its
	// defaults.
	Reminders ReminderOptions
	// Observer receives metrics callbacks; nil means none.
	Observer Observer
	// ABFlushInterval is how often this host's A/B state is merged into
	// the stored snapshot while it changes; zero means
	// abtest.DefaultFlushInterval. Close flushes once more.
	ABFlushInterval time.Duration
	// Timeouts bound turns and tool calls; the zero value means the
	// defaults (DefaultTurnTimeout, DefaultToolTimeout).
	Timeouts Timeouts
	// Now is the clock; nil means time.Now. Tests set it.
	Now func() time.Time

	// newPath, when set, builds the commit path in place of the serving
	// mode's (tests: a test double of commitPath).
	newPath func(*Runtime) (commitPath, error)
}

// Memory configures the memory journal (06-memory.md, package memory).
// The zero value is memory on, with the default journal at
// StateRoot/memory/journal.jsonl.
type Memory struct {
	// Off turns memory off: no records are appended, the first prompt
	// names no journal, and Info says so. Existing records stay.
	Off bool
	// MaxTextLength cuts a record's userMessage and result to this many
	// characters; zero means memory.DefaultMaxTextLength.
	MaxTextLength int
	// Backend replaces the default journal; nil means the default.
	Backend memory.MemoryBackend
}

// ReminderOptions tunes the reminder scheduler (package reminder). Zero
// fields take the scheduler's defaults.
type ReminderOptions struct {
	// HostID names this host in reminder claims; empty means the state
	// root's host id (stateroot.Root.HostID), which also names this host
	// in the session heads it writes.
	HostID string
	// SyncInterval is how often the store is listed for reminders created
	// on other hosts (default one minute).
	SyncInterval time.Duration
	// Lease is how long a claim holds without renewal before another host
	// may fire the reminder (default five minutes).
	Lease time.Duration
}

// Policy tunes how sessions are mirrored to the store (Debounce) and what
// Open restores from it (Restore). It is the storage binding's policy; the
// zero value means the defaults: write once per turn, restore at most 1000
// sessions, 30 days old at most, 1 GiB at most.
type Policy = storage.Policy

// RestorePolicy caps what Open loads from the store: Off, or MaxSessions,
// MaxAge and MaxTotalBytes (zero means the default of each).
type RestorePolicy = storage.RestorePolicy

// Observer receives the runtime's metrics, so a server can export them
// (Prometheus, say) without this package importing a metrics library.
// Methods are called synchronously from the runtime's goroutines and must
// be quick and safe for concurrent use. Embed NopObserver to implement only
// some of them.
type Observer interface {
	// TurnFinished is called after every turn, with how it ended and how
	// long it ran.
	TurnFinished(status TurnStatus, d time.Duration)
	// MirrorDropped is called for each mirror write the store refused (the
	// name is older than the retries): nothing is dropped, the write stays
	// in the backlog and is retried. The key is redacted where it holds a
	// continuation token.
	MirrorDropped(key string, err error)
	// MirrorBacklog is called with the number of sessions whose mirror
	// writes wait to be retried, each time it changes.
	MirrorBacklog(sessions int)
	// MirrorForked is called when a turn of this host lost the session's
	// head to another host: its events (events of them) stay on this host
	// as a fork and the session goes on from the store's history.
	MirrorForked(sessionID string, events int)
	// StoreOp is called after every store operation: op is the kv method
	// ("put", "get", "delete", "list", "get_with_version",
	// "put_if_absent", "put_if_version", "list_keys"), d its duration and
	// err its outcome (nil on success; a Get miss is an error matching
	// ErrKeyNotFound, which is kv.ErrNotFound). A listing's duration runs
	// until its iteration ends.
	StoreOp(op string, d time.Duration, err error)
}

// ErrKeyNotFound is the store's answer for a key it does not have
// (kv.ErrNotFound), as Observer.StoreOp sees it.
var ErrKeyNotFound = kv.ErrNotFound

// NopObserver is an Observer that does nothing. Embed it in an observer
// that implements only some methods.
type NopObserver struct{}

// TurnFinished does nothing.
func (NopObserver) TurnFinished(TurnStatus, time.Duration) {}

// MirrorDropped does nothing.
func (NopObserver) MirrorDropped(string, error) {}

// MirrorBacklog does nothing.
func (NopObserver) MirrorBacklog(int) {}

// MirrorForked does nothing.
func (NopObserver) MirrorForked(string, int) {}

// StoreOp does nothing.
func (NopObserver) StoreOp(string, time.Duration, error) {}
