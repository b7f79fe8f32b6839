package storage

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"agentkit/kv"
	"agentkit/record"
)

// ReminderState is where a reminder is in its life.
type ReminderState string

// The states of a reminder.
const (
	// ReminderPending: waiting for its time (or for a retry).
	ReminderPending ReminderState = "pending"
	// ReminderClaimed: a host has claimed it and is firing it.
	ReminderClaimed ReminderState = "claimed"
	// ReminderFired: it fired. Final.
	ReminderFired ReminderState = "fired"
	// ReminderFailed: every attempt to fire it failed. Final.
	ReminderFailed ReminderState = "failed"
)

// Final reports whether the state can no longer change.
func (s ReminderState) Final() bool { return s == ReminderFired || s == ReminderFailed }

// Reminder is a follow-up turn scheduled for a time: the record stored at
// reminders/{id}. Package reminder schedules and fires them; this is their
// stored form.
type Reminder struct {
	// ID names the reminder.
	ID string `json:"id"`
	// SessionID is the session the follow-up turn runs in.
	SessionID string `json:"sessionId"`
	// At is when the reminder is due.
	At time.Time `json:"at"`
	// Message is the user message of the follow-up turn.
	Message string `json:"message"`
	// State is where the reminder is in its life.
	State ReminderState `json:"state"`
	// CreatedAt is when it was created.
	CreatedAt time.Time `json:"createdAt"`
	// ClaimedBy and ClaimedAt name the host holding the claim and when it
	// last renewed it (set while claimed, kept afterwards for the record).
	ClaimedBy string    `json:"claimedBy,omitempty"`
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
	// FiredAt is when the reminder reached a final state.
	FiredAt time.Time `json:"firedAt,omitzero"`
	// Attempts counts the attempts to fire it.
	Attempts int `json:"attempts,omitempty"`
	// RetryAt, after a failed attempt, is when the next one is due.
	RetryAt time.Time `json:"retryAt,omitzero"`
	// LastError is the error of the last failed attempt.
	LastError string `json:"lastError,omitempty"`
	// Rev counts the writes of the record: every change (a claim, a lease
	// renewal, an outcome) adds one. A copy with a higher Rev is newer.
	Rev int64 `json:"rev"`
}

// Check reports what makes a decoded reminder unusable: no id, or an
// unknown state.
func (r Reminder) Check() error {
	if r.ID == "" {
		return fmt.Errorf("%w: the reminder record has no id", ErrBadRecord)
	}
	switch r.State {
	case ReminderPending, ReminderClaimed, ReminderFired, ReminderFailed:
		return nil
	}
	return fmt.Errorf("%w: reminder %q has unknown state %q", ErrBadRecord, r.ID, r.State)
}

// Reminders is one agent's reminder records in the store, one per reminder
// at agentkit/v1/{agent}/reminders/{id}. On a store with the CAS group a
// record is created only if absent and then changed only with
// compare-and-set (Replace), which is how exactly one host claims a due
// reminder; on a store without it, writes are plain Puts and only one host
// may fire reminders. Every error is returned: the scheduler decides what
// to retry.
type Reminders struct{ a *AgentStore }

// Reminders returns the agent's reminder records.
func (a *AgentStore) Reminders() *Reminders { return &Reminders{a: a} }

// Coordinated reports whether the store has the CAS group, so that several
// hosts may fire the agent's reminders.
func (t *Reminders) Coordinated() bool { return t.a.b.caps.CAS }

// CheckClaims refuses a store whose claims would not survive a restart:
// durable plain methods beside a compare-and-set group kept in process
// memory (such as kv.CASFuncsOf on a memory store).
func (t *Reminders) CheckClaims() error {
	c := t.a.b.caps
	if c.CASProcessLocal && !c.ProcessLocal {
		return fmt.Errorf("%w: the store %q pairs a durable store with an in-memory compare-and-set group; reminder claims would be lost on restart. Back the CAS group with the same durable store", ErrSplitCAS, t.a.b.name)
	}
	return nil
}

// CanList reports whether the store can list the reminders.
func (t *Reminders) CanList() bool { return t.a.b.caps.List }

func (t *Reminders) key(id string) (string, error) { return key(t.a.keys.Reminder(id)) }

func (t *Reminders) encode(r Reminder) (string, []byte, error) {
	k, err := t.key(r.ID)
	if err != nil {
		return "", nil, err
	}
	data, err := record.Marshal(KindReminder, r)
	return k, data, err
}

