package ledger

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"
)

// observation is what the janitor last saw of a held session, and when it
// first saw it so, on this host's monotonic clock.
type observation struct {
	holder     string
	gen, renew uint64
	seen       time.Time
}

// Run runs the janitor until ctx ends or the Ledger closes: every
// JanitorInterval (jittered between half and one and a half times it) it
// scans the control records by prefix and
//
//   - takes over a session whose (generation, renewal counter) has not
//     changed for Lease + Margin on this host's monotonic clock, or that has
//     pending events and no holder, and runs its turns here;
//   - sweeps an idle session's orphan payload blobs and turn outputs (at
//     most every SweepEvery per session);
//   - finishes deleting sessions whose deletion was interrupted;
//   - deletes the kept keys of keyed events whose IdempotencyWindow (and
//     ClockSkew) has passed, on this host's wall clock (keep.go).
//
// Takeovers and sweeps are limited to TakeoverRate per second. Takeover is
// one compare-and-set, so janitors of several hosts racing for a session
// cost each other only reads. Run returns nil when the Ledger closes, and
// ctx's error when ctx ends.
func (l *Ledger) Run(ctx context.Context) error {
	lim := newLimiter(l.opts.TakeoverRate)
	for {
		l.scan(ctx, lim)
		wait := time.Duration(float64(l.opts.JanitorInterval) * (0.5 + rand.Float64()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-l.janitorStop:
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// scan is one pass of the janitor.
func (l *Ledger) scan(ctx context.Context, lim *limiter) {
	l.step("janitor:scan")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.janitorStop:
			cancel()
		case <-ctx.Done():
		}
	}()
	seen := map[string]bool{}
	for c, err := range l.controls(ctx) {
		// Taken after the record was read: a contender's clock starts no
		// earlier than its observation, whatever the listing's latency.
		now := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("ledger: janitor scan failed", "err", err)
			}
			break
		}
		sid := c.Session
		seen[sid] = true
		var act func() error
		switch {
		case c.Deleted != nil:
			if !c.Deleted.Purged {
				act = func() error { return l.purge(ctx, l.session(sid)) }
			}
		case l.opts.Passive && (c.Holder != "" || len(c.Pending) > 0):
			// A passive ledger takes nothing over.
		case c.Holder == "" && len(c.Pending) > 0:
			act = func() error { return l.takeOver(ctx, c) }
		case c.Holder != "":
			o, ok := l.obs[sid]
			if !ok || o.holder != c.Holder || o.gen != c.Gen || o.renew != c.Renew {
				l.obs[sid] = observation{holder: c.Holder, gen: c.Gen, renew: c.Renew, seen: now}
				break
			}
			if now.Sub(o.seen) >= l.opts.Lease+l.opts.Margin {
				act = func() error { return l.takeOver(ctx, c) }
			}
		case c.Commit > c.Swept:
			// A session is swept SweepEvery after this host first saw it
			// with turns since the last sweep, and at most that often.
			last, ok := l.swept[sid]
			if !ok {
				l.swept[sid] = now
			} else if now.Sub(last) >= l.opts.SweepEvery {
				act = func() error {
					l.swept[sid] = time.Now()
					return l.sweep(ctx, c)
				}
			}
		}
		if act == nil && l.keysDue(c, l.wallNow()) {
			act = func() error { return l.collectKeys(ctx, sid) }
		}
		if act == nil {
			continue
		}
		if err := lim.wait(ctx); err != nil {
			break
		}
		if err := act(); err != nil && ctx.Err() == nil {
			l.log.Warn("ledger: janitor action failed", "session", sid, "err", err)
		}
	}
	for sid := range l.obs {
		if !seen[sid] {
			delete(l.obs, sid)
		}
	}
	for sid := range l.swept {
		if !seen[sid] {
			delete(l.swept, sid)
		}
	}
}

// errChanged means the session moved on since the janitor looked.
var errChanged = errors.New("ledger: the session changed")

