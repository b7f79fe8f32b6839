package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// runner runs a session's turns on this host while it holds the lease of
// one generation. Its loop drains the inbox one event per turn, in inbox
// order, and releases the lease only by a compare-and-set that sees the
// inbox empty. Its renewal loop keeps the lease alive independently of the
// turn, so a long model call does not lose it.
type runner struct {
	l   *Ledger
	s   *session
	gen uint64

	ctx    context.Context // ends when the lease is lost or the Ledger closes
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	lastSent time.Time // when the last successful holder write was sent
	fence    *time.Timer
	turn     context.CancelCauseFunc // the running turn's, if any
	// started is the inbox sequence of the head event whose attempt this
	// runner's last write counted (0: none), so the turn may start
	// without another write.
	started uint64
	// lastErr is the failed attempt's error, recorded by the next write.
	lastErr string
	// poisoned is the inbox sequence of an event whose Handler returned a
	// PermanentError (0: none): it is dead-lettered without another try.
	poisoned uint64
	// cleanup are keys to delete once the next holder write has landed.
	cleanup []string
	// released is set once the lease was given up.
	released bool
}

// ensureRunner starts a runner for gen unless this host runs one already.
func (l *Ledger) ensureRunner(s *session, gen, started uint64, sent time.Time) {
	// l.mu before s.mu, the order evictLocked takes them in.
	l.mu.Lock()
	if l.closed || l.opts.Passive {
		l.mu.Unlock()
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run != nil && s.run.gen == gen {
		l.wg.Done()
		return
	}
	ctx, cancel := context.WithCancelCause(l.ctx)
	r := &runner{l: l, s: s, gen: gen, ctx: ctx, cancel: cancel, lastSent: sent, started: started}
	r.mu.Lock() // fenceCheck, which may fire at once, waits for r.fence
	r.fence = time.AfterFunc(r.untilFence(), r.fenceCheck)
	r.mu.Unlock()
	s.run = r
	l.stats.held.Add(1)
	go r.loop()
}

// leaseSafe is how long after a renewal was sent the holder may still
// start side effects: Lease × (1 − DriftAllowance).
func (l *Ledger) leaseSafe() time.Duration {
	return time.Duration(float64(l.opts.Lease) * (1 - l.opts.DriftAllowance))
}

// untilFence is the time left before self-fencing. Called with r.mu held or
// before r is shared.
func (r *runner) untilFence() time.Duration {
	if r.lastSent.IsZero() {
		return 0
	}
	return time.Until(r.lastSent.Add(r.l.leaseSafe()))
}

// fenceCheck runs when the self-fence deadline may have passed: it cancels
// the running turn, so no new side effect starts on a lease that may be
// gone.
func (r *runner) fenceCheck() {
	r.l.step("fence:timer")
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := r.untilFence(); d > 0 {
		r.fence.Reset(d)
		return
	}
	if r.turn != nil {
		r.l.stats.selfFenced.Add(1)
		r.turn(ErrSelfFenced)
		r.turn = nil
	}
}

// check reports whether a side effect may start now.
func (r *runner) check() error {
	if err := r.ctx.Err(); err != nil {
		return context.Cause(r.ctx)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.untilFence() <= 0 {
		return ErrSelfFenced
	}
	return nil
}

// renewed records a successful holder write sent at sent.
func (r *runner) renewed(sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sent.After(r.lastSent) {
		r.lastSent = sent
		r.fence.Reset(r.untilFence())
	}
}

// lose ends the runner: the lease belongs to someone else now.
func (r *runner) lose(err error) {
	r.cancel(err)
}

// write applies a holder's change: it checks that this runner still holds
// the lease (else a FencedError), counts the write as a renewal, and drops
// turns already flushed from the control record.
func (r *runner) write(ctx context.Context, step string, mutate mutation) (*control, error) {
	var fenced *FencedError
	c, sent, err := r.l.update(ctx, r.s, step, func(c *control) (*control, error) {
		fenced = nil
		if f := r.l.rules().fence(r, step, c); f != nil {
			fenced = f
			return nil, f
		}
		next, err := mutate(c)
		if next == nil || err != nil {
			return next, err
		}
		if next.Holder == r.l.opts.HostID && next.Gen == r.gen {
			next.Renew++
		}
		next.dropFlushed(r.s.flushedThrough())
		return next, nil
	})
	if err != nil {
		if fenced != nil {
			r.lose(fenced)
		}
		return c, err
	}
	if !sent.IsZero() {
		r.renewed(sent)
		r.mu.Lock()
		keys := r.cleanup
		r.cleanup = nil
		r.mu.Unlock()
		for _, k := range keys {
			r.l.del(r.ctx, k)
		}
	}
	return c, nil
}

// fenced returns the FencedError for c if this runner no longer holds it.
func (r *runner) fenced(c *control) *FencedError {
	if c != nil && c.Deleted == nil && c.Holder == r.l.opts.HostID && c.Gen == r.gen {
		return nil
	}
	f := &FencedError{SessionID: r.s.id, Generation: r.gen}
	if c != nil {
		f.Current, f.Holder, f.Deleted = c.Gen, c.Holder, c.Deleted != nil
	}
	return f
}

// renewLoop renews the lease every Lease/3 (any holder write counts) until
// the runner ends, independently of the turn.
func (r *runner) renewLoop() {
	every := r.l.opts.Lease / 3
	for {
		r.mu.Lock()
		wait := time.Until(r.lastSent.Add(every))
		r.mu.Unlock()
		if err := sleepCtx(r.ctx, wait); err != nil {
			return
		}
		r.l.step("renew:timer")
		r.mu.Lock()
		due := time.Since(r.lastSent) >= every
		r.mu.Unlock()
		if !due {
			continue
		}
		_, err := r.write(r.ctx, "renew", func(c *control) (*control, error) { return c, nil })
		if err != nil && r.ctx.Err() == nil {
			r.l.log.Warn("ledger: lease renewal failed", "session", r.s.id, "err", err)
			if serr := sleepCtx(r.ctx, every/4); serr != nil {
				return
			}
		}
	}
}

// loop runs turns until the inbox is empty and the lease released, or the
// lease is lost, or the Ledger closes.
func (r *runner) loop() {
	defer r.l.wg.Done()
	defer r.exit()
	go r.renewLoop()
	l := r.l
	backoff := l.opts.RetryDelay
	for r.ctx.Err() == nil {
		if l.isClosed() {
			return // exit hands the session over
		}
		c := r.s.snapshot()
		if f := r.fenced(c); f != nil {
			r.lose(f)
			return
		}
		if err := r.flush(c); err != nil {
			if r.ctx.Err() == nil {
				l.log.Warn("ledger: writing committed turns failed", "session", r.s.id, "err", err)
				r.pause(backoff)
			}
			continue
		}
		if len(c.Pending) == 0 {
			if r.l.rules().release(r) {
				return
			}
			continue
		}
		head := c.Pending[0]
		r.mu.Lock()
		started, lastErr, poisoned := r.started, r.lastErr, r.poisoned
		r.mu.Unlock()
		if started != head.Seq {
			if head.Attempts >= l.opts.MaxAttempts || poisoned == head.Seq {
				if lastErr != "" {
					// The last attempt's error, not yet in the record.
					head.LastError = lastErr
				}
				if err := r.deadLetter(head); err != nil && r.ctx.Err() == nil {
					l.log.Warn("ledger: dead-lettering failed", "session", r.s.id, "event", head.ID, "err", err)
					r.pause(backoff)
				}
				continue
			}
			var bumped bool
			_, err := r.write(r.ctx, "attempt", func(c *control) (*control, error) {
				bumped = false
				if len(c.Pending) == 0 || c.Pending[0].Seq != head.Seq || c.Pending[0].Attempts >= l.opts.MaxAttempts {
					return nil, nil
				}
				c.Pending[0].Attempts++
				if lastErr != "" {
					c.Pending[0].LastError = lastErr
				}
				bumped = true
				return c, nil
			})
			if err == nil && bumped {
				r.mu.Lock()
				r.started, r.lastErr = head.Seq, ""
				r.mu.Unlock()
			} else if err != nil && r.ctx.Err() == nil {
				r.pause(backoff)
			}
			continue
		}
		committed, permanent, err := r.runTurn(c, head)
		if committed {
			backoff = l.opts.RetryDelay
			continue
		}
		if r.ctx.Err() != nil {
			return
		}
		l.log.Warn("ledger: turn failed; the event will be tried again", "session", r.s.id, "event", head.ID, "attempt", head.Attempts, "err", err)
		r.mu.Lock()
		r.started = 0
		r.lastErr = truncate(err.Error(), 512)
		if permanent {
			r.poisoned = head.Seq
		}
		r.mu.Unlock()
		if permanent {
			continue // dead-lettered at once, without the back-off
		}
		r.pause(backoff)
		backoff = min(backoff*2, l.opts.Lease)
	}
}

// pause waits d, or until the runner ends or the Ledger closes.
func (r *runner) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.ctx.Done():
	case <-r.l.draining:
	}
}

