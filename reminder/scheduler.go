package reminder

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"agentkit/kv"
	"agentkit/storage"
	"agentkit/tool"
)

// Defaults of Options.
const (
	DefaultLease         = 5 * time.Minute
	DefaultSyncInterval  = time.Minute
	DefaultMaxAttempts   = 3
	DefaultRetryDelay    = time.Minute
	DefaultRetention     = 7 * 24 * time.Hour
	DefaultMaxConcurrent = 4
)

// storeRetry is how long a reminder waits after a store error before the
// next try.
const storeRetry = 10 * time.Second

// FireFunc runs a due reminder: the runtime starts the follow-up turn in
// r.SessionID with r.Message. It returns nil once the turn has been run (a
// turn that ends failed is still fired); an error means the turn could not
// run, and the reminder is tried again later, up to MaxAttempts times.
// ctx ends when Run's context does.
type FireFunc func(ctx context.Context, r Reminder) error

// Options configures a Scheduler. Dir and Fire are required.
type Options struct {
	// Dir is the local folder (--state-root/reminders). It is created if
	// missing.
	Dir string
	// Records, when set, keeps reminders in the store: the agent's
	// reminder records (storage.AgentStore.Reminders). With the CAS group
	// it coordinates several hosts; see the package doc.
	Records *storage.Reminders
	// HostID names this host in claims; empty means the host name and a
	// random suffix, unique to this Scheduler.
	HostID string
	// Fire runs a due reminder.
	Fire FireFunc
	// Lease is how long a claim holds without renewal before another host
	// may take it over; zero means DefaultLease.
	Lease time.Duration
	// SyncInterval is how often Run lists the store for reminders created
	// or changed elsewhere; zero means DefaultSyncInterval.
	SyncInterval time.Duration
	// MaxAttempts bounds the calls of Fire for one reminder; zero means
	// DefaultMaxAttempts.
	MaxAttempts int
	// RetryDelay is the wait after the first failed attempt, doubling
	// after each further one; zero means DefaultRetryDelay.
	RetryDelay time.Duration
	// Retention is how long fired and failed reminders are kept (for List)
	// before they are removed locally and from the store; zero means
	// DefaultRetention.
	Retention time.Duration
	// MaxConcurrent bounds the Fire calls running at once; zero means
	// DefaultMaxConcurrent.
	MaxConcurrent int
	// Logger receives store errors and skipped records; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Scheduler keeps reminders and fires them when due. Its methods are safe
// for concurrent use; Run drives the firing.
type Scheduler struct {
	opts   Options
	local  *localDir
	store  *storage.Reminders // nil without a store
	cas    bool               // store has the CAS group
	log    *slog.Logger
	wake   chan struct{}
	active atomic.Bool // Run is running

	mu       sync.Mutex
	recs     map[string]*localRecord
	inflight map[string]*flight
	hold     map[string]time.Time // not before: after a store error
}

// flight is a reminder being processed.
type flight struct{ deleted bool }

// Open loads the local folder, hydrates from the store when it can list,
// and returns the Scheduler. A store error during hydration is logged, not
// returned: Run lists the store again every SyncInterval. Open fails on a
// missing Dir or Fire, an unusable store, or a local folder it cannot
// read.
func Open(ctx context.Context, opts Options) (*Scheduler, error) {
	if opts.Fire == nil {
		return nil, errors.New("reminder: Options.Fire is nil; pass the function that runs a due reminder")
	}
	local, err := openLocal(opts.Dir)
	if err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.Lease, DefaultLease)
	def(&opts.SyncInterval, DefaultSyncInterval)
	def(&opts.RetryDelay, DefaultRetryDelay)
	def(&opts.Retention, DefaultRetention)
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if opts.HostID == "" {
		opts.HostID = defaultHostID()
	}
	s := &Scheduler{
		opts: opts, local: local, log: opts.Logger,
		wake:     make(chan struct{}, 1),
		recs:     map[string]*localRecord{},
		inflight: map[string]*flight{},
		hold:     map[string]time.Time{},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if opts.Records != nil {
		if err := opts.Records.CheckClaims(); err != nil {
			return nil, fmt.Errorf("reminder: %w", err)
		}
		s.store, s.cas = opts.Records, opts.Records.Coordinated()
		local.noSync = true
	}
	recs, bad, err := local.load()
	if err != nil {
		return nil, err
	}
	for _, e := range bad {
		s.log.Error("reminder: skipped a local record", "err", e)
	}
	for i := range recs {
		s.recs[recs[i].ID] = &recs[i]
	}
	if err := s.Sync(ctx); err != nil {
		s.log.Warn("reminder: could not hydrate from the store; will retry", "err", err)
	}
	return s, nil
}

func defaultHostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return h + "-" + hex.EncodeToString(b[:])
}

