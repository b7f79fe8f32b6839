package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A Turn is what the Handler gets: the event it consumes, the fence it
// checks before every side effect, and the commit that makes its output
// part of the committed transcript (runner.go is the holder's loop that
// hands turns out).

// Turn is one turn the Handler runs: the event it consumes and the
// sequence number it commits as.
type Turn struct {
	SessionID string
	// Seq is the commit sequence this turn takes when it commits: the
	// committed turns before it are 1..Seq-1.
	Seq uint64
	// Generation is the lease generation this host holds.
	Generation uint64
	// ID names this attempt; every attempt of a turn has a new one.
	ID string
	// Event is the consumed event.
	Event Event
	// InboxSeq is the event's place in the inbox.
	InboxSeq uint64
	// Attempt counts the turns started on this event, this one included.
	Attempt int
	// LastError is the previous attempt's error, when it was recorded.
	LastError string

	r         *runner
	head      entry
	committed atomic.Bool
	commitMu  sync.Mutex
}

// IdempotencyKey returns the key of the turn's n-th side effect (a tool
// call): "{sessionId}/{Seq}/{n}". A retried turn (after a crash or a
// failed attempt) gets the same keys for the same calls, so a tool that
// honours them does its work once.
func (t *Turn) IdempotencyKey(n int) string {
	return fmt.Sprintf("%s/%d/%d", t.SessionID, t.Seq, n)
}

// Check reports whether a side effect may start now: nil while this host
// holds the lease with a renewal recent enough, ErrSelfFenced once
// Lease × (1 − DriftAllowance) has passed since the last successful
// renewal was sent, and the lease-loss error (matching ErrFenced) once
// another host holds the session. Call it before every side effect.
func (t *Turn) Check() error { return t.r.check() }

// Committed is a turn in the committed transcript.
type Committed struct {
	SessionID string
	// Seq is the turn's commit sequence number, from 1, without gaps.
	Seq uint64
	// Generation and Holder are the lease that committed it; TurnID the
	// attempt.
	Generation uint64
	Holder     string
	TurnID     string
	// EventIDs are the events the turn consumed, in inbox order.
	EventIDs []string
	// Output is what the Handler committed.
	Output []json.RawMessage
	// At is the committing host's wall-clock time, for display.
	At time.Time
}

func (t *turnRecord) committed(sid string) Committed {
	return Committed{SessionID: sid, Seq: t.Seq, Generation: t.Gen, Holder: t.Holder, TurnID: t.TurnID,
		EventIDs: t.EventIDs, Output: t.Output, At: t.At}
}

