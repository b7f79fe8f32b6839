package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Event is one message for a session: a user message, a reminder firing.
type Event struct {
	// ID names the event. A second delivery with the same ID to the same
	// session is a duplicate and is not queued again (the HTTP routes use
	// the client's Idempotency-Key; reminders use the reminder id). At
	// most MaxEventIDBytes bytes; required.
	ID string
	// Payload is the event's content, a JSON value the Handler reads.
	Payload json.RawMessage
	// Keyed marks an id that a source may send again later (a client's
	// Idempotency-Key, a reminder's id): it is remembered for
	// IdempotencyWindow after the event was consumed, beyond the last
	// DedupWindow consumed ids, and a delivery of it costs a read more
	// once the session keeps such ids. An id a server made up for one
	// call needs no more than DedupWindow.
	Keyed bool
}

// EventState is where an event is.
type EventState string

// The states of an event.
const (
	// StatePending: in the inbox, waiting for (or in) a turn.
	StatePending EventState = "pending"
	// StateCommitted: consumed by a committed turn.
	StateCommitted EventState = "committed"
	// StateDeadLettered: in the dead-letter store.
	StateDeadLettered EventState = "dead-lettered"
)

// Delivery is the answer to Deliver: the event is acknowledged (durably in
// the inbox, or already known).
type Delivery struct {
	SessionID string
	EventID   string
	// Duplicate is true when the event id was already pending, among the
	// session's recent ids, or (for a keyed event) kept; nothing was
	// written, and State says where the event is.
	Duplicate bool
	State     EventState
	// InboxSeq is the event's place in the inbox (0 for a duplicate no
	// longer pending).
	InboxSeq uint64
	// CommitSeq is the turn that consumed a committed duplicate.
	CommitSeq uint64
	// Acquired is true when this delivery took the session's lease for
	// this host: this host now runs the session's turns.
	Acquired bool
	// Local is true when this host holds the session (acquired now or
	// before), so this host will run the event's turn; false when another
	// host holds it (the HTTP answer is then 202 with the event id).
	Local bool
	// Holder is the host holding the session after the delivery.
	Holder string
	// Created is when the session was created (its first delivery), as
	// its control record says.
	Created time.Time
}

// Deliver puts ev in the session's inbox. Its return without error is the
// acknowledgement: the event is durably in the inbox (or was already
// known), and it will end in exactly one committed turn or in the
// dead-letter store. The acknowledging write is one compare-and-set of the
// session's control record, preceded by a blob write for payloads larger
// than InlineLimit. When no host holds the session, the same write makes
// this host the holder, and this host starts running the session's turns.
//
// A session is created by its first delivery. Deliver refuses a deleted
// session (ErrDeleted), a full inbox (a BusyError: nothing is
// acknowledged), and an event id or payload over its limit (ErrTooLarge).
// Any other error leaves the outcome unknown to the caller, who retries
// with the same event id: a delivery that did land is then a duplicate.
//
// Options.OnDeliver, when set, sees every call's answer and duration.
func (l *Ledger) Deliver(ctx context.Context, sessionID string, ev Event) (Delivery, error) {
	if l.opts.OnDeliver == nil {
		return l.deliver(ctx, sessionID, ev)
	}
	start := time.Now()
	d, err := l.deliver(ctx, sessionID, ev)
	l.opts.OnDeliver(d, time.Since(start), err)
	return d, err
}

