package agent

import (
	"time"

	"agentkit/kv"
	"agentkit/ledger"
)

// LedgerOptions tunes serving mode ledger (Config.Serving =
// ServingLedger): the session ledger that lets several hosts serve one
// agent's sessions through one shared store (package ledger,
// docs/ledger.md). Zero fields take the ledger's defaults; the options are
// ignored in serving mode local.
type LedgerOptions struct {
	// Store is the coordination store; nil means the agent's store
	// (Config.Store). It needs the whole CAS group (GetWithVersion,
	// PutIfAbsent, PutIfVersion) and must be shared by every host of the
	// agent: the memory driver is refused unless AllowProcessLocal is set.
	Store *kv.DB
	// HostID names this host in control records; empty means the state
	// root's host id.
	HostID string
	// Lease is how long a holder's lease lasts without renewal
	// (ledger.DefaultLease); Margin is added before another host takes a
	// silent session over (Lease/5).
	Lease  time.Duration
	Margin time.Duration
	// DriftAllowance is the fraction of Lease the holder gives up to clock
	// rate differences (ledger.DefaultDriftAllowance).
	DriftAllowance float64
	// MaxAttempts is how many times a turn may start on one message
	// before it goes to the dead-letter store (ledger.DefaultMaxAttempts).
	MaxAttempts int
	// MaxPending and MaxPendingBytes cap a session's queued messages by
	// count and by bytes (ledger.DefaultMaxPending,
	// ledger.DefaultMaxPendingBytes); past either a message is refused
	// with ErrBusy.
	MaxPending      int
	MaxPendingBytes int64
	// MaxEventBytes bounds one queued message (ledger.DefaultMaxEventBytes);
	// a larger one is refused with ErrTooLarge.
	MaxEventBytes int
	// DedupWindow is how many consumed message ids each session remembers
	// (ledger.DefaultDedupWindow).
	DedupWindow int
	// RetryAfter is the wait a refused delivery suggests
	// (ledger.DefaultRetryAfter).
	RetryAfter time.Duration
	// JanitorInterval is the mean pause between janitor scans (Lease/2).
	JanitorInterval time.Duration
	// FollowInterval is how often a host re-reads a session it does not
	// hold while it waits for a turn (ledger.DefaultFollowInterval).
	FollowInterval time.Duration
	// AllowProcessLocal accepts a coordination store that lives in this
	// process (the memory driver), for tests.
	AllowProcessLocal bool
}

// Ledger returns the session ledger in serving mode ledger, nil in serving
// mode local. Tools that do not serve turns (dead letters, metrics) use it.
func (r *Runtime) Ledger() *ledger.Ledger { return r.led }