// decode reads a stored reminder and checks it belongs at k.
func (t *Reminders) decode(k string, data []byte) (Reminder, error) {
	var r Reminder
	if _, err := record.Unmarshal(KindReminder, k, data, &r); err != nil {
		return Reminder{}, err
	}
	if err := r.Check(); err != nil {
		return Reminder{}, fmt.Errorf("%w (at %q)", err, k)
	}
	if want, err := t.key(r.ID); err != nil || want != k {
		return Reminder{}, fmt.Errorf("%w: the reminder at %q has id %q, which belongs elsewhere", ErrBadRecord, k, r.ID)
	}
	return r, nil
}

// Create stores a new reminder: with PutIfAbsent on a store with the CAS
// group (an existing record is an error matching kv.ErrConflict and
// kv.ErrExists), with Put otherwise.
func (t *Reminders) Create(ctx context.Context, r Reminder) error {
	k, data, err := t.encode(r)
	if err != nil {
		return err
	}
	if t.Coordinated() {
		_, err = t.a.b.db.PutIfAbsent(ctx, k, data)
		return err
	}
	return t.a.b.db.Put(ctx, k, data)
}

// Read returns a stored reminder and its version (empty on a store without
// the CAS group), or an error matching kv.ErrNotFound.
func (t *Reminders) Read(ctx context.Context, id string) (Reminder, kv.Version, error) {
	k, err := t.key(id)
	if err != nil {
		return Reminder{}, "", err
	}
	var data []byte
	var ver kv.Version
	switch {
	case t.Coordinated():
		data, ver, err = t.a.b.db.GetWithVersion(ctx, k)
	case t.a.b.caps.Get:
		data, err = t.a.b.db.Get(ctx, k)
	default:
		return Reminder{}, "", unsupported(t.a.b, "reading a reminder", "Get")
	}
	if err != nil {
		return Reminder{}, "", err
	}
	r, err := t.decode(k, data)
	return r, ver, err
}

// Replace writes a new state of a reminder (a claim, its renewal, an
// outcome) only if the stored record still has version expected: among
// hosts racing with the same version exactly one wins, the others get an
// error matching kv.ErrConflict. It needs the CAS group.
func (t *Reminders) Replace(ctx context.Context, r Reminder, expected kv.Version) (kv.Version, error) {
	if !t.Coordinated() {
		return "", unsupported(t.a.b, "claiming a reminder", "the CAS group")
	}
	k, data, err := t.encode(r)
	if err != nil {
		return "", err
	}
	return t.a.b.db.PutIfVersion(ctx, k, data, expected)
}

// Put writes a reminder unconditionally: the single-host path of a store
// without the CAS group.
func (t *Reminders) Put(ctx context.Context, r Reminder) error {
	k, data, err := t.encode(r)
	if err != nil {
		return err
	}
	return t.a.b.db.Put(ctx, k, data)
}

// Delete removes a reminder; a missing one is not an error. Without Delete
// in the store it fails with an error matching errors.ErrUnsupported.
func (t *Reminders) Delete(ctx context.Context, id string) error {
	k, err := t.key(id)
	if err != nil {
		return err
	}
	if !t.a.b.caps.Delete {
		return unsupported(t.a.b, "deleting a reminder", "Delete")
	}
	return t.a.b.db.Delete(ctx, k)
}

// List yields every stored reminder of the agent, in key order. A record
// that does not decode is yielded as an error matching ErrBadRecord or
// ErrNewerFormat and the listing goes on; a store error ends it. Without
// List in the store it yields one error matching errors.ErrUnsupported.
func (t *Reminders) List(ctx context.Context) iter.Seq2[Reminder, error] {
	return func(yield func(Reminder, error) bool) {
		if !t.CanList() {
			yield(Reminder{}, unsupported(t.a.b, "listing reminders", "List"))
			return
		}
		for e, err := range t.a.b.db.List(ctx, t.a.keys.RemindersPrefix()) {
			if err != nil {
				yield(Reminder{}, err)
				return
			}
			r, err := t.decode(e.Key, e.Value)
			if !yield(r, err) {
				return
			}
		}
	}
}

// IsRecordError reports whether err is about one record (unreadable, or
// from a newer agentkit) rather than the store: a listing goes on after it.
func IsRecordError(err error) bool {
	return errors.Is(err, ErrBadRecord) || errors.Is(err, ErrNewerFormat)
}