func (l *Ledger) deliver(ctx context.Context, sessionID string, ev Event) (Delivery, error) {
	if err := l.checkEvent(sessionID, ev); err != nil {
		return Delivery{}, err
	}
	if l.isClosed() {
		return Delivery{}, ErrClosed
	}
	s := l.session(sessionID)
	size := len(ev.Payload)
	inline := l.opts.InlineLimit > 0 && size <= l.opts.InlineLimit
	var (
		blob       string // "{epoch}/{nonce}" of the blob written, if any
		res        Delivery
		started    uint64
		needBlob   bool
		staleEpoch uint64
	)
	writeBlob := func(epoch uint64) error {
		ref := blobRef(epoch, randomHex(8))
		l.step("deliver:blob")
		rec := encode(kindBlob, blobRecord{Version: FormatVersion, Session: sessionID, EventID: ev.ID, Payload: ev.Payload})
		if err := l.put(ctx, l.keys.blob(sessionID, ref), rec); err != nil {
			return err
		}
		if blob != "" {
			l.del(ctx, l.keys.blob(sessionID, blob))
		}
		blob = ref
		return nil
	}
	if !inline {
		if err := l.writeBlobLoaded(ctx, s, writeBlob); err != nil {
			return Delivery{}, err
		}
	}
	for {
		needBlob, staleEpoch = false, 0
		cur, sent, err := l.update(ctx, s, "deliver", func(c *control) (*control, error) {
			res = Delivery{SessionID: sessionID, EventID: ev.ID}
			started = 0
			if c == nil {
				c = &control{Session: sessionID, NextSeq: 1, Created: time.Now().UTC()}
			}
			if c.Deleted != nil {
				return nil, fmt.Errorf("%w: session %q", ErrDeleted, sessionID)
			}
			res.Created = c.Created
			if i, r := c.find(ev.ID); i >= 0 || r != nil {
				res.Duplicate, res.Holder = true, c.Holder
				res.Local = c.Holder == l.opts.HostID
				switch {
				case i >= 0:
					res.State, res.InboxSeq = StatePending, c.Pending[i].Seq
				case r.Dead:
					res.State = StateDeadLettered
				default:
					res.State, res.CommitSeq = StateCommitted, r.Seq
				}
				return nil, nil
			}
			if ev.Keyed {
				// Past the window: the id's kept key, read after this
				// record's version was known; the append expects that
				// version (keep.go says why that is enough).
				k, err := l.rules().kept(ctx, l, c, ev.ID)
				if err != nil {
					return nil, err
				}
				if k != nil {
					l.step("deliver:kept")
					keptDuplicate(&res, k)
					res.Holder, res.Local = c.Holder, c.Holder == l.opts.HostID
					return nil, nil
				}
				if c.Keys >= l.opts.MaxKeys {
					return nil, l.keysBusy(c)
				}
			}
			total, inlined := c.pendingBytes()
			if len(c.Pending) > 0 && (len(c.Pending) >= l.opts.MaxPending || total+int64(size) > l.opts.MaxPendingBytes) {
				return nil, &BusyError{SessionID: sessionID, Pending: len(c.Pending), PendingBytes: total, RetryAfter: l.opts.RetryAfter}
			}
			e := entry{Seq: c.NextSeq, ID: ev.ID, Size: size, Keyed: ev.Keyed}
			switch {
			case blob != "":
				if ep, _ := blobEpoch(blob); c.Epoch > ep+1 {
					staleEpoch = c.Epoch
					return nil, errRetry
				}
				e.Blob = blob
			case inlined+int64(size) > int64(l.opts.MaxInlineBytes):
				needBlob = true
				return nil, errRetry
			default:
				e.Inline = ev.Payload
			}
			c.Pending = append(c.Pending, e)
			c.NextSeq++
			res.State, res.InboxSeq = StatePending, e.Seq
			if c.Holder == "" && !l.opts.Passive {
				c.Holder = l.opts.HostID
				c.Gen++
				c.Renew = 0
				res.Acquired = true
				if h := &c.Pending[0]; h.Attempts < l.opts.MaxAttempts {
					h.Attempts++
					started = h.Seq
				}
			}
			res.Holder = c.Holder
			res.Local = c.Holder == l.opts.HostID
			return c, nil
		})
		switch {
		case errors.Is(err, errRetry) && needBlob:
			if err := l.writeBlobLoaded(ctx, s, writeBlob); err != nil {
				return Delivery{}, err
			}
			continue
		case errors.Is(err, errRetry):
			if err := writeBlob(staleEpoch); err != nil {
				return Delivery{}, err
			}
			continue
		}
		if err != nil || res.Duplicate {
			// Our blob goes unless the record references it: a duplicate
			// may be our own earlier write, whose answer was lost. Without
			// a record read in this call, the sweep decides later.
			if blob != "" && cur != nil && !references(cur, blob) && !errors.Is(err, errUnknownOutcome) {
				l.del(context.WithoutCancel(ctx), l.keys.blob(sessionID, blob))
			}
			if err != nil {
				return Delivery{}, err
			}
			l.stats.duplicates.Add(1)
			if c := s.snapshot(); c != nil && c.Holder == l.opts.HostID {
				l.ensureRunner(s, c.Gen, 0, time.Time{})
			}
			return res, nil
		}
		l.stats.delivered.Add(1)
		if res.Acquired {
			l.stats.acquired.Add(1)
		}
		if res.Local && blob != "" {
			s.keepPayload(blob, ev.Payload)
		}
		if res.Local {
			// Also after an unknown outcome settled as "already there": a
			// lease this delivery took must get its runner.
			if c := s.snapshot(); c != nil && c.Holder == l.opts.HostID {
				l.ensureRunner(s, c.Gen, started, sent)
			}
		}
		return res, nil
	}
}

