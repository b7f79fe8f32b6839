package agent

import (
	"errors"
	"fmt"
	"time"
)

// Errors the runtime returns, matched with errors.Is. The HTTP server maps
// them to statuses: ErrUnknownToken, ErrSessionNotFound and
// ErrReminderNotFound to 404, ErrStoreUnavailable to 503, ErrInvalid to
// 400, ErrBusy to 409.
var (
	// ErrUnknownToken means no session has the continuation token, here or
	// in the store. It never starts a new session.
	ErrUnknownToken = errors.New("agent: unknown continuation token")
	// ErrSessionNotFound means no session has the id.
	ErrSessionNotFound = errors.New("agent: session not found")
	// ErrReminderNotFound means no reminder has the id.
	ErrReminderNotFound = errors.New("agent: reminder not found")
	// ErrStoreUnavailable means the store failed while the runtime needed
	// an answer from it (resolving a token, loading a session, a reminder
	// write). The request can be retried.
	ErrStoreUnavailable = errors.New("agent: store unavailable")
	// ErrInvalid means the request is malformed. The error is an
	// *InvalidError naming the field.
	ErrInvalid = errors.New("agent: invalid request")
	// ErrReservedPath means a workspace file was under memory/, which is
	// reserved for the memory journal. It comes inside an *InvalidError.
	ErrReservedPath = errors.New("agent: reserved workspace path")
	// ErrBusy means the session's turn did not start before the context
	// ended, because another turn of the session was running.
	ErrBusy = errors.New("agent: session busy")
	// ErrClosed means the runtime was closed.
	ErrClosed = errors.New("agent: runtime closed")
	// ErrInboxFull means a message was refused because its session has as
	// many messages queued as serving mode ledger allows (by count or by
	// bytes), or, for a message with an Idempotency-Key, keeps as many
	// keys as it allows (ledger.maxKeys): nothing was accepted. The error
	// is an *InboxFullError carrying how long to wait; the HTTP server
	// answers 429 with Retry-After.
	ErrInboxFull = errors.New("agent: the session's queue of messages is full")
	// ErrTooLarge means a message is over serving mode ledger's limit on
	// one queued message (LedgerOptions.MaxEventBytes), or its
	// Idempotency-Key over the ledger's limit on an event id. The HTTP
	// server answers 413.
	ErrTooLarge = errors.New("agent: message too large")
	// ErrSessionMoved means, in serving mode local, that the session moved
	// to serving mode ledger: a host of serving mode ledger adopted it
	// (its head in the store is marked moved), and a host of serving mode
	// local neither runs nor commits its turns any more. The HTTP server
	// answers 409.
	ErrSessionMoved = errors.New("agent: the session moved to serving mode ledger; send its requests to a host of serving mode ledger")
	// ErrDeadLettered means, in serving mode ledger, that the message's
	// turn failed LedgerOptions.MaxAttempts times and the message went to
	// the dead-letter store; the session moved on without it.
	ErrDeadLettered = errors.New("agent: the message was dead-lettered")
)

// Errors of a follow-up's precondition (ContinueRequest.IfLastSeq),
// matched with errors.Is; the error is a *PositionError naming where the
// session is. The HTTP server answers 412 and 409.
var (
	// ErrPreconditionFailed means the session no longer ends at the event
	// the client saw last: nothing ran.
	ErrPreconditionFailed = errors.New("agent: the session moved on since the event the client saw")
	// ErrTurnForked means the turn ran, and another host committed a turn
	// of the session from the same point first: the turn is recorded as a
	// fork (EventTurnForked) in the session's history.
	ErrTurnForked = errors.New("agent: the turn was forked: another host committed a turn of the session first")
)

// PositionError is ErrPreconditionFailed or ErrTurnForked with where the
// session is.
type PositionError struct {
	SessionID string
	// LastSeq is the sequence number of the session's last event now;
	// IfLastSeq the one the request named.
	LastSeq, IfLastSeq int64
	// Err is ErrPreconditionFailed or ErrTurnForked.
	Err error
}

// Error says where the session is and what to do.
func (e *PositionError) Error() string {
	if errors.Is(e.Err, ErrTurnForked) {
		return fmt.Sprintf("agent: session %s: the turn was recorded as a fork (another host committed a turn after event %d first); the session is at event %d: read its events after %d", e.SessionID, e.IfLastSeq, e.LastSeq, e.IfLastSeq)
	}
	return fmt.Sprintf("agent: session %s is at event %d, not %d: read its events after %d, then send again with ifLastSeq %d", e.SessionID, e.LastSeq, e.IfLastSeq, e.IfLastSeq, e.LastSeq)
}

// Unwrap returns ErrPreconditionFailed or ErrTurnForked.
func (e *PositionError) Unwrap() error { return e.Err }

// InboxFullError is ErrInboxFull with the wait the ledger suggests.
type InboxFullError struct {
	SessionID string
	// Pending is the number of messages queued when this one was refused.
	Pending int
	// RetryAfter is how long to wait before sending the message again.
	RetryAfter time.Duration
	// Keys is set when the limit reached is the session's kept
	// Idempotency-Keys (ledger.maxKeys), not its queue: a message with a
	// key waits for the oldest keys to expire; one without a key is not
	// limited.
	Keys int
}

// Error says how full the queue is and when to retry.
func (e *InboxFullError) Error() string {
	if e.Keys > 0 {
		return fmt.Sprintf("agent: session %s keeps %d Idempotency-Keys, at its limit (ledger.maxKeys); send the message again after %v, once the oldest have expired", e.SessionID, e.Keys, e.RetryAfter)
	}
	return fmt.Sprintf("agent: session %s has %d messages queued, at its limit; send the message again after %v", e.SessionID, e.Pending, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrInboxFull) true.
func (e *InboxFullError) Unwrap() error { return ErrInboxFull }

// InvalidError is a request the runtime refuses: Field names the input
// ("message", "workspaceFiles", "at", ...) and Message says what is wrong
// and what is allowed.
type InvalidError struct {
	Field   string
	Message string
	// Err is a more specific sentinel, such as ErrReservedPath, or nil.
	Err error
}

// Error says which field is invalid and why.
func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Message)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Unwrap returns the specific sentinel, if any.
func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// storeErr marks a store failure as ErrStoreUnavailable, keeping the cause.
func storeErr(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, what, err)
}