// takeOver takes the lease of a session the janitor found stale (holder,
// generation and renewal counter as in seen) or holderless with pending
// events. Committed turns the record still carries are flushed first, so
// the takeover's write can drop them. When nothing is pending, the same
// write fences the old holder and leaves the session free.
func (l *Ledger) takeOver(ctx context.Context, seen *control) error {
	s := l.session(seen.Session)
	if err := l.flushTurns(ctx, s, seen); err != nil {
		return err
	}
	var started uint64
	var took bool
	c, sent, err := l.update(ctx, s, "takeover", func(c *control) (*control, error) {
		started, took = 0, false
		if c == nil || c.Deleted != nil || c.Holder != seen.Holder || c.Gen != seen.Gen || c.Renew != seen.Renew {
			return nil, errChanged
		}
		if c.Holder == "" && len(c.Pending) == 0 {
			return nil, errChanged
		}
		c.Gen++
		c.Renew = 0
		c.Holder = ""
		c.dropFlushed(s.flushedThrough())
		if len(c.Pending) > 0 {
			c.Holder = l.opts.HostID
			took = true
			started = startNext(c, l.opts.MaxAttempts)
		}
		return c, nil
	})
	if errors.Is(err, errChanged) {
		return nil
	}
	if err != nil {
		return err
	}
	delete(l.obs, seen.Session)
	l.stats.takeovers.Add(1)
	l.log.Info("ledger: took a session over", "session", seen.Session, "from", seen.Holder, "generation", c.Gen, "pending", len(c.Pending))
	if took {
		l.ensureRunner(s, c.Gen, started, sent)
	}
	return nil
}

// sweep deletes an idle session's orphans without trusting any clock:
//
//   - payload blobs: one compare-and-set advances the blob epoch from E to
//     E+1; then blobs of epoch E-1 or older that the record does not
//     reference are deleted. A delivery stamps its blob with the epoch it
//     read and its append fails when the record's epoch is more than one
//     ahead, so a blob whose append is still on its way is never taken;
//   - large turn outputs (out/{seq}/{gen}-{turnId}) the record does not
//     reference, whose turn is decided (seq ≤ the commit sequence: the
//     committed one was flushed before its reference was dropped) or whose
//     generation is not newer than the idle record's (no holder of it can commit any more).
func (l *Ledger) sweep(ctx context.Context, seen *control) error {
	s := l.session(seen.Session)
	var epoch uint64
	c, _, err := l.update(ctx, s, "sweep", func(c *control) (*control, error) {
		if c == nil || c.Deleted != nil || c.Holder != "" || len(c.Pending) > 0 {
			return nil, errChanged
		}
		epoch = c.Epoch
		c.Epoch++
		c.Swept = c.Commit
		return c, nil
	})
	if errors.Is(err, errChanged) {
		return nil
	}
	if err != nil {
		return err
	}
	refs := map[string]bool{}
	for _, e := range c.Pending {
		refs[e.Blob] = true
	}
	for _, u := range c.Unflushed {
		refs[u.Ref] = true
	}
	prefix := l.keys.inPrefix(s.id)
	var doomed []string
	for key, err := range l.store.ListKeys(ctx, prefix) {
		if err != nil {
			return err
		}
		ref := strings.TrimPrefix(key, prefix)
		if ep, ok := blobEpoch(ref); ok && ep+1 <= epoch && !refs[ref] {
			doomed = append(doomed, key)
		}
	}
	prefix = l.keys.outPrefix(s.id)
	for key, err := range l.store.ListKeys(ctx, prefix) {
		if err != nil {
			return err
		}
		ref := strings.TrimPrefix(key, prefix)
		if seq, gen, ok := parseOutRef(ref); ok && !refs[ref] && (seq <= c.Commit || gen <= c.Gen) {
			doomed = append(doomed, key)
		}
	}
	for _, key := range doomed {
		l.step("sweep:delete")
		l.del(ctx, key)
	}
	if l.opts.Swept != nil {
		l.opts.Swept(ctx, infoOf(c))
	}
	return nil
}

// limiter is a token bucket: rate per second, bursts of up to one second's
// worth.
type limiter struct {
	rate   float64
	tokens float64
	last   time.Time
}

func newLimiter(rate float64) *limiter {
	return &limiter{rate: rate, tokens: max(1, rate), last: time.Now()}
}

// wait takes a token, sleeping until one is there.
func (b *limiter) wait(ctx context.Context) error {
	now := time.Now()
	b.tokens = min(max(1, b.rate), b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		d := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
		if err := sleepCtx(ctx, d); err != nil {
			return err
		}
		b.tokens = 1
		b.last = time.Now()
	}
	b.tokens--
	return nil
}
