package ledger

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"agentkit/kv"
)

// Page is one page of a session's committed transcript.
type Page struct {
	Turns []Committed
	// Next is the after of the next page: the last turn's Seq, or the
	// after asked for when the page is empty.
	Next uint64
	// More is true when committed turns after this page exist.
	More bool
	// Head is the last committed sequence number when the page was read.
	Head uint64
}

// DefaultPageSize is the page size of Transcript when limit is 0.
const DefaultPageSize = 100

// Transcript reads committed turns after the sequence number after (0 for
// the first page), at most limit (0 means DefaultPageSize), in order. It
// reads the control record first, then each turn: a turn still carried by
// the record is taken from there, any other from its turns/{seq} key,
// which was written before the record let go of it. So the page holds
// exactly the committed turns, whichever host committed them.
func (l *Ledger) Transcript(ctx context.Context, sessionID string, after uint64, limit int) (Page, error) {
	if limit <= 0 {
		limit = DefaultPageSize
	}
	c, err := l.readSession(ctx, sessionID)
	if err != nil {
		return Page{}, err
	}
	p := Page{Next: after, Head: c.Commit}
	if after >= c.Commit {
		return p, nil
	}
	hi := min(after+uint64(limit), c.Commit)
	p.Turns = make([]Committed, hi-after)
	errs := make([]error, hi-after)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for seq := after + 1; seq <= hi; seq++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t, err := l.turnAt(ctx, sessionID, c, seq)
			if err == nil {
				p.Turns[seq-after-1] = t
			}
			errs[seq-after-1] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Page{}, err
	}
	p.Next, p.More = hi, hi < c.Commit
	return p, nil
}

// turnAt reads committed turn seq of a session whose control record c was
// read before (nil: read it now).
func (l *Ledger) turnAt(ctx context.Context, sid string, c *control, seq uint64) (Committed, error) {
	if c == nil {
		var err error
		if c, err = l.readSession(ctx, sid); err != nil {
			return Committed{}, err
		}
	}
	if seq == 0 || seq > c.Commit {
		return Committed{}, fmt.Errorf("ledger: session %q has no committed turn %d (it has %d)", sid, seq, c.Commit)
	}
	if u := c.unflushed(seq); u != nil {
		if u.Ref == "" {
			return u.committed(sid), nil
		}
		t, err := l.readOut(ctx, sid, *u)
		if err != nil {
			return Committed{}, err
		}
		return t.committed(sid), nil
	}
	t, err := l.readTurnKey(ctx, sid, seq)
	if err != nil {
		return Committed{}, err
	}
	return t.committed(sid), nil
}

// readTurnKey reads turns/{seq}.
func (l *Ledger) readTurnKey(ctx context.Context, sid string, seq uint64) (*turnRecord, error) {
	key := l.keys.turn(sid, seq)
	data, err := l.get(ctx, key)
	if err != nil {
		if isNotFound(err) {
			// Committed and no longer in the record, so it was flushed:
			// only a deletion removes it.
			if _, rerr := l.readSession(ctx, sid); rerr != nil {
				return nil, rerr
			}
			return nil, fmt.Errorf("ledger: committed turn %d of session %q is missing from %s", seq, sid, key)
		}
		return nil, err
	}
	t, err := decodeTurn(data)
	if err != nil {
		return nil, fmt.Errorf("%w (key %s)", err, key)
	}
	if t.Seq != seq {
		return nil, fmt.Errorf("%w: %s holds turn %d", ErrFormat, key, t.Seq)
	}
	return t, nil
}

func isNotFound(err error) bool { return errors.Is(err, kv.ErrNotFound) }

// Turn reads one committed turn.
func (l *Ledger) Turn(ctx context.Context, sessionID string, seq uint64) (Committed, error) {
	return l.turnAt(ctx, sessionID, nil, seq)
}

// Follow yields the session's committed turns after after, in order, as
// they are committed, until ctx ends (the sequence then ends without an
// error) or the session is deleted (it ends with an error matching
// ErrDeleted). On the host running the session a commit is seen at once;
// elsewhere the control record is read every FollowInterval.
func (l *Ledger) Follow(ctx context.Context, sessionID string, after uint64) iter.Seq2[Committed, error] {
	return func(yield func(Committed, error) bool) {
		s := l.session(sessionID)
		for {
			changed := s.watch()
			p, err := l.Transcript(ctx, sessionID, after, DefaultPageSize)
			if err != nil {
				if ctx.Err() == nil {
					yield(Committed{}, err)
				}
				return
			}
			for _, t := range p.Turns {
				if !yield(t, nil) {
					return
				}
			}
			after = p.Next
			if p.More {
				continue
			}
			if !l.waitChange(ctx, changed) {
				return
			}
		}
	}
}

// waitChange waits for a local change of the session, FollowInterval, or
// the end of ctx (false).
func (l *Ledger) waitChange(ctx context.Context, changed <-chan struct{}) bool {
	t := time.NewTimer(l.opts.FollowInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-t.C:
	}
	return true
}

// Await waits until the event is consumed and returns the turn that
// consumed it. It fails with ErrDeadLettered when the event went to the
// dead-letter store, and with ErrUnknownEvent when the session does not
// know the event.
func (l *Ledger) Await(ctx context.Context, sessionID, eventID string) (Committed, error) {
	s := l.session(sessionID)
	for {
		changed := s.watch()
		st, err := l.Lookup(ctx, sessionID, eventID)
		if err != nil {
			return Committed{}, err
		}
		switch st.State {
		case StateCommitted:
			return l.turnAt(ctx, sessionID, nil, st.CommitSeq)
		case StateDeadLettered:
			return Committed{}, fmt.Errorf("%w: event %q of session %q", ErrDeadLettered, eventID, sessionID)
		}
		if !l.waitChange(ctx, changed) {
			return Committed{}, ctx.Err()
		}
	}
}

