package ledger

import (
	"errors"
	"fmt"
	"time"

	"agentkit/record"
)

// Errors matched with errors.Is.
var (
	// ErrBusy means a delivery was refused because the session's inbox is
	// full (by count or by bytes), or, for a keyed event, because the
	// session keeps MaxKeys idempotency keys. Nothing was acknowledged;
	// the source should retry after the BusyError's RetryAfter. The server
	// maps it to HTTP 429 with a Retry-After header.
	ErrBusy = errors.New("ledger: the session's inbox is full")
	// ErrDeleted means the session was deleted: its control record is a
	// tombstone, and it accepts no delivery and serves no transcript.
	ErrDeleted = errors.New("ledger: the session was deleted")
	// ErrUnknownSession means no control record exists for the session.
	ErrUnknownSession = errors.New("ledger: unknown session")
	// ErrUnknownEvent means the event id is neither pending nor among the
	// session's recent event ids (the de-duplication window) nor, for a
	// keyed event, kept: it was never delivered, or it was consumed so
	// long ago that the window (and the IdempotencyWindow) has moved past
	// it.
	ErrUnknownEvent = errors.New("ledger: unknown event")
	// ErrDeadLettered means the event went to the dead-letter store after
	// MaxAttempts attempts.
	ErrDeadLettered = errors.New("ledger: the event was dead-lettered")
	// ErrFenced means this host no longer holds the session's lease: another
	// host took the session over (a higher generation) or the session was
	// deleted. A commit that fails with it was not applied, and its output
	// is discarded.
	ErrFenced = errors.New("ledger: the lease was lost to another holder")
	// ErrSelfFenced is the cause of a turn's context when the holder has
	// gone lease × (1 − DriftAllowance) without a successful renewal: it can
	// no longer be sure it holds the lease, so it starts no new side effect.
	ErrSelfFenced = errors.New("ledger: lease renewal overdue; no new side effects")
	// ErrClosed means the Ledger was closed.
	ErrClosed = errors.New("ledger: closed")
	// ErrTooLarge means an event payload or an event id exceeds its limit.
	ErrTooLarge = errors.New("ledger: too large")
	// ErrFormat means a stored record was written by a newer agentkit (a
	// higher format version, record.ErrNewerFormat) or is not a ledger
	// record (record.ErrBadRecord); it is never misread. It is
	// record.ErrUnreadable.
	ErrFormat = record.ErrUnreadable
	// ErrMemoryStore means a process-local store (the memory driver) was
	// given to a Ledger without Options.AllowProcessLocal.
	ErrMemoryStore = errors.New("ledger: the store keeps its data in this process only")
	// ErrNotDeadLettered means Replay or Drop named an event with no
	// dead-letter record.
	ErrNotDeadLettered = errors.New("ledger: no such dead letter")
)

// BusyError is the error of a delivery refused by back-pressure. It
// matches ErrBusy.
type BusyError struct {
	SessionID    string
	Pending      int   // events pending when the delivery was refused
	PendingBytes int64 // their payload bytes
	// RetryAfter is how long the source should wait before retrying.
	RetryAfter time.Duration
	// Keys is set when the limit reached is MaxKeys, not the inbox's: the
	// kept keys of the session's keyed events (RetryAfter then waits for
	// the oldest to expire).
	Keys int
}

// Error says which limit was reached.
func (e *BusyError) Error() string {
	if e.Keys > 0 {
		return fmt.Sprintf("ledger: session %q keeps %d idempotency keys, at its limit (MaxKeys); a keyed event can be queued again once the oldest expire, after %s",
			e.SessionID, e.Keys, e.RetryAfter)
	}
	return fmt.Sprintf("ledger: session %q has %d events (%d bytes) pending, at its limit; retry after %s",
		e.SessionID, e.Pending, e.PendingBytes, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrBusy) true.
func (e *BusyError) Unwrap() error { return ErrBusy }

// FencedError is the error of a write refused because the lease moved on.
// It matches ErrFenced.
type FencedError struct {
	SessionID string
	// Generation is the generation this host held.
	Generation uint64
	// Current is the generation in the control record, and Holder its
	// holder ("" for none); Deleted is true for a tombstone.
	Current uint64
	Holder  string
	Deleted bool
}

// Error names both generations.
func (e *FencedError) Error() string {
	if e.Deleted {
		return fmt.Sprintf("ledger: session %q was deleted while generation %d held it", e.SessionID, e.Generation)
	}
	return fmt.Sprintf("ledger: session %q is at generation %d (holder %q); this host held generation %d",
		e.SessionID, e.Current, e.Holder, e.Generation)
}

// Unwrap makes errors.Is(err, ErrFenced) true, and ErrDeleted too for a
// tombstone.
func (e *FencedError) Unwrap() []error {
	if e.Deleted {
		return []error{ErrFenced, ErrDeleted}
	}
	return []error{ErrFenced}
}

// PermanentError marks a Handler's error as one that no retry fixes (an
// event this agent cannot read, say): the event goes to the dead-letter
// store after this attempt, with the error as its last error, instead of
// being tried again until MaxAttempts. Make one with Permanent.
type PermanentError struct {
	Err error
}

// Permanent wraps err as a PermanentError; Permanent(nil) is nil. A turn
// whose context has ended (the lease was lost, or renewal is overdue) is
// tried again even if its Handler returns a PermanentError: the error may
// come from the cancellation, and the next holder decides afresh.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Error is the wrapped error's.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }
