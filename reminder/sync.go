package reminder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"agentkit/kv"
	"agentkit/storage"
)

// Sync lists the store's reminders and merges them into the local copies:
// new ones are adopted, and so are newer copies (a higher Rev); local states
// the store missed (a failed write) are pushed; reminders deleted from the
// store are dropped. Without a store, or one that cannot list, Sync
// does nothing.
func (s *Scheduler) Sync(ctx context.Context) error {
	if s.store == nil || !s.store.CanList() {
		return nil
	}
	started := time.Now()
	seen := map[string]bool{}
	var errs []error
	for r, err := range s.store.List(ctx) {
		if storage.IsRecordError(err) {
			s.log.Error("reminder: skipped a stored record", "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("reminder: listing the store: %w", err)
		}
		seen[r.ID] = true
		if err := s.mergeStored(ctx, r); err != nil {
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
		if err := s.uploadNew(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	s.poke()
	return errors.Join(errs...)
}

// uploadNew writes a reminder the store never had (made before a store was
// configured).
func (s *Scheduler) uploadNew(ctx context.Context, r Reminder) error {
	err := s.store.Create(ctx, r)
	if s.cas && errors.Is(err, kv.ErrConflict) {
		return nil // it arrived meanwhile: the next Sync adopts it
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

// mergeStored takes a stored record into the local copies.
func (s *Scheduler) mergeStored(ctx context.Context, r Reminder) error {
	s.mu.Lock()
	lr, have := s.recs[r.ID]
	busy := s.inflight[r.ID] != nil
	unsynced := have && lr.Unsynced
	s.mu.Unlock()
	switch {
	case busy:
		return nil
	case unsynced:
		return s.pushUnsynced(ctx, r.ID)
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

// adopt replaces the local copy with a newer stored one, unless the
// reminder is being processed or was deleted meanwhile.
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

// pushUnsynced writes a local state the store missed (its write failed).
func (s *Scheduler) pushUnsynced(ctx context.Context, id string) error {
	s.mu.Lock()
	lr, ok := s.recs[id]
	if !ok || !lr.Unsynced || s.inflight[id] != nil {
		s.mu.Unlock()
		return nil
	}
	mine := lr.Reminder
	s.inflight[id] = &flight{}
	s.mu.Unlock()
	defer s.endFlight(id)
	if !s.cas {
		if err := s.store.Put(ctx, mine); err != nil {
			return fmt.Errorf("reminder: pushing %s to the store: %w", id, err)
		}
		return s.saveLocal(mine, false)
	}
	theirs, ver, err := s.store.Read(ctx, id)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return s.dropLocal(id)
	case err != nil:
		return fmt.Errorf("reminder: pushing %s to the store: %w", id, err)
	}
	// Every conditional write adds one to Rev, and ours is one more than
	// the last write of ours the store took: a higher Rev than the store's
	// means nobody wrote since, so ours is the newer state.
	if mine.Rev > theirs.Rev {
		if _, err := s.store.Replace(ctx, mine, ver); err == nil {
			return s.saveLocal(mine, false)
		} else if !errors.Is(err, kv.ErrConflict) {
			return fmt.Errorf("reminder: pushing %s to the store: %w", id, err)
		}
		return nil // changed meanwhile: the next Sync looks again
	}
	return s.saveLocal(theirs, false)
}

// saveLocal saves a local copy, unless the reminder was deleted meanwhile.
// unsynced marks a state the store has not taken.
func (s *Scheduler) saveLocal(r Reminder, unsynced bool) error {
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

// dropLocal drops the local copy of a reminder deleted elsewhere.
func (s *Scheduler) dropLocal(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.recs, id)
	return s.local.remove(id)
}

// endFlight ends the processing of a reminder.
func (s *Scheduler) endFlight(id string) {
	s.mu.Lock()
	delete(s.inflight, id)
	s.mu.Unlock()
}
