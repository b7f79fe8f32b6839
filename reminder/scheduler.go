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

	"agentkit/keys"
	"agentkit/kv"
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
	// Store, when set, keeps reminders at agentkit/v1/{Agent}/reminders/.
	// With the CAS group it coordinates several hosts; see the package doc.
	Store *kv.DB
	// Agent is the agent name in the store's keys; required with Store.
	Agent string
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
	scope  keys.Scope
	store  *kv.DB // nil without a store
	cas    bool   // store has the CAS group
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
	if opts.Store != nil {
		if s.scope, err = keys.Agent(opts.Agent); err != nil {
			return nil, fmt.Errorf("reminder: Options.Agent: %w", err)
		}
		caps := opts.Store.Capabilities()
		if caps.CASProcessLocal && !caps.ProcessLocal {
			return nil, fmt.Errorf("reminder: the store %q pairs a durable store with an in-memory compare-and-set group; claims would be lost on restart. Back the CAS group with the same durable store", opts.Store.Name())
		}
		s.store, s.cas = opts.Store, caps.CAS
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

func (s *Scheduler) key(id string) (string, error) { return s.scope.Reminder(id) }

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
		Format: FormatVersion, ID: newID(), SessionID: sessionID,
		At: at.UTC(), Message: message, State: StatePending, CreatedAt: now.UTC(),
		Rev: 1,
	}
	if s.store != nil {
		key, err := s.key(r.ID)
		if err != nil {
			return Reminder{}, err
		}
		if s.cas {
			_, err = s.store.PutIfAbsent(ctx, key, encode(r))
		} else {
			err = s.store.Put(ctx, key, encode(r))
		}
		if err != nil {
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
			if key, kerr := s.key(r.ID); kerr == nil {
				_ = s.store.Delete(context.WithoutCancel(ctx), key)
			}
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
		key, err := s.key(id)
		if err != nil {
			return err
		}
		if !known {
			if _, err := s.store.Get(ctx, key); errors.Is(err, kv.ErrNotFound) {
				return fmt.Errorf("%w: %q", ErrNotFound, id)
			} else if err != nil && !errors.Is(err, errors.ErrUnsupported) {
				return fmt.Errorf("reminder: looking up %q: %w", id, err)
			}
		}
		if err := s.store.Delete(ctx, key); err != nil {
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

// Sync lists the store's reminders and merges them into the local copies:
// new ones are adopted, and so are newer copies (a higher Rev); local states
// the store missed (a failed write) are pushed; reminders deleted from the
// store are dropped. Without a store, or one that cannot list, Sync
// does nothing.
func (s *Scheduler) Sync(ctx context.Context) error {
	if s.store == nil || !s.store.Capabilities().List {
		return nil
	}
	started := time.Now()
	seen := map[string]bool{}
	var errs []error
	for e, err := range s.store.List(ctx, s.scope.RemindersPrefix()) {
		if err != nil {
			return fmt.Errorf("reminder: listing the store: %w", err)
		}
		r, err := decode(e.Value)
		if err != nil {
			s.log.Error("reminder: skipped a stored record", "key", e.Key, "err", err)
			continue
		}
		if want, kerr := s.key(r.ID); kerr != nil || want != e.Key {
			s.log.Error("reminder: skipped a stored record whose id does not match its key", "key", e.Key)
			continue
		}
		seen[r.ID] = true
		if err := s.merge(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	// Drop local copies deleted from the store: those known to have been
	// in the store before the listing began (List yields every key that
	// existed when it began and was not deleted). Copies the store never
	// had, from before a store was configured, are written to it instead.
	var missing []Reminder
	s.mu.Lock()
	for id, lr := range s.recs {
		switch {
		case seen[id] || s.inflight[id] != nil:
		case !lr.Stored:
			missing = append(missing, lr.Reminder)
		case lr.seen.Before(started):
			delete(s.recs, id)
			if err := s.local.remove(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.mu.Unlock()
	for _, r := range missing {
		if err := s.upload(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	s.poke()
	return errors.Join(errs...)
}

// upload writes a reminder the store never had.
func (s *Scheduler) upload(ctx context.Context, r Reminder) error {
	key, err := s.key(r.ID)
	if err != nil {
		return err
	}
	if s.cas {
		_, err = s.store.PutIfAbsent(ctx, key, encode(r))
		if errors.Is(err, kv.ErrConflict) {
			return nil // it arrived meanwhile: the next Sync adopts it
		}
	} else {
		err = s.store.Put(ctx, key, encode(r))
	}
	if err != nil {
		return fmt.Errorf("reminder: writing %s to the store: %w", r.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if lr := s.recs[r.ID]; lr != nil {
		lr.Stored, lr.seen = true, time.Now()
		// Changed while uploading: the store has an older state to catch up.
		lr.Unsynced = lr.Unsynced || lr.Rev != r.Rev
		return s.local.save(*lr)
	}
	return nil
}

// merge takes a stored record into the local copies.
func (s *Scheduler) merge(ctx context.Context, r Reminder) error {
	s.mu.Lock()
	lr, have := s.recs[r.ID]
	busy := s.inflight[r.ID] != nil
	unsynced := have && lr.Unsynced
	s.mu.Unlock()
	switch {
	case busy:
		return nil
	case unsynced:
		return s.push(ctx, r.ID)
	case have && r.Rev <= lr.Rev:
		s.mu.Lock()
		if cur := s.recs[r.ID]; cur != nil && cur.Rev == r.Rev {
			cur.seen = time.Now()
		}
		s.mu.Unlock()
		return nil
	}
	if r.State.Final() && time.Since(r.FiredAt) > s.opts.Retention {
		return nil // expired history: the sweep removes it from the store
	}
	return s.adopt(r)
}

// adopt replaces the local copy, unless the reminder is being processed or
// was deleted meanwhile.
func (s *Scheduler) adopt(r Reminder) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight[r.ID] != nil {
		return nil
	}
	if cur := s.recs[r.ID]; cur != nil && cur.Rev >= r.Rev {
		return nil
	}
	lr := &localRecord{Reminder: r, Stored: true, seen: time.Now()}
	if err := s.local.save(*lr); err != nil {
		return err
	}
	s.recs[r.ID] = lr
	return nil
}

// push writes a local state the store missed.
func (s *Scheduler) push(ctx context.Context, id string) error {
	s.mu.Lock()
	lr, ok := s.recs[id]
	if !ok || !lr.Unsynced || s.inflight[id] != nil {
		s.mu.Unlock()
		return nil
	}
	mine := lr.Reminder
	s.inflight[id] = &flight{}
	s.mu.Unlock()
	defer s.land(id)
	key, err := s.key(id)
	if err != nil {
		return err
	}
	if !s.cas {
		if err := s.store.Put(ctx, key, encode(mine)); err != nil {
			return fmt.Errorf("reminder: pushing %s to the store: %w", id, err)
		}
		return s.keep(mine, false)
	}
	b, ver, err := s.store.GetWithVersion(ctx, key)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return s.forget(id)
	case err != nil:
		return fmt.Errorf("reminder: pushing %s to the store: %w", id, err)
	}
	theirs, err := decode(b)
	if err != nil {
		return err
	}
	// Every conditional write adds one to Rev, and ours is one more than
	// the last write of ours the store took: a higher Rev than the store's
	// means nobody wrote since, so ours is the newer state.
	if mine.Rev > theirs.Rev {
		if _, err := s.store.PutIfVersion(ctx, key, encode(mine), ver); err == nil {
			return s.keep(mine, false)
		} else if !errors.Is(err, kv.ErrConflict) {
			return fmt.Errorf("reminder: pushing %s to the store: %w", id, err)
		}
		return nil // changed meanwhile: the next Sync looks again
	}
	return s.keep(theirs, false)
}

// keep saves a local copy (unless deleted meanwhile).
func (s *Scheduler) keep(r Reminder, unsynced bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f := s.inflight[r.ID]; f != nil && f.deleted {
		return nil
	}
	lr := &localRecord{Reminder: r, Unsynced: unsynced, Stored: s.store != nil, seen: time.Now()}
	if err := s.local.save(*lr); err != nil {
		return err
	}
	s.recs[r.ID] = lr
	return nil
}

// forget drops a reminder deleted elsewhere.
func (s *Scheduler) forget(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, id)
	return s.local.remove(id)
}

// land ends the processing of a reminder.
func (s *Scheduler) land(id string) {
	s.mu.Lock()
	delete(s.inflight, id)
	s.mu.Unlock()
}

// Run fires reminders as they fall due, until ctx ends; then it waits for
// the Fire calls in progress (which see ctx end) and returns nil. Only one
// Run may be active at a time.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.active.CompareAndSwap(false, true) {
		return errors.New("reminder: Run is already running on this Scheduler")
	}
	defer s.active.Store(false)
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, s.opts.MaxConcurrent)
	nextSync := time.Now().Add(s.opts.SyncInterval)
	for {
		now := time.Now()
		if s.store != nil && !now.Before(nextSync) {
			if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("reminder: store sync failed; will retry", "err", err)
			}
			s.sweep(ctx, now)
			nextSync = now.Add(s.opts.SyncInterval)
		}
		due, next := s.due(now)
		for _, id := range due {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer s.poke()
				defer s.land(id)
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				defer func() { <-sem }()
				rev, stored := s.version(id)
				s.process(ctx, id)
				s.holdIfStuck(id, rev, stored)
			}()
		}
		wake := next
		if s.store != nil && (wake.IsZero() || nextSync.Before(wake)) {
			wake = nextSync
		}
		d := 24 * time.Hour
		if !wake.IsZero() {
			d = max(wake.Sub(now), 0)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-s.wake:
			t.Stop()
		}
	}
}

// due marks the reminders due at now as in flight and returns them, with
// the next time something falls due (zero: nothing waiting).
func (s *Scheduler) due(now time.Time) (due []string, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for id, lr := range s.recs {
		if s.inflight[id] != nil {
			continue
		}
		var at time.Time
		switch lr.State {
		case StatePending:
			at = lr.dueAt()
		case StateClaimed:
			at = lr.ClaimedAt.Add(s.opts.Lease)
		default:
			continue
		}
		if h, ok := s.hold[id]; ok && h.After(at) {
			at = h
		}
		if at.After(now) {
			soonest(at)
			continue
		}
		delete(s.hold, id)
		s.inflight[id] = &flight{}
		due = append(due, id)
	}
	slices.Sort(due)
	return due, next
}

// version returns what holdIfStuck compares.
func (s *Scheduler) version(id string) (rev int64, stored bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lr := s.recs[id]; lr != nil {
		return lr.Rev, lr.Stored
	}
	return 0, false
}

// holdIfStuck delays a reminder that processing left unchanged and still
// due (its local copy could not be updated, say), so Run does not spin on
// it.
func (s *Scheduler) holdIfStuck(id string, rev int64, stored bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	lr := s.recs[id]
	if lr == nil || lr.Rev != rev || lr.Stored != stored || !claimable(lr.Reminder, now, s.opts.Lease) {
		return
	}
	if h, ok := s.hold[id]; !ok || !h.After(now) {
		s.hold[id] = now.Add(storeRetry)
	}
}

// holdOff delays the next try of a reminder after a store error.
func (s *Scheduler) holdOff(id string, err error) {
	s.log.Warn("reminder: store error; will retry", "id", id, "err", err)
	s.mu.Lock()
	s.hold[id] = time.Now().Add(storeRetry)
	s.mu.Unlock()
}

// process claims a due reminder, fires it and records the outcome. The
// caller has marked it in flight.
func (s *Scheduler) process(ctx context.Context, id string) {
	s.mu.Lock()
	lr, ok := s.recs[id]
	var r Reminder
	stored := false
	if ok {
		r, stored = lr.Reminder, lr.Stored
	}
	s.mu.Unlock()
	if !ok || ctx.Err() != nil {
		return
	}
	var key string
	var ver kv.Version
	if s.store != nil {
		var err error
		if key, err = s.key(id); err != nil {
			s.log.Error("reminder: unusable id", "id", id, "err", err)
			return
		}
	}
	now := time.Now()
	if s.cas {
		b, v, err := s.store.GetWithVersion(ctx, key)
		if errors.Is(err, kv.ErrNotFound) && !stored {
			// From before the store was configured: store it first; the
			// next round claims it.
			if err := s.upload(ctx, r); err != nil {
				s.holdOff(id, err)
			}
			return
		}
		if errors.Is(err, kv.ErrNotFound) {
			// Deleted on another host.
			if err := s.forget(id); err != nil {
				s.log.Error("reminder: dropping a deleted reminder", "id", id, "err", err)
			}
			return
		}
		if err != nil {
			s.holdOff(id, err)
			return
		}
		cur, err := decode(b)
		if err != nil {
			s.log.Error("reminder: unreadable stored record", "id", id, "err", err)
			s.holdOff(id, err)
			return
		}
		if !claimable(cur, now, s.opts.Lease) {
			if err := s.keep(cur, false); err != nil {
				s.log.Error("reminder: saving locally", "id", id, "err", err)
			}
			return
		}
		r = cur
		ver = v
	} else if !claimable(r, now, s.opts.Lease) {
		return
	}
	r.State, r.ClaimedBy, r.ClaimedAt = StateClaimed, s.opts.HostID, now.UTC()
	r.Attempts++
	r.Rev++
	switch {
	case s.cas:
		v, err := s.store.PutIfVersion(ctx, key, encode(r), ver)
		if errors.Is(err, kv.ErrConflict) {
			// Another host claimed it (or it changed): adopt what won.
			if b, _, gerr := s.store.GetWithVersion(ctx, key); gerr == nil {
				if cur, derr := decode(b); derr == nil {
					_ = s.keep(cur, false)
				}
			} else if errors.Is(gerr, kv.ErrNotFound) {
				_ = s.forget(id)
			}
			return
		}
		if err != nil {
			s.holdOff(id, err)
			return
		}
		ver = v
		if err := s.keep(r, false); err != nil {
			s.log.Error("reminder: saving the claim locally", "id", id, "err", err)
		}
	default:
		// Single host: the local copy is the claim, so a crash mid-fire is
		// retried after the lease.
		if err := s.keep(r, false); err != nil {
			s.log.Error("reminder: saving the claim locally; not firing", "id", id, "err", err)
			s.holdOff(id, err)
			return
		}
		if s.store != nil {
			if err := s.store.Put(ctx, key, encode(r)); err != nil {
				s.log.Warn("reminder: mirroring the claim to the store", "id", id, "err", err)
			}
		}
	}

	fireErr := s.fire(ctx, key, &r, &ver)

	done := time.Now().UTC()
	r.Rev++
	switch {
	case fireErr == nil:
		r.State, r.FiredAt, r.LastError, r.RetryAt = StateFired, done, "", time.Time{}
	case ctx.Err() != nil:
		// Shutting down: give the attempt back.
		r.State, r.Attempts = StatePending, r.Attempts-1
	case r.Attempts >= s.opts.MaxAttempts:
		r.State, r.FiredAt, r.LastError = StateFailed, done, fireErr.Error()
		s.log.Error("reminder: giving up after the last attempt", "id", id, "session", r.SessionID, "attempts", r.Attempts, "err", fireErr)
	default:
		r.State, r.LastError = StatePending, fireErr.Error()
		r.RetryAt = done.Add(s.opts.RetryDelay << (r.Attempts - 1))
		s.log.Warn("reminder: fire failed; will retry", "id", id, "session", r.SessionID, "attempt", r.Attempts, "retryAt", r.RetryAt, "err", fireErr)
	}
	s.record(context.WithoutCancel(ctx), key, r, ver)
}

// claimable reports whether a reminder may be claimed at now: pending and
// due, or claimed with its lease run out.
func claimable(r Reminder, now time.Time, lease time.Duration) bool {
	switch r.State {
	case StatePending:
		return !r.dueAt().After(now)
	case StateClaimed:
		return !r.ClaimedAt.Add(lease).After(now)
	}
	return false
}

// fire calls Fire while renewing the claim.
func (s *Scheduler) fire(ctx context.Context, key string, r *Reminder, ver *kv.Version) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	fired := *r
	if s.cas {
		wg.Go(func() {
			t := time.NewTicker(max(s.opts.Lease/3, time.Millisecond))
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case now := <-t.C:
					renewed := *r
					renewed.ClaimedAt = now.UTC()
					renewed.Rev++
					v, err := s.store.PutIfVersion(ctx, key, encode(renewed), *ver)
					if err != nil {
						s.log.Warn("reminder: renewing the claim failed", "id", r.ID, "err", err)
						if errors.Is(err, kv.ErrConflict) {
							return
						}
						continue
					}
					*r, *ver = renewed, v
				}
			}
		})
	}
	err := s.callFire(ctx, fired)
	close(stop)
	wg.Wait()
	return err
}

// callFire runs Fire, turning a panic into an error.
func (s *Scheduler) callFire(ctx context.Context, r Reminder) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reminder: Fire panicked: %v", p)
		}
	}()
	return s.opts.Fire(ctx, r)
}

