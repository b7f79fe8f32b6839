package reminder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"agentkit/kv"
)

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
		due, next := s.takeDue(now)
		for _, id := range due {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer s.poke()
				defer s.endFlight(id)
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				defer func() { <-sem }()
				rev, stored := s.revision(id)
				s.fireDue(ctx, id)
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

// takeDue marks the reminders due at now as in flight and returns them,
// with the next time something falls due (zero: nothing waiting).
func (s *Scheduler) takeDue(now time.Time) (due []string, next time.Time) {
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
			at = dueAt(lr.Reminder)
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

// revision returns what holdIfStuck compares.
func (s *Scheduler) revision(id string) (rev int64, stored bool) {
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

// backOff delays the next try of a reminder after a store error.
func (s *Scheduler) backOff(id string, err error) {
	s.log.Warn("reminder: store error; will retry", "id", id, "err", err)
	s.mu.Lock()
	s.hold[id] = time.Now().Add(storeRetry)
	s.mu.Unlock()
}

// fireDue claims a due reminder, fires it and records the outcome. The
// caller has marked it in flight.
func (s *Scheduler) fireDue(ctx context.Context, id string) {
	r, ver, ok := s.claim(ctx, id)
	if !ok {
		return
	}
	fireErr := s.fireRenewing(ctx, &r, &ver)

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
	s.recordOutcome(context.WithoutCancel(ctx), r, ver)
}

// fireRenewing calls Fire while renewing the claim every Lease/3.
func (s *Scheduler) fireRenewing(ctx context.Context, r *Reminder, ver *kv.Version) error {
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
					v, err := s.store.Replace(ctx, renewed, *ver)
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

// recordOutcome writes the outcome of a fire to the store (over the
// claim's version, with the CAS group) and locally. A write the store
// refused is kept locally as unsynced and pushed by a later Sync.
func (s *Scheduler) recordOutcome(ctx context.Context, r Reminder, ver kv.Version) {
	s.mu.Lock()
	deleted := s.inflight[r.ID] != nil && s.inflight[r.ID].deleted
	s.mu.Unlock()
	if deleted {
		return
	}
	unsynced := false
	switch {
	case s.cas:
		_, err := s.store.Replace(ctx, r, ver)
		switch {
		case errors.Is(err, kv.ErrConflict):
			s.log.Warn("reminder: the claim was lost while firing (the lease ran out or the reminder was deleted)", "id", r.ID)
			cur, _, gerr := s.store.Read(ctx, r.ID)
			if errors.Is(gerr, kv.ErrNotFound) {
				_ = s.dropLocal(r.ID)
				return
			}
			if gerr == nil {
				_ = s.saveLocal(cur, false)
				return
			}
			unsynced = true
		case err != nil:
			s.log.Warn("reminder: recording the outcome in the store; will retry", "id", r.ID, "err", err)
			unsynced = true
		}
	case s.store != nil:
		if err := s.store.Put(ctx, r); err != nil {
			s.log.Warn("reminder: recording the outcome in the store; will retry", "id", r.ID, "err", err)
			unsynced = true
		}
	}
	if err := s.saveLocal(r, unsynced); err != nil {
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
			if err := s.store.Delete(ctx, id); err != nil {
				s.log.Warn("reminder: removing an old reminder from the store", "id", id, "err", err)
				continue
			}
		}
		if err := s.dropLocal(id); err != nil {
			s.log.Warn("reminder: removing an old reminder", "id", id, "err", err)
		}
	}
}
