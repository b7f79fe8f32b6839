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
	// bytes): nothing was accepted. The error is an *InboxFullError
	// carrying how long to wait; the HTTP server answers 429 with
	// Retry-After.
	ErrInboxFull = errors.New("agent: the session's queue of messages is full")
	// ErrTooLarge means a message is over serving mode ledger's limit on
	// one queued message (LedgerOptions.MaxEventBytes), or its
	// Idempotency-Key over the ledger's limit on an event id. The HTTP
	// server answers 413.
	ErrTooLarge = errors.New("agent: message too large")
	// ErrDeadLettered means, in serving mode ledger, that the message's
	// turn failed LedgerOptions.MaxAttempts times and the message went to
	// the dead-letter store; the session moved on without it.
	ErrDeadLettered = errors.New("agent: the message was dead-lettered")
)

// InboxFullError is ErrInboxFull with the wait the ledger suggests.
type InboxFullError struct {
	SessionID string
	// Pending is the number of messages queued when this one was refused.
	Pending int
	// RetryAfter is how long to wait before sending the message again.
	RetryAfter time.Duration
}

// Error says how full the queue is and when to retry.
func (e *InboxFullError) Error() string {
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