// exit hands the lease over when the Ledger closes, and forgets the runner.
func (r *runner) exit() {
	cause := context.Cause(r.ctx)
	r.cancel(nil)
	r.mu.Lock()
	r.fence.Stop()
	released := r.released
	r.mu.Unlock()
	if !released && !errors.Is(cause, ErrFenced) && !errors.Is(cause, errAbandoned) && r.l.isClosed() {
		r.handOff()
	}
	r.s.mu.Lock()
	if r.s.run == r {
		r.s.run = nil
		r.s.payloads = nil
	}
	r.s.mu.Unlock()
	r.l.stats.held.Add(-1)
}

// handOff releases the lease with the inbox as it is, so another host's
// janitor takes the session over at once instead of waiting for the lease
// to run out.
func (r *runner) handOff() {
	ctx, cancel := context.WithTimeout(context.Background(), r.l.opTimeout())
	defer cancel()
	_, _, err := r.l.update(ctx, r.s, "handoff", func(c *control) (*control, error) {
		if r.fenced(c) != nil {
			return nil, nil
		}
		c.Holder = ""
		c.Renew++
		c.dropFlushed(r.s.flushedThrough())
		return c, nil
	})
	if err != nil {
		r.l.log.Warn("ledger: hand-off at close failed; another host takes the session over after the lease", "session", r.s.id, "err", err)
	}
}

