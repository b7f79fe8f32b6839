package ledger

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"agentkit/kv"
)

// Kept keys: the ids of keyed events (Event.Keyed) outlive the
// de-duplication window for IdempotencyWindow.
//
// The window (control.Recent) is inside the control record, so a delivery
// finds a recent id with the very compare-and-set that acknowledges it.
// An id leaving the window is kept under a key of its own,
// data/{sid}/keys/{eventId}, which the holder writes BEFORE the write
// that evicts the id from Recent. A delivery of a keyed id the control
// record does not know (read at version V, cached or fresh) then reads
// the id's kept key, and appends with a compare-and-set expecting V:
//
//   - if the id was evicted by a write at or before V, its kept key was
//     written before that write, which was before this host learnt of V,
//     which was before the read: the read finds it (the store is
//     linearizable), and the delivery is a duplicate;
//   - if the id is evicted after V, that write changed the version, and
//     the append's compare-and-set fails; the delivery reads the record
//     again and decides afresh.
//
// So a keyed id is never queued again while its kept key is in the store,
// and the acknowledgement stays one compare-and-set: an unkeyed delivery
// costs what it did, a keyed one a read more (none while the session has
// no kept key, which control.Keys tells). The janitor deletes a kept key
// once IdempotencyWindow + ClockSkew have passed since it was written, on
// its own wall clock, and only while its id is in neither the inbox nor
// the window; then a retry is a new event.

// errWriteKeys makes a consuming write return so that the kept keys of the
// ids it evicts are written first.
var errWriteKeys = fmt.Errorf("%w: the kept keys of the evicted ids come first", errRetry)

// wallNow is this host's wall clock.
func (l *Ledger) wallNow() time.Time {
	if l.opts.test.now != nil {
		return l.opts.test.now()
	}
	return time.Now()
}

// readKept reads an event id's kept key: nil when there is none.
func (l *Ledger) readKept(ctx context.Context, sid, eventID string) (*keptKey, error) {
	key := l.keys.kept(sid, eventID)
	data, err := l.get(ctx, key)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	k, err := decodeKeptKey(data)
	if err != nil {
		return nil, fmt.Errorf("%w (key %s)", err, key)
	}
	return k, nil
}

// writeKept writes the kept keys of ids about to leave sid's window, and
// records when each was written. A write that fails is tried again until
// ctx ends: the evicting write must not go first.
func (l *Ledger) writeKept(ctx context.Context, sid string, ids []recent, written map[string]time.Time) error {
	for _, e := range ids {
		at := l.wallNow().UTC()
		rec := keptKey{Version: FormatVersion, Session: sid, EventID: e.ID, Seq: e.Seq, Dead: e.Dead, Inbox: e.Inbox,
			At: at, Host: l.opts.HostID}
		data := encode(kindKeptKey, rec)
		for {
			l.step("keys:put")
			err := l.put(ctx, l.keys.kept(sid, e.ID), data)
			if err == nil {
				break
			}
			if permanent(ctx, err) {
				return err
			}
			if err := sleepCtx(ctx, l.opts.RetryDelay); err != nil {
				return err
			}
		}
		written[e.ID] = at
	}
	return nil
}

// writeConsuming is r.write for a write that takes an event out of the
// inbox: mutate returns the next record and the consumed id's entry for
// the window. The keyed ids that entry pushes out of the window
// (rules.evicts) get their kept keys first, so an id leaves the window
// only once its kept key is in the store; the write also counts them in
// control.Keys.
func (r *runner) writeConsuming(ctx context.Context, step string, mutate func(c *control) (*control, *recent, error)) (*control, error) {
	l := r.l
	written := map[string]time.Time{}
	for {
		var missing []recent
		c, err := r.write(ctx, step, func(c *control) (*control, error) {
			missing = nil
			next, rec, err := mutate(c)
			if next == nil || err != nil || rec == nil {
				return next, err
			}
			evicted := l.rules().evicts(next, l.opts.DedupWindow)
			for _, e := range evicted {
				if _, ok := written[e.ID]; !ok {
					missing = append(missing, e)
				}
			}
			if len(missing) > 0 {
				return nil, errWriteKeys
			}
			next.remember(*rec, l.opts.DedupWindow)
			next.keep(evicted, written)
			return next, nil
		})
		if errors.Is(err, errWriteKeys) {
			if err := l.writeKept(ctx, r.s.id, missing, written); err != nil {
				return nil, err
			}
			continue
		}
		return c, err
	}
}

