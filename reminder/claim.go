package reminder

import (
	"context"
	"errors"
	"time"

	"agentkit/kv"
)

// claimable reports whether a reminder may be claimed at now: pending and
// due, or claimed with its lease run out.
func claimable(r Reminder, now time.Time, lease time.Duration) bool {
	switch r.State {
	case StatePending:
		return !dueAt(r).After(now)
	case StateClaimed:
		return !r.ClaimedAt.Add(lease).After(now)
	}
	return false
}

// claim makes this host the one that fires a due reminder. With the CAS
// group it reads the stored record with its version, checks it is still
// claimable, and writes the claim (state claimed, this host, now, one more
// attempt) only over that version: among hosts doing the same at the same
// moment exactly one write succeeds, so exactly one host fires. A host
// that loses adopts the winner's record. Without the CAS group the local
// copy is the claim (one host only). It returns the claimed reminder and
// the version of the claim, and false when this host must not fire.
func (s *Scheduler) claim(ctx context.Context, id string) (Reminder, kv.Version, bool) {
	s.mu.Lock()
	lr, ok := s.recs[id]
	var r Reminder
	stored := false
	if ok {
		r, stored = lr.Reminder, lr.Stored
	}
	s.mu.Unlock()
	if !ok || ctx.Err() != nil {
		return Reminder{}, "", false
	}
	now := time.Now()
	var ver kv.Version
	if s.cas {
		cur, v, err := s.store.Read(ctx, id)
		switch {
		case errors.Is(err, kv.ErrNotFound) && !stored:
			// From before the store was configured: store it first; the
			// next round claims it.
			if err := s.uploadNew(ctx, r); err != nil {
				s.backOff(id, err)
			}
			return Reminder{}, "", false
		case errors.Is(err, kv.ErrNotFound):
			// Deleted on another host.
			if err := s.dropLocal(id); err != nil {
				s.log.Error("reminder: dropping a deleted reminder", "id", id, "err", err)
			}
			return Reminder{}, "", false
		case err != nil:
			s.backOff(id, err)
			return Reminder{}, "", false
		}
		if !claimable(cur, now, s.opts.Lease) {
			if err := s.saveLocal(cur, false); err != nil {
				s.log.Error("reminder: saving locally", "id", id, "err", err)
			}
			return Reminder{}, "", false
		}
		r, ver = cur, v
	} else if !claimable(r, now, s.opts.Lease) {
		return Reminder{}, "", false
	}
	r.State, r.ClaimedBy, r.ClaimedAt = StateClaimed, s.opts.HostID, now.UTC()
	r.Attempts++
	r.Rev++
	if !s.cas {
		// Single host: the local copy is the claim, so a crash mid-fire is
		// retried after the lease.
		if err := s.saveLocal(r, false); err != nil {
			s.log.Error("reminder: saving the claim locally; not firing", "id", id, "err", err)
			s.backOff(id, err)
			return Reminder{}, "", false
		}
		if s.store != nil {
			if err := s.store.Put(ctx, r); err != nil {
				s.log.Warn("reminder: mirroring the claim to the store", "id", id, "err", err)
			}
		}
		return r, "", true
	}
	v, err := s.store.Replace(ctx, r, ver)
	if errors.Is(err, kv.ErrConflict) {
		// Another host claimed it (or it changed): adopt what won.
		if cur, _, rerr := s.store.Read(ctx, id); rerr == nil {
			_ = s.saveLocal(cur, false)
		} else if errors.Is(rerr, kv.ErrNotFound) {
			_ = s.dropLocal(id)
		}
		return Reminder{}, "", false
	}
	if err != nil {
		s.backOff(id, err)
		return Reminder{}, "", false
	}
	if err := s.saveLocal(r, false); err != nil {
		s.log.Error("reminder: saving the claim locally", "id", id, "err", err)
	}
	return r, v, true
}
