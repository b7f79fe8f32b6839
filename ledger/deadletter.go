package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"agentkit/keys"
	"agentkit/kv"
)

// DeadLetter is an event that failed MaxAttempts turns and left its
// session's inbox.
type DeadLetter struct {
	SessionID string
	EventID   string
	// InboxSeq was its place in the inbox.
	InboxSeq uint64
	Payload  json.RawMessage
	// Attempts is how many turns started on it; LastError the last failed
	// attempt's error, when it was recorded.
	Attempts  int
	LastError string
	// At is when it was dead-lettered (the host's wall clock).
	At time.Time
}

// DeadLetters yields the dead letters of one session, or of every session
// when sessionID is empty, in key order. Only an event's current dead
// letter is yielded: not one whose event is pending or committed again (a
// replay under way or done), nor an older record of an event dead-lettered
// again since.
func (l *Ledger) DeadLetters(ctx context.Context, sessionID string) iter.Seq2[DeadLetter, error] {
	return func(yield func(DeadLetter, error) bool) {
		prefix := l.keys.dlqPrefix()
		if sessionID != "" {
			prefix = l.keys.dlqSession(sessionID)
		}
		for d, err := range l.currentDeadLetters(ctx, prefix) {
			if err != nil {
				yield(DeadLetter{}, err)
				return
			}
			dl := DeadLetter{SessionID: d.Session, EventID: d.EventID, InboxSeq: d.InboxSeq, Payload: d.Payload,
				Attempts: d.Attempts, LastError: d.LastError, At: d.At}
			if !yield(dl, nil) {
				return
			}
		}
	}
}

// currentDeadLetters yields the current dead-letter records under prefix:
// for each event, the record the session's control record names (its
// recent entry, marked dead, carries the record's inbox sequence), or,
// once the event has left the de-duplication window, its newest record if
// that one is not a tombstone, unless the event is pending. An older
// record left open (its closing write failed) is never current: a newer
// dead-lettering, replay or drop has superseded it.
func (l *Ledger) currentDeadLetters(ctx context.Context, prefix string) iter.Seq2[*deadLetter, error] {
	return func(yield func(*deadLetter, error) bool) {
		ctls := map[string]*control{}
		var group []string // the keys of one event, oldest first
		flush := func() bool {
			if len(group) == 0 {
				return true
			}
			keys := group
			group = nil
			var recs []*deadLetter
			for _, key := range keys {
				data, err := l.get(ctx, key)
				if isNotFound(err) {
					continue
				}
				if err != nil {
					return yield(nil, err)
				}
				d, err := decodeDeadLetter(data)
				if err != nil {
					l.log.Warn("ledger: skipping an unreadable dead letter", "key", key, "err", err)
					continue
				}
				recs = append(recs, d) // tombstones too: the newest record decides

			}
			if len(recs) == 0 {
				return true
			}
			sid := recs[0].Session
			c, ok := ctls[sid]
			if !ok {
				var err error
				if c, _, err = l.readControl(ctx, l.keys.ctl(sid)); err != nil {
					return yield(nil, err)
				}
				ctls[sid] = c
			}
			newest := recs[len(recs)-1].InboxSeq
			for _, d := range recs {
				if d.Closed == "" && isCurrent(c, d.EventID, d.InboxSeq, newest) {
					return yield(d, nil)
				}
			}
			return true
		}
		for key, err := range l.store.ListKeys(ctx, prefix) {
			if err != nil {
				yield(nil, err)
				return
			}
			if len(group) > 0 && eventPrefix(group[0]) != eventPrefix(key) {
				if !flush() {
					return
				}
			}
			group = append(group, key)
		}
		flush()
	}
}

// eventPrefix cuts the inbox sequence off a dead-letter key.
func eventPrefix(key string) string {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i+1]
	}
	return key
}

// isCurrent reports whether the dead letter of id made at inbox sequence
// inbox is the event's current one, given its session's control record and
// the newest inbox sequence among the event's records.
func isCurrent(c *control, id string, inbox, newest uint64) bool {
	if c == nil || c.Deleted != nil {
		return false
	}
	i, r := c.find(id)
	switch {
	case i >= 0:
		return false // pending again
	case r != nil:
		return r.Dead && r.Inbox == inbox
	}
	return inbox == newest // out of the window: the latest dead-lettering
}

