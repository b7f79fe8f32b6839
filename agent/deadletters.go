package agent

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"agentkit/ledger"
)

// What an operator of serving mode ledger reads and does beside the
// turns: the dead letters, and the ledger's counters and settings. In
// serving mode local each answers ErrNotLedgerMode (or false).

// Errors of the dead-letter operations, matched with errors.Is.
var (
	// ErrNotLedgerMode means the operation exists only in serving mode
	// ledger, and the runtime serves in mode local.
	ErrNotLedgerMode = errors.New("agent: dead letters exist only in serving mode ledger")
	// ErrDeadLetterNotFound means no current dead letter has the session
	// and event id.
	ErrDeadLetterNotFound = errors.New("agent: no dead letter has this session and event id")
)

// DeadLetter is a message whose turn failed LedgerOptions.MaxAttempts
// times (or could not be read) and went to the dead-letter store, with
// the last attempt's error (ledger.DeadLetter).
type DeadLetter = ledger.DeadLetter

// Replay states, as ReplayDeadLetter answers them.
const (
	// ReplayQueued: the message is back in its session's inbox.
	ReplayQueued = "queued"
	// ReplayPending: the message was already pending (a replay under way):
	// nothing changed.
	ReplayPending = "pending"
	// ReplayCommitted: the message was consumed by the turn CommitSeq:
	// nothing changed.
	ReplayCommitted = "committed"
)

// Replayed is ReplayDeadLetter's answer.
type Replayed struct {
	// State is ReplayQueued, ReplayPending or ReplayCommitted.
	State string
	// CommitSeq is the turn that consumed a committed message.
	CommitSeq uint64
}

// ledgerOps are the operators' calls of serving mode ledger: the ledger
// path's, or notLedger's answers in serving mode local (Open picks).
type ledgerOps interface {
	deadLetters(ctx context.Context, sessionID string) iter.Seq2[DeadLetter, error]
	replay(ctx context.Context, sessionID, eventID string) (Replayed, error)
	drop(ctx context.Context, sessionID, eventID string) error
	ledgerStats() (LedgerStats, bool)
	ledgerSettings() (LedgerSettings, bool)
}

// notLedger answers the operators' calls in serving mode local.
type notLedger struct{}

func (notLedger) deadLetters(context.Context, string) iter.Seq2[DeadLetter, error] {
	return func(yield func(DeadLetter, error) bool) { yield(DeadLetter{}, ErrNotLedgerMode) }
}
func (notLedger) replay(context.Context, string, string) (Replayed, error) {
	return Replayed{}, ErrNotLedgerMode
}
func (notLedger) drop(context.Context, string, string) error { return ErrNotLedgerMode }
func (notLedger) ledgerStats() (LedgerStats, bool)           { return LedgerStats{}, false }
func (notLedger) ledgerSettings() (LedgerSettings, bool)     { return LedgerSettings{}, false }

// DeadLetters yields the current dead letters of one session, or of every
// session when sessionID is empty, in key order. In serving mode local it
// yields ErrNotLedgerMode.
func (r *Runtime) DeadLetters(ctx context.Context, sessionID string) iter.Seq2[DeadLetter, error] {
	return r.lops.deadLetters(ctx, sessionID)
}

func (lp *ledgerPath) deadLetters(ctx context.Context, sessionID string) iter.Seq2[DeadLetter, error] {
	return func(yield func(DeadLetter, error) bool) {
		for dl, err := range lp.led.DeadLetters(ctx, sessionID) {
			if err != nil {
				yield(DeadLetter{}, deadLetterErr(sessionID, err))
				return
			}
			if !yield(dl, nil) {
				return
			}
		}
	}
}

// ReplayDeadLetter puts a dead letter back in its session's inbox, under
// its event id, for the host holding the session to run. A message that is
// pending or committed again is left as it is. Errors: ErrNotLedgerMode,
// ErrDeadLetterNotFound, ErrSessionNotFound (a deleted session's dead
// letters went with it), an *InboxFullError, ErrStoreUnavailable.
func (r *Runtime) ReplayDeadLetter(ctx context.Context, sessionID, eventID string) (Replayed, error) {
	return r.lops.replay(ctx, sessionID, eventID)
}

func (lp *ledgerPath) replay(ctx context.Context, sessionID, eventID string) (Replayed, error) {
	d, err := lp.led.Replay(ctx, sessionID, eventID)
	if err != nil {
		return Replayed{}, deadLetterErr(sessionID, err)
	}
	switch {
	case d.Duplicate && d.State == ledger.StateCommitted:
		return Replayed{State: ReplayCommitted, CommitSeq: d.CommitSeq}, nil
	case d.Duplicate:
		return Replayed{State: ReplayPending}, nil
	}
	return Replayed{State: ReplayQueued}, nil
}

// DropDeadLetter removes a dead letter for good. Errors as
// ReplayDeadLetter's.
func (r *Runtime) DropDeadLetter(ctx context.Context, sessionID, eventID string) error {
	return r.lops.drop(ctx, sessionID, eventID)
}

func (lp *ledgerPath) drop(ctx context.Context, sessionID, eventID string) error {
	if err := lp.led.Drop(ctx, sessionID, eventID); err != nil {
		return deadLetterErr(sessionID, err)
	}
	return nil
}

// deadLetterErr maps a ledger error of the dead-letter operations.
func deadLetterErr(sessionID string, err error) error {
	if errors.Is(err, ledger.ErrNotDeadLettered) {
		return fmt.Errorf("%w: %w", ErrDeadLetterNotFound, err)
	}
	return ledgerErr(sessionID, err)
}

// LedgerStats are the ledger's counters (ledger.Stats).
type LedgerStats = ledger.Stats

// LedgerStats returns the ledger's counters, and false in serving mode
// local.
func (r *Runtime) LedgerStats() (LedgerStats, bool) { return r.lops.ledgerStats() }

func (lp *ledgerPath) ledgerStats() (LedgerStats, bool) { return lp.led.Stats(), true }

// LedgerSettings returns the settings the ledger runs with, defaults
// filled in, and false in serving mode local.
func (r *Runtime) LedgerSettings() (LedgerSettings, bool) { return r.lops.ledgerSettings() }

func (lp *ledgerPath) ledgerSettings() (LedgerSettings, bool) { return lp.led.Settings(), true }
