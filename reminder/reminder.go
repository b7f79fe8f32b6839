// Package reminder schedules follow-up turns: a reminder names a session, a
// time and a message, and the Scheduler calls the runtime's Fire callback
// once when the time comes.
//
// # Where reminders live
//
// Every reminder is kept twice: as one JSON file in a local folder (the
// runtime passes --state-root/reminders/), and, when a store is configured,
// as one record at agentkit/v1/{agent}/reminders/{id}, which the scheduler
// reads and writes through the record layer (storage.Reminders), with the
// same codec for both copies. Create writes the store first and fails when it cannot, so a reminder the
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
// host reads it with its version and writes the claim (state claimed, its
// host id, the time) only over that version (storage.Reminders.Replace):
// the store lets exactly one of them win, and only the winner calls Fire,
// then writes fired. Losers adopt the winner's record. claim.go holds this
// step. A store without compare-and-set gives single-host semantics: this
// host fires from its local copy and mirrors the state to the store; two
// hosts on such a store would both fire.
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
//
// # Where the code is
//
// The package is split by job: scheduler.go is the API (Open, Create, Get,
// List, Delete, ForSession); sync.go merges the local copies with the
// store; fire.go is the loop that fires due reminders and records their
// outcome; claim.go is the claim that makes a reminder fire once; local.go
// is the local folder.
package reminder

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"agentkit/storage"
)

// MaxMessageBytes bounds a reminder's message.
const MaxMessageBytes = 64 << 10

// State is where a reminder is in its life: pending, claimed, fired or
// failed (storage.ReminderState).
type State = storage.ReminderState

// The states of a reminder.
const (
	// StatePending: waiting for its time (or for a retry).
	StatePending = storage.ReminderPending
	// StateClaimed: a host has claimed it and is firing it.
	StateClaimed = storage.ReminderClaimed
	// StateFired: Fire returned nil. Final.
	StateFired = storage.ReminderFired
	// StateFailed: Fire returned an error on every attempt. Final.
	StateFailed = storage.ReminderFailed
)

// Reminder is a follow-up turn scheduled for a time, as stored locally and
// in the store (storage.Reminder).
type Reminder = storage.Reminder

// dueAt is when a pending reminder should next be tried.
func dueAt(r Reminder) time.Time {
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
