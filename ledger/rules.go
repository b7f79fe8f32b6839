package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// rules are the checks where the protocol's safety lies: the holder's
// fence of its writes, the commit's context and change of the control
// record, and the release; and the de-duplication of keyed ids past the
// window (keep.go): the kept keys the holder writes before it evicts ids,
// the deliverer's look-up of them, and their expiry. The real rules are
// realRules; the package's tests put a deliberately broken variant in
// their place (testHooks.rules) to show that the simulation catches it.
// Nothing else in the protocol knows a variant exists.
type rules interface {
	// fence returns the error that refuses r's write at step to c, or nil
	// when r may write it.
	fence(r *runner, step string, c *control) *FencedError
	// commitParent returns the context a commit's writes derive from, or
	// the error that stops the commit before it writes anything.
	commitParent(r *runner) (context.Context, error)
	// consume takes the turn's event off c's inbox and makes the turn the
	// committed head.
	consume(c *control, t *Turn) error
	// release gives r's lease up once the inbox is empty, and reports
	// whether the runner is done.
	release(r *runner) bool
	// evicts returns the keyed ids that remembering one more consumed id
	// in c's window of n pushes out: their kept keys are written before
	// the write that evicts them.
	evicts(c *control, n int) []recent
	// kept returns the kept key of an id that c (read at the version the
	// delivery's compare-and-set expects) has neither pending nor in its
	// window, or nil.
	kept(ctx context.Context, l *Ledger, c *control, eventID string) (*keptKey, error)
	// expired reports whether a kept key written at at (by some host's
	// wall clock) may be deleted at now (this host's).
	expired(at, now time.Time, window, skew time.Duration) bool
}

// realRules are the protocol's rules.
type realRules struct{}

// rules returns the rules in force.
func (l *Ledger) rules() rules {
	if l.opts.test.rules != nil {
		return l.opts.test.rules
	}
	return realRules{}
}

// fence refuses a write of a runner that no longer holds the lease.
func (realRules) fence(r *runner, _ string, c *control) *FencedError { return r.fenced(c) }

// commitParent stops a commit whose runner has ended (its lease is lost,
// or the host is closing); a runner whose renewal is only overdue may
// still commit, and the compare-and-set decides.
func (realRules) commitParent(r *runner) (context.Context, error) {
	if err := r.ctx.Err(); err != nil {
		cause := context.Cause(r.ctx)
		if errors.Is(cause, ErrFenced) {
			r.l.stats.fencedCommits.Add(1)
		}
		return nil, cause
	}
	return r.ctx, nil
}

// consume takes the turn's event, which must be the inbox's head, off
// the inbox, and the turn, which must follow the committed head, becomes
// it.
func (realRules) consume(c *control, t *Turn) error {
	if len(c.Pending) == 0 || c.Pending[0].Seq != t.InboxSeq || c.Commit != t.Seq-1 {
		return fmt.Errorf("ledger: internal: committing turn %d of event %d but the record is at turn %d with head %v", t.Seq, t.InboxSeq, c.Commit, c.Pending)
	}
	c.Pending = c.Pending[1:]
	c.Commit = t.Seq
	return nil
}

// release is runner.release.
func (realRules) release(r *runner) bool { return r.release() }

// evicts keeps every keyed id the window loses.
func (realRules) evicts(c *control, n int) []recent {
	var keyed []recent
	for _, e := range c.evicted(n) {
		if e.Keyed {
			keyed = append(keyed, e)
		}
	}
	return keyed
}

// kept reads the id's kept key, unless the session counts none.
func (realRules) kept(ctx context.Context, l *Ledger, c *control, eventID string) (*keptKey, error) {
	if c == nil || c.Keys == 0 {
		return nil, nil
	}
	return l.readKept(ctx, c.Session, eventID)
}

// expired waits for the window and then the clock skew: a host whose
// clock runs ahead of the writer's by up to skew still deletes a key no
// earlier than window after it was written.
func (realRules) expired(at, now time.Time, window, skew time.Duration) bool {
	return !now.Before(at.Add(window + skew))
}