// HostID returns the id this Scheduler writes in its claims.
func (s *Scheduler) HostID() string { return s.opts.HostID }

// Coordinated reports whether firing is coordinated through the store's
// compare-and-set group, so several hosts may share the store.
func (s *Scheduler) Coordinated() bool { return s.cas }

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Create schedules a reminder for session sessionID at time at (a time in
// the past fires at once) with message. It is written to the store (when
// there is one) and then locally; an error from either fails Create and
// leaves no reminder behind here.
func (s *Scheduler) Create(ctx context.Context, sessionID string, at time.Time, message string) (Reminder, error) {
	switch {
	case sessionID == "":
		return Reminder{}, fmt.Errorf("%w: the session id is empty", ErrInvalid)
	case at.IsZero():
		return Reminder{}, fmt.Errorf("%w: the time is missing; give when the reminder is due", ErrInvalid)
	case at.Year() > 9999 || at.Year() < 1:
		return Reminder{}, fmt.Errorf("%w: the time %s is outside the years 1-9999", ErrInvalid, at)
	case message == "":
		return Reminder{}, fmt.Errorf("%w: the message is empty; give the text of the follow-up turn", ErrInvalid)
	case len(message) > MaxMessageBytes:
		return Reminder{}, fmt.Errorf("%w: the message is %d bytes, over the %d-byte limit", ErrInvalid, len(message), MaxMessageBytes)
	case !utf8.ValidString(message):
		return Reminder{}, fmt.Errorf("%w: the message is not valid UTF-8", ErrInvalid)
	}
	now := time.Now()
	r := Reminder{
		ID: newID(), SessionID: sessionID,
		At: at.UTC(), Message: message, State: StatePending, CreatedAt: now.UTC(),
		Rev: 1,
	}
	if s.store != nil {
		if err := s.store.Create(ctx, r); err != nil {
			return Reminder{}, fmt.Errorf("reminder: storing the new reminder failed: %w", err)
		}
	}
	s.mu.Lock()
	lr := &localRecord{Reminder: r, Stored: s.store != nil, seen: time.Now()}
	err := s.local.save(*lr)
	if err == nil {
		s.recs[r.ID] = lr
	}
	s.mu.Unlock()
	if err != nil {
		if s.store != nil {
			_ = s.store.Delete(context.WithoutCancel(ctx), r.ID)
		}
		return Reminder{}, err
	}
	s.poke()
	return r, nil
}

// Get returns the reminder with the id, as this host knows it.
func (s *Scheduler) Get(id string) (Reminder, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lr, ok := s.recs[id]
	if !ok {
		return Reminder{}, false
	}
	return lr.Reminder, true
}

// List returns the reminders of a session, or all of them when sessionID
// is empty, ordered by due time then id. It shows this host's copies,
// which Run refreshes from the store every SyncInterval.
func (s *Scheduler) List(sessionID string) []Reminder {
	s.mu.Lock()
	out := make([]Reminder, 0, len(s.recs))
	for _, lr := range s.recs {
		if sessionID == "" || lr.SessionID == sessionID {
			out = append(out, lr.Reminder)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Reminder) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// Delete cancels a reminder: it is removed from the store and locally. An
// id known neither here nor in the store is an error matching ErrNotFound.
// A reminder whose Fire is already running is not interrupted.
func (s *Scheduler) Delete(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("%w: the reminder id is empty", ErrNotFound)
	}
	s.mu.Lock()
	_, known := s.recs[id]
	s.mu.Unlock()
	if s.store != nil {
		if !known {
			if _, _, err := s.store.Read(ctx, id); errors.Is(err, kv.ErrNotFound) {
				return fmt.Errorf("%w: %q", ErrNotFound, id)
			} else if err != nil && !errors.Is(err, errors.ErrUnsupported) && !storage.IsRecordError(err) {
				return fmt.Errorf("reminder: looking up %q: %w", id, err)
			}
		}
		if err := s.store.Delete(ctx, id); err != nil {
			return fmt.Errorf("reminder: deleting %q from the store: %w", id, err)
		}
	} else if !known {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.inflight[id]; f != nil {
		f.deleted = true
	}
	delete(s.recs, id)
	delete(s.hold, id)
	return s.local.remove(id)
}

// ForSession returns the tool.Scheduler handlers use to schedule reminders
// in one session.
func (s *Scheduler) ForSession(sessionID string) tool.Scheduler {
	return sessionScheduler{s: s, session: sessionID}
}

type sessionScheduler struct {
	s       *Scheduler
	session string
}

func (ss sessionScheduler) Schedule(ctx context.Context, at time.Time, message string) (string, error) {
	r, err := ss.s.Create(ctx, ss.session, at, message)
	return r.ID, err
}