// keptDuplicate fills in the answer to a delivery of an id found kept.
func keptDuplicate(res *Delivery, k *keptKey) {
	res.Duplicate = true
	if k.Dead {
		res.State = StateDeadLettered
		return
	}
	res.State, res.CommitSeq = StateCommitted, k.Seq
}

// keysBusy is the refusal of a keyed delivery to a session keeping
// MaxKeys kept keys: it suggests retrying once the oldest can go.
func (l *Ledger) keysBusy(c *control) *BusyError {
	wait := l.opts.RetryAfter
	if !c.KeysAt.IsZero() {
		wait = max(wait, c.KeysAt.Add(l.opts.IdempotencyWindow+l.opts.ClockSkew).Sub(l.wallNow())+l.opts.JanitorInterval)
	}
	total, _ := c.pendingBytes()
	return &BusyError{SessionID: c.Session, Pending: len(c.Pending), PendingBytes: total, RetryAfter: wait.Round(time.Second), Keys: c.Keys}
}

// maxCollect bounds the kept keys one collection deletes; the rest wait
// for the next scan.
const maxCollect = 1000

// keysDue reports whether the janitor should collect c's kept keys now:
// the oldest counted one has expired.
func (l *Ledger) keysDue(c *control, now time.Time) bool {
	return c.Deleted == nil && c.Keys > 0 && l.rules().expired(c.KeysAt, now, l.opts.IdempotencyWindow, l.opts.ClockSkew)
}

// collectKeys deletes a session's expired kept keys and counts the others
// again. It reads the control record (version V), lists the kept keys,
// deletes those expired whose id the record at V has in neither the inbox
// nor the window (at most maxCollect), and sets control.Keys to the kept
// keys left of ids outside the record at V plus those that writes after
// V added. A listing started after V holds every kept key of an id
// evicted at or before V; an id evicted later was counted by its
// evicting write. So the count is never below the truth, and if another
// collection wrote meanwhile, nothing is counted (its count stands).
func (l *Ledger) collectKeys(ctx context.Context, sid string) error {
	s := l.session(sid)
	c, _, err := l.readControl(ctx, s.key)
	if err != nil || c == nil || c.Deleted != nil || c.Keys == 0 {
		return err
	}
	now := l.wallNow()
	var (
		left, deleted int
		oldest        time.Time
	)
	for e, err := range l.entries(ctx, l.keys.keysPrefix(sid)) {
		if err != nil {
			return err
		}
		k, err := decodeKeptKey(e.Value)
		if err != nil {
			// Unreadable (a newer format, say): kept and counted.
			l.log.Warn("ledger: skipping an unreadable kept key", "key", e.Key, "err", err)
			left++
			continue
		}
		if i, r := c.find(k.EventID); i >= 0 || r != nil {
			continue // the record knows the id: not counted, not collected
		}
		if deleted < maxCollect && l.rules().expired(k.At, now, l.opts.IdempotencyWindow, l.opts.ClockSkew) {
			l.step("keys:delete")
			cctx, cancel := context.WithTimeout(ctx, l.opTimeout())
			err := l.store.Delete(cctx, e.Key)
			cancel()
			if err == nil {
				deleted++
				continue
			}
			if ctx.Err() != nil {
				return err
			}
			l.log.Warn("ledger: deleting an expired kept key failed; the next collection retries", "key", e.Key, "err", err)
		}
		left++
		if oldest.IsZero() || k.At.Before(oldest) {
			oldest = k.At
		}
	}
	_, _, err = l.update(ctx, s, "keys", func(cur *control) (*control, error) {
		if cur == nil || cur.Deleted != nil || cur.KeysSwept != c.KeysSwept {
			return nil, errChanged
		}
		added := max(0, cur.Keys-c.Keys) // evicting writes since V
		cur.Keys = left + added
		cur.KeysSwept++
		switch {
		case cur.Keys == 0:
			cur.KeysAt = time.Time{}
		case left > 0 && !oldest.IsZero():
			cur.KeysAt = oldest
		default:
			cur.KeysAt = now.UTC() // only keys written since V: younger than now
		}
		return cur, nil
	})
	if errors.Is(err, errChanged) {
		return nil
	}
	return err
}

// entries yields every entry under prefix, with List when the store has
// it, else with ListKeys and a Get per key.
func (l *Ledger) entries(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	if l.store.Capabilities().List {
		return l.store.List(ctx, prefix)
	}
	return func(yield func(kv.Entry, error) bool) {
		for key, err := range l.store.ListKeys(ctx, prefix) {
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			data, err := l.get(ctx, key)
			if isNotFound(err) {
				continue
			}
			if !yield(kv.Entry{Key: key, Value: data}, err) || err != nil {
				return
			}
		}
	}
}