// references reports whether a pending entry of c points at the blob ref.
func references(c *control, ref string) bool {
	for _, e := range c.Pending {
		if e.Blob == ref {
			return true
		}
	}
	return false
}

// errRetry makes a delivery rewrite its payload before trying again.
var errRetry = errors.New("ledger: retry delivery")

// writeBlobLoaded writes a payload blob at the cached epoch, reading the
// control record at the same time when it is not cached, and writes it again
// in the rare case the read shows an epoch too new for it.
func (l *Ledger) writeBlobLoaded(ctx context.Context, s *session, write func(epoch uint64) error) error {
	c, _, loaded := s.cached()
	if loaded {
		var epoch uint64
		if c != nil {
			epoch = c.Epoch
		}
		return write(epoch)
	}
	errc := make(chan error, 1)
	go func() {
		if err := s.acquire(ctx); err != nil {
			errc <- err
			return
		}
		defer s.unlock()
		if _, _, loaded := s.cached(); loaded {
			errc <- nil
			return
		}
		errc <- l.load(ctx, s)
	}()
	werr := write(0)
	if err := <-errc; err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	if c, _, _ := s.cached(); c != nil && c.Epoch > 1 {
		return write(c.Epoch)
	}
	return nil
}

// checkEvent validates a delivery's arguments.
func (l *Ledger) checkEvent(sessionID string, ev Event) error {
	switch {
	case sessionID == "":
		return errors.New("ledger: the session id is empty")
	case ev.ID == "":
		return errors.New("ledger: the event id is empty; give every event an id (such as the client's Idempotency-Key) so a retry is recognised")
	case len(ev.ID) > MaxEventIDBytes:
		return fmt.Errorf("%w: the event id is %d bytes; the limit is %d", ErrTooLarge, len(ev.ID), MaxEventIDBytes)
	case !utf8.ValidString(ev.ID) || !utf8.ValidString(sessionID):
		return errors.New("ledger: the session id and the event id must be valid UTF-8")
	case len(ev.Payload) > l.opts.MaxEventBytes:
		return fmt.Errorf("%w: the event payload is %d bytes; the limit is %d (Options.MaxEventBytes)", ErrTooLarge, len(ev.Payload), l.opts.MaxEventBytes)
	case len(ev.Payload) == 0 || !json.Valid(ev.Payload):
		return errors.New("ledger: the event payload must be a JSON value")
	}
	return nil
}

// EventStatus says where an event is.
type EventStatus struct {
	State EventState
	// InboxSeq is the place of a pending event; Attempts the turns started
	// on it so far.
	InboxSeq uint64
	Attempts int
	// CommitSeq is the turn that consumed a committed event.
	CommitSeq uint64
}

// Lookup reads where an event is: pending, committed (with the turn that
// consumed it), or dead-lettered. An event consumed more than DedupWindow
// events ago is ErrUnknownEvent, unless it was keyed and its key is still
// kept (IdempotencyWindow).
func (l *Ledger) Lookup(ctx context.Context, sessionID, eventID string) (EventStatus, error) {
	c, err := l.readSession(ctx, sessionID)
	if err != nil {
		return EventStatus{}, err
	}
	i, r := c.find(eventID)
	switch {
	case i >= 0:
		return EventStatus{State: StatePending, InboxSeq: c.Pending[i].Seq, Attempts: c.Pending[i].Attempts}, nil
	case r == nil:
		k, err := l.rules().kept(ctx, l, c, eventID)
		switch {
		case err != nil:
			return EventStatus{}, err
		case k == nil:
			return EventStatus{}, fmt.Errorf("%w: %q in session %q", ErrUnknownEvent, eventID, sessionID)
		case k.Dead:
			return EventStatus{State: StateDeadLettered}, nil
		}
		return EventStatus{State: StateCommitted, CommitSeq: k.Seq}, nil
	case r.Dead:
		return EventStatus{State: StateDeadLettered}, nil
	}
	return EventStatus{State: StateCommitted, CommitSeq: r.Seq}, nil
}

// readSession reads a live session's control record from the store.
func (l *Ledger) readSession(ctx context.Context, sessionID string) (*control, error) {
	if sessionID == "" {
		return nil, errors.New("ledger: the session id is empty")
	}
	c, _, err := l.readControl(ctx, l.keys.ctl(sessionID))
	switch {
	case err != nil:
		return nil, err
	case c == nil:
		return nil, fmt.Errorf("%w: %q", ErrUnknownSession, sessionID)
	case c.Deleted != nil:
		return nil, fmt.Errorf("%w: %q", ErrDeleted, sessionID)
	}
	return c, nil
}