// Commit makes the turn's output part of the committed transcript and
// consumes its event, in one compare-and-set of the control record that
// succeeds only while this host holds the lease's generation (preceded,
// when the event it consumes pushes a keyed id out of the window, by the
// put of that id's kept key). It fails with an error matching ErrFenced
// when another host took the session over (or it was deleted): the output
// is then discarded, and effects that follow a turn (journal records,
// hooks) must not run. Each element of output is one JSON value (an event
// of the turn). A turn commits once.
func (t *Turn) Commit(ctx context.Context, output []json.RawMessage) (Committed, error) {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	if t.committed.Load() {
		return Committed{}, errors.New("ledger: the turn is already committed")
	}
	for i, o := range output {
		if !json.Valid(o) {
			return Committed{}, fmt.Errorf("ledger: output element %d is not a JSON value", i)
		}
	}
	r, l := t.r, t.r.l
	rules := l.rules()
	// The commit is fenced by the store, not by the clock: a turn whose
	// context ended because renewal was overdue (ErrSelfFenced) may still
	// commit, and the compare-and-set decides. Only a known loss of the
	// lease, the runner's end or the caller's own cancellation stop it.
	parent, err := rules.commitParent(r)
	if err != nil {
		return Committed{}, err
	}
	ctx, cancel := commitContext(ctx, parent, l.opts.Lease)
	defer cancel()
	rec := turnRecord{Version: FormatVersion, Seq: t.Seq, Gen: t.Generation, Holder: l.opts.HostID, TurnID: t.ID,
		EventIDs: []string{t.Event.ID}, InboxSeqs: []uint64{t.InboxSeq}, Output: output, At: time.Now().UTC()}
	inControl := rec
	if size := outputSize(output); size > l.opts.TurnInlineLimit {
		ref := outRef(t.Seq, t.Generation, t.ID)
		full := rec
		full.Session = t.SessionID
		l.step("commit:out")
		if err := l.put(ctx, l.keys.out(t.SessionID, ref), encode(kindTurn, full)); err != nil {
			return Committed{}, err
		}
		inControl.Output, inControl.Ref = nil, ref
	}
	if t.head.Replayed {
		// The event came back from the dead-letter store; its record is
		// closed before the event is consumed, so it never stays in both.
		if err := l.closeDeadLetter(ctx, t.SessionID, t.Event.ID, t.head.From, "replayed"); err != nil {
			return Committed{}, err
		}
	}
	var next uint64
	var already bool
	_, err = r.writeConsuming(ctx, "commit", func(c *control) (*control, *recent, error) {
		next, already = 0, false
		if c.LastTurn == t.ID || (c.unflushed(t.Seq) != nil && c.unflushed(t.Seq).TurnID == t.ID) {
			already = true // an earlier try with an unknown outcome landed
			return nil, nil, nil
		}
		if err := rules.consume(c, t); err != nil {
			return nil, nil, err
		}
		c.LastTurn = t.ID
		c.Updated = rec.At
		c.Unflushed = append(c.Unflushed, inControl)
		next = startNext(c, l.opts.MaxAttempts)
		return c, &recent{ID: t.Event.ID, Seq: t.Seq, Keyed: t.head.Keyed}, nil
	})
	if err != nil {
		lost := errors.Is(err, ErrFenced) || errors.Is(context.Cause(r.ctx), ErrFenced)
		if lost {
			// An earlier try may have landed before the takeover.
			if got, rerr := l.turnAt(context.WithoutCancel(ctx), t.SessionID, nil, t.Seq); rerr == nil && got.TurnID == t.ID {
				err = nil
				already = true
			} else {
				l.stats.fencedCommits.Add(1)
				if !errors.Is(err, ErrFenced) {
					err = fmt.Errorf("%w (%w)", context.Cause(r.ctx), err)
				}
			}
		}
		if err != nil {
			return Committed{}, err
		}
	}
	t.committed.Store(true)
	l.stats.commits.Add(1)
	r.mu.Lock()
	r.started = next
	if already {
		r.started = 0
	}
	r.mu.Unlock()
	if t.head.Blob != "" {
		r.s.forgetPayload(t.head.Blob)
		l.del(ctx, l.keys.blob(t.SessionID, t.head.Blob)) // consumed: no record references it now
	}
	// Flush now; a failure leaves the turn in the control record, and the
	// next loop (or the next holder) writes it.
	if c := r.s.snapshot(); c != nil && l.flushTurns(ctx, r.s, c) == nil && inControl.Ref != "" {
		// The out/ copy goes once the write dropping its reference lands.
		r.mu.Lock()
		r.cleanup = append(r.cleanup, l.keys.out(t.SessionID, inControl.Ref))
		r.mu.Unlock()
	}
	return rec.committed(t.SessionID), nil
}

// commitContext returns the context of a commit's writes: it ends with the
// runner, after limit, or when the caller's context ends for any cause but
// ErrSelfFenced.
func commitContext(caller, runner context.Context, limit time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeoutCause(runner, limit, errors.New("ledger: commit took longer than the lease"))
	if stopsCommit(caller) {
		cancel()
		return ctx, cancel
	}
	stop := context.AfterFunc(caller, func() {
		if stopsCommit(caller) {
			cancel()
		}
	})
	return ctx, func() { stop(); cancel() }
}

// stopsCommit reports whether the caller's context has ended for a reason
// that stops a commit: any but self-fencing, which stops side effects only.
func stopsCommit(caller context.Context) bool {
	return caller.Err() != nil && !errors.Is(context.Cause(caller), ErrSelfFenced)
}

func outputSize(output []json.RawMessage) int {
	n := 2
	for _, o := range output {
		n += len(o) + 1
	}
	return n
}
