package agent

import (
	"context"
	"slices"
	"time"
)

// The store mirror's backlog: the sessions the store lacks something of,
// flushed at start-up and retried in the background with back-off.

// setBacklog records whether the store lacks something of a session, tells
// the Observer when the count changes, and wakes the background retry.
func (mr *storeMirror) setBacklog(id string, owes bool) {
	mr.mu.Lock()
	changed := mr.backlog[id] != owes
	if owes {
		mr.backlog[id] = true
	} else {
		delete(mr.backlog, id)
	}
	n := len(mr.backlog)
	mr.mu.Unlock()
	if changed {
		mr.r.obs.MirrorBacklog(n)
	}
	if owes {
		select {
		case mr.wake <- struct{}{}:
		default:
		}
	}
}

// pending returns the sessions in the backlog, in id order.
func (mr *storeMirror) pending() []string {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	ids := make([]string, 0, len(mr.backlog))
	for id := range mr.backlog {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (mr *storeMirror) owes(id string) bool {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	return mr.backlog[id]
}

// stats implements commitPath.
func (mr *storeMirror) stats() (int64, int, int64) {
	mr.mu.Lock()
	n := len(mr.backlog)
	mr.mu.Unlock()
	return mr.failed.Load(), n, mr.forks.Load()
}

// flushBacklog flushes every session the store lacks something of, at
// start-up: events recorded before the process stopped (a SIGKILL mid-turn)
// or refused by the store. No turn runs yet. After the first session the
// store still refuses, the others are only put in the backlog, for the
// background retry: a store that is down delays the start by one
// mirrorTimeout at most.
func (mr *storeMirror) flushBacklog(ctx context.Context) error {
	ids, err := mr.r.db.Backlog(ctx)
	if err != nil {
		return err
	}
	for i, id := range ids {
		st, release, err := mr.r.lockSession(ctx, id)
		if err != nil {
			return err
		}
		mr.flush(ctx, st, id, true)
		release()
		if mr.owes(id) {
			for _, rest := range ids[i+1:] {
				mr.setBacklog(rest, true)
			}
			break
		}
	}
	return nil
}

// flushOwed implements commitPath: every session the local database
// says the store lacks something of is flushed, under its turn lock.
func (mr *storeMirror) flushOwed(ctx context.Context) (int, error) {
	r := mr.r
	ids, err := r.db.Backlog(ctx)
	if err != nil {
		return 0, err
	}
	owed := 0
	for _, id := range ids {
		st, release, err := r.lockSession(ctx, id)
		if err != nil {
			return owed, err
		}
		mr.flush(ctx, st, id, true)
		release()
		if mr.owes(id) {
			owed++
		}
	}
	return owed, nil
}

// start implements commitPath: the background retry. While sessions are
// in the backlog it flushes them, first retryMin after a failure, doubling
// the wait after each round that leaves writes owed, up to retryMax. A
// session whose turn is running is skipped: the turn's end flushes it.
func (mr *storeMirror) start(ctx context.Context) {
	r := mr.r
	r.every(ctx, saveInterval, func() { mr.save(ctx, false) })
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		backoff := retryMin
		for {
			if len(mr.pending()) == 0 {
				backoff = retryMin
				select {
				case <-ctx.Done():
					return
				case <-mr.wake:
					continue
				}
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			clean := true
			for _, id := range mr.pending() {
				st, release, ok := r.tryLockSession(id)
				if !ok {
					continue
				}
				mr.flush(ctx, st, id, true)
				release()
				if mr.owes(id) {
					clean = false
				}
			}
			if ctx.Err() != nil {
				return
			}
			if clean {
				backoff = retryMin
			} else {
				backoff = min(2*backoff, retryMax)
			}
		}
	}()
}
