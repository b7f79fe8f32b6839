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
	// (Config.Store). It needs Get, Delete and ListKeys and the whole CAS
	// group (GetWithVersion, PutIfAbsent, PutIfVersion), and must be
	// shared by every host of the agent: the memory driver is refused
	// unless AllowProcessLocal is set.
	Store *kv.DB
	// HostID names this host in control records; empty means the state
	// root's host id, with a suffix new at every Open.
	HostID string
	// Tuning is the lease (Lease, Margin, DriftAllowance), the inbox
	// limits (MaxAttempts before a message is dead-lettered; MaxPending
	// and MaxPendingBytes, past which a message is refused with
	// ErrInboxFull; MaxEventBytes, past which it is ErrTooLarge;
	// DedupWindow, RetryAfter), how long an Idempotency-Key is kept
	// (IdempotencyWindow, ClockSkew, MaxKeys) and the pace of the janitor
	// and of following (JanitorInterval, FollowInterval): ledger.Tuning
	// documents each field and its default.
	ledger.Tuning
	// AllowProcessLocal accepts a coordination store that lives in this
	// process (the memory driver), for tests.
	AllowProcessLocal bool
	// OnDeliver, when set, sees every delivery's answer, duration and
	// error (ledger.Options.OnDeliver); server.Serve sets it to its
	// metrics' ack latency histogram.
	OnDeliver func(d LedgerDelivery, took time.Duration, err error)
}

// LedgerDelivery is a delivery's answer as LedgerOptions.OnDeliver sees
// it (ledger.Delivery).
type LedgerDelivery = ledger.Delivery

// LedgerSettings are the settings a ledger runs with, defaults filled in
// (ledger.Settings).
type LedgerSettings = ledger.Settings