// release gives the lease up once the inbox is empty. It reports whether
// the runner is done (released, or lost the lease).
func (r *runner) release() bool {
	l := r.l
	var released bool
	_, err := r.write(r.ctx, "release", func(c *control) (*control, error) {
		released = false
		if len(c.Pending) > 0 {
			return nil, nil // a delivery landed meanwhile: keep draining
		}
		c.Holder = ""
		released = true
		return c, nil
	})
	if err != nil {
		if r.ctx.Err() == nil {
			r.pause(l.opts.RetryDelay)
		}
		return r.ctx.Err() != nil
	}
	if released {
		r.mu.Lock()
		r.released = true
		r.mu.Unlock()
		r.cancel(nil)
		return true
	}
	return false
}

// flush writes committed turns still carried by the control record to
// their turns/{seq} keys. Only committed content is ever written there, and
// always the same bytes for a sequence number, so a late or repeated flush
// (by a paused host, say) changes nothing.
func (r *runner) flush(c *control) error {
	return r.l.flushTurns(r.ctx, r.s, c)
}

// flushTurns writes c's unflushed turns and records how far it got.
func (l *Ledger) flushTurns(ctx context.Context, s *session, c *control) error {
	for _, u := range c.Unflushed {
		if u.Seq <= s.flushedThrough() {
			continue
		}
		rec := u
		if u.Ref != "" {
			full, err := l.readOut(ctx, s.id, u)
			if err != nil {
				return err
			}
			rec = *full
		}
		rec.Session = s.id
		l.step("flush")
		if err := l.put(ctx, l.keys.turn(s.id, u.Seq), encode(kindTurn, rec)); err != nil {
			return err
		}
		s.mu.Lock()
		s.flushed = max(s.flushed, u.Seq)
		s.mu.Unlock()
	}
	return nil
}

// readOut reads the full record of a large committed turn: from its out/
// key, or, once that is swept, from turns/{seq} (written before the out/
// reference was dropped).
func (l *Ledger) readOut(ctx context.Context, sid string, u turnRecord) (*turnRecord, error) {
	data, err := l.get(ctx, l.keys.out(sid, u.Ref))
	if err != nil {
		return l.readTurnKey(ctx, sid, u.Seq)
	}
	t, err := decodeTurn(data)
	if err != nil {
		return nil, err
	}
	if t.TurnID != u.TurnID || t.Seq != u.Seq {
		return nil, fmt.Errorf("%w: %s holds turn %s, not the committed %s", ErrFormat, l.keys.out(sid, u.Ref), t.TurnID, u.TurnID)
	}
	return t, nil
}

