// Package reminder schedules follow-up turns: a reminder names a session, a
// time and a message, and the Scheduler calls the runtime's Fire callback
// once when the time comes.
//
// # Where reminders live
//
// Every reminder is kept twice: as one JSON file in a local folder (the
// runtime passes --state-root/reminders/), and, when a store is configured,
// as one JSON record at agentkit/v1/{agent}/reminders/{id} (package keys).
// Create writes the store first and fails when it cannot, so a reminder the
// caller was told about is in the store. Open loads the local folder and
// hydrates from the store (a List of the reminders prefix), and Run lists
// the store again every SyncInterval, so reminders created on other hosts,
// or before a restart, fire here too, late if their time has passed. A
// reminder deleted from the store disappears locally at the next listing.
// Reminders made before a store was configured are written to it rather
// than taken for deleted. With a store, the store holds the truth and local
// files are written without fsync; without one, every local write is
// synced to disk before it counts.
//
// # Firing once
//
// A reminder moves pending -> claimed -> fired (or failed, once Fire has
// returned an error MaxAttempts times; between attempts it waits in pending
// for RetryDelay, doubling).
//
// With a store that has the compare-and-set group (kv.CAS), several hosts
// may run a Scheduler over the same agent. When a reminder is due, each
// host reads it with GetWithVersion and writes the claim (state claimed,
// its host id, the time) with PutIfVersion: the store lets exactly one of
// them win, and only the winner calls Fire, then writes fired. Losers
// adopt the winner's record. A store without compare-and-set gives
// single-host semantics: this host fires from its local copy and mirrors
// the state to the store; two hosts on such a store would both fire.
//
// # Leases
//
// A claim is a lease of length Lease (default five minutes). While Fire
// runs, the winner renews it every Lease/3. A claim that has not been
// renewed for a whole Lease belongs to a host that died (or lost the
// store): any host, this one after a restart included, may claim it again
// with the same compare-and-set and fire it. So a reminder is fired exactly
// once while hosts stay up, and at least once when a host dies between
// firing and recording it. Lease must exceed the longest pause a live host
// can suffer between renewals; a Fire that outlives its lease because the
// store was unreachable may be repeated by another host.
package reminder

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// FormatVersion is the version of the stored record. A record with a
// higher "v" was written by a newer agentkit and is skipped with an error
// in the log, never misread.
const FormatVersion = 1

// MaxMessageBytes bounds a reminder's message.
const MaxMessageBytes = 64 << 10

// State is where a reminder is in its life.
type State string

// The states of a reminder.
const (
	// StatePending: waiting for its time (or for a retry).
	StatePending State = "pending"
	// StateClaimed: a host has claimed it and is firing it.
	StateClaimed State = "claimed"
	// StateFired: Fire returned nil. Final.
	StateFired State = "fired"
	// StateFailed: Fire returned an error on every attempt. Final.
	StateFailed State = "failed"
)

// Final reports whether the state can no longer change.
func (s State) Final() bool { return s == StateFired || s == StateFailed }

// Reminder is a follow-up turn scheduled for a time. It is also the JSON
// record stored locally and in the store.
type Reminder struct {
	// Format is FormatVersion when written.
	Format int `json:"v"`
	// ID names the reminder; Create makes it ("rem_" and 32 hex digits).
	ID string `json:"id"`
	// SessionID is the session the follow-up turn runs in.
	SessionID string `json:"sessionId"`
	// At is when the reminder is due.
	At time.Time `json:"at"`
	// Message is the user message of the follow-up turn.
	Message string `json:"message"`
	// State is where the reminder is in its life.
	State State `json:"state"`
	// CreatedAt is when Create ran.
	CreatedAt time.Time `json:"createdAt"`
	// ClaimedBy and ClaimedAt name the host holding the claim and when it
	// last renewed it (set while claimed, kept afterwards for the record).
	ClaimedBy string    `json:"claimedBy,omitempty"`
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
	// FiredAt is when the reminder reached a final state.
	FiredAt time.Time `json:"firedAt,omitzero"`
	// Attempts counts the calls of Fire.
	Attempts int `json:"attempts,omitempty"`
	// RetryAt, after a failed attempt, is when the next one is due.
	RetryAt time.Time `json:"retryAt,omitzero"`
	// LastError is the error of the last failed attempt.
	LastError string `json:"lastError,omitempty"`
	// Rev counts the writes of the record: every change (a claim, a lease
	// renewal, an outcome) adds one. A copy with a higher Rev is newer.
	Rev int64 `json:"rev"`
}

// dueAt is when a pending reminder should next be tried.
func (r *Reminder) dueAt() time.Time {
	if r.RetryAt.After(r.At) {
		return r.RetryAt
	}
	return r.At
}

// Errors of the package, for errors.Is.
var (
	// ErrNotFound: no reminder with that id.
	ErrNotFound = errors.New("reminder: not found")
	// ErrInvalid: Create's arguments are unusable; the error says which.
	ErrInvalid = errors.New("reminder: invalid")
)

// newID returns a fresh random reminder id.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "rem_" + hex.EncodeToString(b[:])
}

// decode reads a record, refusing a newer format and one without an id.
func decode(b []byte) (Reminder, error) {
	var r Reminder
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("reminder: the record is not valid JSON: %w", err)
	}
	if r.Format > FormatVersion {
		return r, fmt.Errorf("reminder: record %q has format %d, newer than this build's %d; upgrade agentkit", r.ID, r.Format, FormatVersion)
	}
	if r.ID == "" {
		return r, errors.New("reminder: the record has no id")
	}
	switch r.State {
	case StatePending, StateClaimed, StateFired, StateFailed:
	default:
		return r, fmt.Errorf("reminder: record %q has unknown state %q", r.ID, r.State)
	}
	return r, nil
}

func encode(r Reminder) []byte {
	r.Format = FormatVersion
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // unreachable: every field marshals
	}
	return b
}