// record writes the outcome of a fire to the store and locally.
func (s *Scheduler) record(ctx context.Context, key string, r Reminder, ver kv.Version) {
	s.mu.Lock()
	deleted := s.inflight[r.ID] != nil && s.inflight[r.ID].deleted
	s.mu.Unlock()
	if deleted {
		return
	}
	unsynced := false
	switch {
	case s.cas:
		_, err := s.store.PutIfVersion(ctx, key, encode(r), ver)
		switch {
		case errors.Is(err, kv.ErrConflict):
			s.log.Warn("reminder: the claim was lost while firing (the lease ran out or the reminder was deleted)", "id", r.ID)
			b, _, gerr := s.store.GetWithVersion(ctx, key)
			if errors.Is(gerr, kv.ErrNotFound) {
				_ = s.forget(r.ID)
				return
			}
			if gerr == nil {
				if cur, derr := decode(b); derr == nil {
					_ = s.keep(cur, false)
					return
				}
			}
			unsynced = true
		case err != nil:
			s.log.Warn("reminder: recording the outcome in the store; will retry", "id", r.ID, "err", err)
			unsynced = true
		}
	case s.store != nil:
		if err := s.store.Put(ctx, key, encode(r)); err != nil {
			s.log.Warn("reminder: recording the outcome in the store; will retry", "id", r.ID, "err", err)
			unsynced = true
		}
	}
	if err := s.keep(r, unsynced); err != nil {
		s.log.Error("reminder: saving the outcome locally", "id", r.ID, "err", err)
	}
}

// sweep removes fired and failed reminders older than Retention, locally
// and from the store.
func (s *Scheduler) sweep(ctx context.Context, now time.Time) {
	s.mu.Lock()
	var old []string
	for id, lr := range s.recs {
		if lr.State.Final() && !lr.Unsynced && s.inflight[id] == nil && now.Sub(lr.FiredAt) > s.opts.Retention {
			old = append(old, id)
		}
	}
	s.mu.Unlock()
	for _, id := range old {
		if s.store != nil {
			key, err := s.key(id)
			if err != nil {
				continue
			}
			if err := s.store.Delete(ctx, key); err != nil {
				s.log.Warn("reminder: removing an old reminder from the store", "id", id, "err", err)
				continue
			}
		}
		if err := s.forget(id); err != nil {
			s.log.Warn("reminder: removing an old reminder", "id", id, "err", err)
		}
	}
}