// SessionInfo describes a session in the store.
type SessionInfo struct {
	ID string
	// Holder is the host holding the lease, "" for none; Generation the
	// lease generation.
	Holder     string
	Generation uint64
	// CommitSeq is the number of committed turns.
	CommitSeq uint64
	// Pending and PendingBytes describe the inbox.
	Pending      int
	PendingBytes int64
	// Deleted is true for a tombstone.
	Deleted bool
	// Created and Updated (the last commit) are wall-clock times.
	Created, Updated time.Time
}

// SessionInfo reads one session's control record: its description, a
// tombstone's included, or an error matching ErrUnknownSession when the
// store has none.
func (l *Ledger) SessionInfo(ctx context.Context, sessionID string) (SessionInfo, error) {
	if sessionID == "" {
		return SessionInfo{}, errors.New("ledger: the session id is empty")
	}
	c, _, err := l.readControl(ctx, l.keys.ctl(sessionID))
	if err != nil {
		return SessionInfo{}, err
	}
	if c == nil {
		return SessionInfo{}, fmt.Errorf("%w: %q", ErrUnknownSession, sessionID)
	}
	return infoOf(c), nil
}

func infoOf(c *control) SessionInfo {
	total, _ := c.pendingBytes()
	return SessionInfo{ID: c.Session, Holder: c.Holder, Generation: c.Gen, CommitSeq: c.Commit,
		Pending: len(c.Pending), PendingBytes: total, Deleted: c.Deleted != nil, Created: c.Created, Updated: c.Updated}
}

// Sessions yields every session of the agent in the store, tombstones
// included, in key order, reading one control record per session.
func (l *Ledger) Sessions(ctx context.Context) iter.Seq2[SessionInfo, error] {
	return func(yield func(SessionInfo, error) bool) {
		for c, err := range l.controls(ctx) {
			if err != nil {
				yield(SessionInfo{}, err)
				return
			}
			if !yield(infoOf(c), nil) {
				return
			}
		}
	}
}

// controls yields every control record, with List when the store has it,
// else with ListKeys and a Get per key. A record that cannot be read is
// logged and skipped; a store error ends the sequence.
func (l *Ledger) controls(ctx context.Context) iter.Seq2[*control, error] {
	return func(yield func(*control, error) bool) {
		prefix := l.keys.ctlPrefix()
		decode := func(key string, data []byte) (*control, bool) {
			c, err := decodeControl(data)
			if err != nil {
				l.log.Warn("ledger: skipping an unreadable control record", "key", key, "err", err)
				return nil, false
			}
			return c, true
		}
		if l.store.Capabilities().List {
			for e, err := range l.store.List(ctx, prefix) {
				if err != nil {
					yield(nil, err)
					return
				}
				if c, ok := decode(e.Key, e.Value); ok && !yield(c, nil) {
					return
				}
			}
			return
		}
		for key, err := range l.store.ListKeys(ctx, prefix) {
			if err != nil {
				yield(nil, err)
				return
			}
			data, err := l.get(ctx, key)
			if isNotFound(err) {
				continue
			}
			if err != nil {
				yield(nil, err)
				return
			}
			if c, ok := decode(key, data); ok && !yield(c, nil) {
				return
			}
		}
	}
}

// Delete deletes a session: one compare-and-set turns its control record
// into a tombstone, with a new generation that fences the holder (its
// commit fails), and discards the pending events (listed in the
// tombstone). Then the session's turns, payloads and dead letters are
// deleted; what a failure leaves, the janitor deletes later. Deleting a
// deleted session succeeds; an unknown one is ErrUnknownSession.
func (l *Ledger) Delete(ctx context.Context, sessionID string) error {
	if sessionID == "" {
		return errors.New("ledger: the session id is empty")
	}
	s := l.session(sessionID)
	_, _, err := l.update(ctx, s, "delete", func(c *control) (*control, error) {
		if c == nil {
			return nil, fmt.Errorf("%w: %q", ErrUnknownSession, sessionID)
		}
		if c.Deleted != nil {
			return nil, nil
		}
		t := &tombstone{At: time.Now().UTC(), Host: l.opts.HostID}
		for _, e := range c.Pending {
			t.Discarded = append(t.Discarded, e.ID)
		}
		c.Deleted = t
		c.Gen++
		c.Holder = ""
		c.Pending, c.Unflushed, c.Recent = nil, nil, nil
		return c, nil
	})
	if err != nil {
		return err
	}
	return l.purge(ctx, s)
}

// purge deletes a deleted session's keys, then marks the tombstone purged.
func (l *Ledger) purge(ctx context.Context, s *session) error {
	for _, prefix := range []string{l.keys.data(s.id), l.keys.dlqSession(s.id)} {
		for key, err := range l.store.ListKeys(ctx, prefix) {
			if err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(ctx, l.opTimeout())
			err := l.store.Delete(cctx, key)
			cancel()
			if err != nil {
				return err
			}
		}
	}
	_, _, err := l.update(ctx, s, "purge", func(c *control) (*control, error) {
		if c == nil || c.Deleted == nil || c.Deleted.Purged {
			return nil, nil
		}
		c.Deleted.Purged = true
		return c, nil
	})
	return err
}