// currentDeadLetter finds one event's current dead letter.
func (l *Ledger) currentDeadLetter(ctx context.Context, sessionID, eventID string) (*deadLetter, error) {
	for d, err := range l.currentDeadLetters(ctx, l.keys.dlqEvent(sessionID, eventID)) {
		if err != nil {
			return nil, err
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: event %q of session %q", ErrNotDeadLettered, eventID, sessionID)
}

// Replay puts a dead-lettered event back at the end of its session's
// inbox with its attempts reset, as a delivery would (back-pressure
// included), then deletes its dead-letter record. Its id stays the same,
// so the turn that consumes it is found by the id. An event that is
// pending or committed again is a Duplicate and nothing changes.
func (l *Ledger) Replay(ctx context.Context, sessionID, eventID string) (Delivery, error) {
	if sessionID == "" || eventID == "" {
		return Delivery{}, errors.New("ledger: Replay needs a session id and an event id")
	}
	s := l.session(sessionID)
	c, err := l.readSession(ctx, sessionID)
	if err != nil {
		return Delivery{}, err
	}
	if i, r := c.find(eventID); i >= 0 || (r != nil && !r.Dead) {
		d := Delivery{SessionID: sessionID, EventID: eventID, Duplicate: true, State: StatePending, Holder: c.Holder}
		if i >= 0 {
			d.InboxSeq = c.Pending[i].Seq
		} else {
			d.State, d.CommitSeq = StateCommitted, r.Seq
		}
		return d, nil
	}
	d, err := l.currentDeadLetter(ctx, sessionID, eventID)
	if err != nil {
		return Delivery{}, err
	}
	key := l.keys.dlq(sessionID, eventID, d.InboxSeq)
	var blob string // written when the payload does not fit inline
	if size := len(d.Payload); size > l.opts.InlineLimit {
		write := func(epoch uint64) error {
			ref := blobRef(epoch, randomHex(8))
			rec := encode(kindBlob, blobRecord{Version: FormatVersion, Session: sessionID, EventID: eventID, Payload: d.Payload})
			if err := l.put(ctx, l.keys.blob(sessionID, ref), rec); err != nil {
				return err
			}
			blob = ref
			return nil
		}
		if err := l.writeBlobLoaded(ctx, s, write); err != nil {
			return Delivery{}, err
		}
	}
	var (
		res     Delivery
		started uint64
	)
	cur, sent, err := l.update(ctx, s, "replay", func(c *control) (*control, error) {
		res, started = Delivery{SessionID: sessionID, EventID: eventID}, 0
		if c == nil || c.Deleted != nil {
			return nil, fmt.Errorf("%w: session %q", ErrDeleted, sessionID)
		}
		i, r := c.find(eventID)
		switch {
		case i >= 0:
			res.Duplicate, res.State, res.InboxSeq = true, StatePending, c.Pending[i].Seq
			return nil, nil
		case r != nil && !r.Dead:
			res.Duplicate, res.State, res.CommitSeq = true, StateCommitted, r.Seq
			return nil, nil
		case r != nil && r.Inbox != d.InboxSeq:
			return nil, fmt.Errorf("%w: event %q of session %q was dead-lettered again meanwhile; replay it again", ErrNotDeadLettered, eventID, sessionID)
		}
		total, inlined := c.pendingBytes()
		size := len(d.Payload)
		if len(c.Pending) > 0 && (len(c.Pending) >= l.opts.MaxPending || total+int64(size) > l.opts.MaxPendingBytes) {
			return nil, &BusyError{SessionID: sessionID, Pending: len(c.Pending), PendingBytes: total, RetryAfter: l.opts.RetryAfter}
		}
		e := entry{Seq: c.NextSeq, ID: eventID, Size: size, Replayed: true, From: d.InboxSeq, Keyed: d.Keyed}
		switch {
		case blob != "":
			if ep, _ := blobEpoch(blob); c.Epoch > ep+1 {
				return nil, errStaleBlob
			}
			e.Blob = blob
		case inlined+int64(size) > int64(l.opts.MaxInlineBytes):
			return nil, errStaleBlob // too much inline already: retried with a blob
		default:
			e.Inline = d.Payload
		}
		c.Recent = removeRecent(c.Recent, eventID)
		c.Pending = append(c.Pending, e)
		c.NextSeq++
		res.State, res.InboxSeq = StatePending, e.Seq
		if c.Holder == "" && !l.opts.Passive {
			c.Holder, res.Acquired = l.opts.HostID, true
			c.Gen++
			c.Renew = 0
			started = startNext(c, l.opts.MaxAttempts)
		}
		res.Holder, res.Local = c.Holder, c.Holder == l.opts.HostID
		return c, nil
	})
	if errors.Is(err, errStaleBlob) {
		// Rare: the blob epoch moved on, or the record's inline space ran
		// out. The caller retries; nothing was changed.
		err = fmt.Errorf("ledger: replay of %q raced with the session's sweep or inbox; try again", eventID)
	}
	if err != nil || res.Duplicate {
		if blob != "" && cur != nil && !references(cur, blob) && !errors.Is(err, errUnknownOutcome) {
			l.del(ctx, l.keys.blob(sessionID, blob))
		}
		return res, err
	}
	// The control record no longer names this record: close it. A failure
	// leaves a record that listings skip and that the commit of the
	// replayed event closes.
	if err := l.closeDeadLetter(ctx, sessionID, eventID, d.InboxSeq, "replayed"); err != nil {
		l.log.Warn("ledger: closing a replayed dead letter failed; its event's commit closes it", "key", key, "err", err)
	}
	if res.Local {
		if c := s.snapshot(); c != nil && c.Holder == l.opts.HostID {
			l.ensureRunner(s, c.Gen, started, sent)
		}
	}
	return res, nil
}

var errStaleBlob = errors.New("ledger: replay must write its payload again")

func removeRecent(rs []recent, id string) []recent {
	out := rs[:0:0]
	for _, r := range rs {
		if r.ID != id {
			out = append(out, r)
		}
	}
	return out
}

// Drop removes an event's dead letter for good (its record is closed, and
// any older record of the same event with it).
func (l *Ledger) Drop(ctx context.Context, sessionID, eventID string) error {
	if sessionID == "" || eventID == "" {
		return errors.New("ledger: Drop needs a session id and an event id")
	}
	if _, err := l.currentDeadLetter(ctx, sessionID, eventID); err != nil {
		return err
	}
	prefix := l.keys.dlqEvent(sessionID, eventID)
	for key, err := range l.store.ListKeys(ctx, prefix) {
		if err != nil {
			return err
		}
		inbox, err := keys.ParseSeq(strings.TrimPrefix(key, prefix))
		if err != nil {
			continue
		}
		if err := l.closeDeadLetter(ctx, sessionID, eventID, inbox, "dropped"); err != nil {
			return err
		}
	}
	return nil
}

// createDeadLetter writes a dead letter where none exists. A record already
// there is this one (a retry after a lost answer, or another holder
// dead-lettering the same entry) or a tombstone (the entry was replayed or
// dropped meanwhile, so the caller's compare-and-set will be fenced); either
// way nothing more is written.
func (l *Ledger) createDeadLetter(ctx context.Context, key string, rec deadLetter) error {
	data := encode(kindDeadLetter, rec)
	var err error
	for i := range 3 {
		if i > 0 {
			if serr := sleepCtx(ctx, time.Duration(i)*l.opts.Lease/50); serr != nil {
				return serr
			}
		}
		cctx, cancel := context.WithTimeout(ctx, l.opTimeout())
		_, err = l.store.PutIfAbsent(cctx, key, data)
		cancel()
		if err == nil || errors.Is(err, kv.ErrConflict) {
			return nil
		}
		if permanent(ctx, err) {
			return err
		}
	}
	return err
}

// closeDeadLetter overwrites a dead letter with its tombstone.
func (l *Ledger) closeDeadLetter(ctx context.Context, sid, eventID string, inbox uint64, how string) error {
	rec := deadLetter{Version: FormatVersion, Closed: how, Session: sid, EventID: eventID, InboxSeq: inbox,
		Payload: json.RawMessage("null"), At: time.Now().UTC()}
	return l.put(ctx, l.keys.dlq(sid, eventID, inbox), encode(kindDeadLetter, rec))
}