// deadLetter moves the head event to the dead-letter store: the record is
// written first, then the event leaves the inbox by a holder write, so an
// event is never in neither place.
func (r *runner) deadLetter(head entry) error {
	l := r.l
	payload, err := l.payload(r.ctx, r.s, head)
	if err != nil && !errors.Is(err, errMissingBlob) {
		return err
	}
	l.step("deadletter:put")
	rec := deadLetter{Version: FormatVersion, Session: r.s.id, EventID: head.ID, InboxSeq: head.Seq, Payload: payload,
		Attempts: head.Attempts, LastError: head.LastError, Gen: r.gen, Holder: l.opts.HostID, At: time.Now().UTC(), Keyed: head.Keyed}
	if rec.Payload == nil {
		rec.Payload = json.RawMessage("null")
	}
	if err := l.createDeadLetter(r.ctx, l.keys.dlq(r.s.id, head.ID, head.Seq), rec); err != nil {
		return err
	}
	var next uint64
	_, err = r.writeConsuming(r.ctx, "deadletter", func(c *control) (*control, *recent, error) {
		next = 0
		if len(c.Pending) == 0 || c.Pending[0].Seq != head.Seq {
			return nil, nil, nil
		}
		c.Pending = c.Pending[1:]
		next = startNext(c, l.opts.MaxAttempts)
		return c, &recent{ID: head.ID, Dead: true, Inbox: head.Seq, Keyed: head.Keyed}, nil
	})
	if err != nil {
		return err
	}
	l.stats.deadLettered.Add(1)
	r.mu.Lock()
	r.started, r.lastErr = next, ""
	r.mu.Unlock()
	if head.Blob != "" {
		r.s.forgetPayload(head.Blob)
		l.del(r.ctx, l.keys.blob(r.s.id, head.Blob))
	}
	return nil
}

// startNext counts an attempt on the new head event, if any and if it has
// attempts left, so its turn starts without another write. It returns the
// head's inbox sequence, or 0.
func startNext(c *control, maxAttempts int) uint64 {
	if len(c.Pending) == 0 || c.Pending[0].Attempts >= maxAttempts {
		return 0
	}
	c.Pending[0].Attempts++
	return c.Pending[0].Seq
}

var errMissingBlob = errors.New("ledger: payload blob missing")

// payload returns an event's payload, reading its blob when it has one
// (unless this host delivered it).
func (l *Ledger) payload(ctx context.Context, s *session, e entry) (json.RawMessage, error) {
	if e.Blob == "" {
		return e.Inline, nil
	}
	if p, ok := s.takePayload(e.Blob); ok {
		return p, nil
	}
	sid := s.id
	data, err := l.get(ctx, l.keys.blob(sid, e.Blob))
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("%w: %s (event %q)", errMissingBlob, l.keys.blob(sid, e.Blob), e.ID)
		}
		return nil, err
	}
	b, err := decodeBlob(data)
	if err != nil {
		return nil, err
	}
	return b.Payload, nil
}

// runTurn runs the Handler on the head event. It reports whether the turn
// committed, and whether its failure is permanent: the Handler returned a
// PermanentError while the turn's context was still live.
func (r *runner) runTurn(c *control, head entry) (committed, permanent bool, err error) {
	l := r.l
	payload, err := l.payload(r.ctx, r.s, head)
	if err != nil {
		return false, false, err
	}
	tctx, cancel := context.WithCancelCause(r.ctx)
	defer cancel(nil)
	r.mu.Lock()
	r.turn = cancel
	if r.untilFence() <= 0 {
		cancel(ErrSelfFenced)
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.turn = nil
		r.mu.Unlock()
	}()
	t := &Turn{
		SessionID: r.s.id, Seq: c.Commit + 1, Generation: r.gen, ID: randomHex(8),
		Event: Event{ID: head.ID, Payload: payload}, InboxSeq: head.Seq, Attempt: head.Attempts,
		LastError: head.LastError, r: r, head: head,
	}
	l.step("turn:start")
	err = callHandler(tctx, l.opts.Handler, t)
	if t.committed.Load() {
		return true, false, nil
	}
	if err == nil {
		err = errors.New("the handler returned without committing the turn")
	}
	if cause := context.Cause(tctx); cause != nil && tctx.Err() != nil {
		return false, false, fmt.Errorf("%w (turn context: %w)", err, cause)
	}
	var perm *PermanentError
	return false, errors.As(err, &perm), err
}

// callHandler runs h, turning a panic into an error so a failing handler
// is a failed attempt, not a crash of the host.
func callHandler(ctx context.Context, h Handler, t *Turn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return h(ctx, t)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
