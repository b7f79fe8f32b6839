package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"agentkit/keys"
	"agentkit/kv"
)

// Ledger serves one agent's durable sessions from a shared store. Every
// host of the agent opens one over the same store; Deliver puts events in a
// session's inbox, the host holding the session runs its turns through the
// Handler, and Run's janitor takes over sessions whose holder went silent.
// A Ledger is safe for concurrent use.
type Ledger struct {
	opts  Options
	store *kv.DB
	keys  layout
	log   *slog.Logger

	// ctx lives until Close; runners and background deletes derive from it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
	// draining is closed by Drain: runners start no new turn.
	draining chan struct{}
	// janitorStop is closed by Drain: Run returns.
	janitorStop chan struct{}
	janitorOnce sync.Once

	mu       sync.Mutex
	sessions map[string]*session
	// closed is set by Drain (and so by Close): no new turn, no delivery;
	// closing by Close, whose wait runs once.
	closed, closing bool

	// The janitor's state, used by Run's goroutine only.
	obs   map[string]observation // what the janitor last saw of each held session
	swept map[string]time.Time   // when this host last swept each session

	stats counters
}

// session is this host's view of one session: its cached control record
// and, while this host holds it, its runner. wlock serializes this host's
// writers of the control record across their store calls, so local writers
// never race each other; mu guards the fields and is never held across a
// store call.
type session struct {
	id  string
	key string

	wlock chan struct{}

	mu      sync.Mutex
	loaded  bool       // ctl and ver reflect a read or a write of ours
	ctl     *control   // nil with loaded: no record
	ver     kv.Version // the version of ctl
	flushed uint64     // turns up to this sequence are at turns/{seq}
	run     *runner    // the runner of this host, if any
	changed chan struct{}
	// payloads holds blob payloads this host delivered to a session it
	// runs, so its turns need not read them back.
	payloads map[string][]byte
}

// keepPayload remembers a blob payload for this host's runner.
func (s *session) keepPayload(ref string, payload []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.payloads == nil {
		s.payloads = map[string][]byte{}
	}
	s.payloads[ref] = payload
}

// takePayload returns a remembered payload, if any.
func (s *session) takePayload(ref string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.payloads[ref]
	return p, ok
}

// forgetPayload drops a remembered payload (the event left the inbox), or
// all of them (ref "", when the runner ends).
func (s *session) forgetPayload(ref string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ref == "" {
		s.payloads = nil
		return
	}
	delete(s.payloads, ref)
}

// acquire takes the session's writer lock, or fails when ctx ends first.
func (s *session) acquire(ctx context.Context) error {
	select {
	case s.wlock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) unlock() { <-s.wlock }

// cached returns a copy of the cached record, its version, and whether it
// is loaded.
func (s *session) cached() (*control, kv.Version, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctl.clone(), s.ver, s.loaded
}

// invalidate makes the next writer read the record again.
func (s *session) invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loaded = false
}

// flushedThrough returns how far committed turns are known to be flushed.
func (s *session) flushedThrough() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushed
}

// maxCached bounds the sessions whose control records a Ledger caches.
const maxCached = 4096

// Open checks the store (CheckStore) and the options and returns the
// Ledger. Deliveries can start at once; call Run to run the janitor, and
// Close to hand held sessions over to other hosts.
func Open(opts Options) (*Ledger, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	scope, err := keys.Agent(o.Agent)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Ledger{
		opts: o, store: o.Store, keys: newLayout(scope), log: o.Logger,
		ctx: ctx, cancel: cancel,
		draining: make(chan struct{}), janitorStop: make(chan struct{}),
		sessions: map[string]*session{},
		obs:      map[string]observation{},
		swept:    map[string]time.Time{},
	}, nil
}

// HostID returns the id this Ledger writes as holder.
func (l *Ledger) HostID() string { return l.opts.HostID }

// Lease returns the lease duration in force, and Margin the takeover
// margin.
func (l *Ledger) Lease() time.Duration { return l.opts.Lease }

// Margin returns the margin a contender waits beyond the lease.
func (l *Ledger) Margin() time.Duration { return l.opts.Margin }

// Close stops the janitor and hands every session this host holds over:
// runners start no new turn, and each releases its lease with its pending
// events still queued once its current turn ends, so another host's
// janitor takes the session over on its next scan. When ctx ends first,
// the running turns are canceled (their context's cause is ErrClosed) and
// Close returns after their runners have stopped. Later calls return nil.
func (l *Ledger) Close(ctx context.Context) error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return nil
	}
	l.closing = true
	l.mu.Unlock()
	l.Drain()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		l.cancel(ErrClosed)
		return nil
	case <-ctx.Done():
	}
	l.cancel(ErrClosed)
	<-done
	return fmt.Errorf("ledger: close: turns were still running and were canceled: %w", ctx.Err())
}

// Drain is Close's first step, without its wait: the janitor stops,
// deliveries are refused with ErrClosed, and every runner starts no new
// turn: it releases its session with its pending events still queued
// once its current turn ends, so another host's janitor takes the session
// over. A host that is shutting down calls it as soon as it knows, so that
// it does not run the messages queued behind its running turns while it
// waits for its other work to end; Close then waits for the runners.
func (l *Ledger) Drain() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.stopJanitor()
	l.wakeRunners()
}

// abandon stops the Ledger as a crash would: no hand-off, no release.
// Tests use it; the store access of a crashed host is cut by the test's
// store wrapper.
func (l *Ledger) abandon() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.stopJanitor()
	l.cancel(errAbandoned)
}

func (l *Ledger) stopJanitor() { l.janitorOnce.Do(func() { close(l.janitorStop) }) }

func (l *Ledger) wakeRunners() {
	select {
	case <-l.draining:
	default:
		close(l.draining)
	}
}

var errAbandoned = errors.New("ledger: abandoned (test crash)")

func (l *Ledger) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// session returns this host's view of sid, creating it.
func (l *Ledger) session(sid string) *session {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.sessions[sid]; ok {
		return s
	}
	if len(l.sessions) >= maxCached {
		l.evictLocked()
	}
	s := &session{id: sid, key: l.keys.ctl(sid), wlock: make(chan struct{}, 1), changed: make(chan struct{})}
	l.sessions[sid] = s
	return s
}

// evictLocked forgets cached sessions this host is not running, down to
// three quarters of maxCached. Called with l.mu held.
func (l *Ledger) evictLocked() {
	for id, s := range l.sessions {
		if len(l.sessions) <= maxCached*3/4 {
			return
		}
		s.mu.Lock()
		idle := s.run == nil
		s.mu.Unlock()
		if idle {
			delete(l.sessions, id)
		}
	}
}

// step calls the test hook at a named protocol step.
func (l *Ledger) step(name string) {
	if h := l.opts.test.step; h != nil {
		h(name)
	}
}

// set caches a record this host read or wrote; its caller holds the
// writer lock.
func (s *session) set(c *control, ver kv.Version) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctl, s.ver, s.loaded = c, ver, true
	close(s.changed)
	s.changed = make(chan struct{})
}

// watch returns a channel closed at the next change of the cached record.
func (s *session) watch() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// snapshot returns a copy of the cached record (nil if none or not loaded).
func (s *session) snapshot() *control {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctl.clone()
}

// opTimeout bounds one store call on the control path, so a call that
// hangs becomes an unknown outcome the caller resolves instead of a stall.
func (l *Ledger) opTimeout() time.Duration { return l.opts.Lease / 3 }

// readControl reads sid's control record from the store: nil, "", nil when
// there is none.
func (l *Ledger) readControl(ctx context.Context, key string) (*control, kv.Version, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	data, ver, err := l.store.GetWithVersion(ctx, key)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	c, err := decodeControl(data)
	if err != nil {
		return nil, "", fmt.Errorf("%w (key %s)", err, key)
	}
	return c, ver, nil
}

// load reads the record into the cache; its caller holds the writer lock.
func (l *Ledger) load(ctx context.Context, s *session) error {
	c, ver, err := l.readControl(ctx, s.key)
	if err != nil {
		return err
	}
	s.set(c, ver)
	return nil
}

// mutation computes the next control record from the current one (nil when
// there is none; a copy the mutation may change). It returns nil to write
// nothing, or an error to stop. A mutation may run several times (after a
// conflict or an unknown outcome) and must decide from cur alone, so that
// a write that already landed is recognised rather than repeated.
type mutation func(cur *control) (*control, error)

// errUnknownOutcome wraps a store error after which a write may or may not
// have landed and re-reading could not tell.
var errUnknownOutcome = errors.New("ledger: the outcome of a write is unknown")

// update applies mutate to sid's control record with compare-and-set,
// retrying on conflicts until ctx ends. It returns the record as written
// (or as found, when mutate wrote nothing), and the time the successful
// write was sent. An unknown outcome (a timeout, a lost answer) is resolved
// by re-reading: a record carrying this write's nonce is this write; an
// unchanged version means it did not land, and the same write is sent
// again; any other record is given to mutate afresh.
func (l *Ledger) update(ctx context.Context, s *session, step string, mutate mutation) (*control, time.Time, error) {
	if err := s.acquire(ctx); err != nil {
		return nil, time.Time{}, err
	}
	defer s.unlock()
	unknown := 0
	fresh := false // the cache was read or written by this call
	// uncertain is set once a write of this call may have landed unseen;
	// an error returned after that says the outcome is unknown.
	uncertain := false
	fail := func(err error) (*control, time.Time, error) {
		if uncertain && !errors.Is(err, errUnknownOutcome) {
			err = fmt.Errorf("%w: %w", errUnknownOutcome, err)
		}
		return nil, time.Time{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		cur, expected, loaded := s.cached()
		if !loaded {
			if err := l.load(ctx, s); err != nil {
				return fail(err)
			}
			fresh = true
			continue
		}
		create := cur == nil
		next, err := mutate(cur.clone())
		if err != nil || next == nil {
			if !fresh && !errors.Is(err, errRetry) {
				// Decided without a write, so nothing validated the cache:
				// decide again on a fresh read.
				s.invalidate()
				continue
			}
			return cur, time.Time{}, err
		}
		next.Version = FormatVersion
		next.Write = randomHex(8)
		data := encode(kindControl, next)
		l.step(step + ":before-write")
		sent := time.Now()
		ver, err := l.cas(ctx, s.key, data, create, expected)
		l.step(step + ":after-write")
		switch {
		case err == nil:
			s.set(next, ver)
			return next.clone(), sent, nil
		case errors.Is(err, kv.ErrConflict):
			s.invalidate()
			fresh = false
			continue
		case ctx.Err() != nil:
			s.invalidate()
			uncertain = true
			return fail(err)
		case permanent(ctx, err):
			return fail(err)
		}
		// The write may have landed. Resolve by reading.
		uncertain = true
		landed, ver, rerr := l.resolve(ctx, s, next.Write, data, create, expected)
		if rerr != nil {
			unknown++
			s.invalidate()
			if ctx.Err() != nil || unknown >= 3 {
				return fail(rerr)
			}
			continue
		}
		if landed {
			s.set(next, ver)
			return next.clone(), sent, nil
		}
		// Another record is there, just read: mutate runs again on it.
		fresh = true
	}
}

// resolve settles a write with an unknown outcome. It returns landed true
// with the version when the write is in the store; landed false once the
// cache holds a different record, which the caller's mutation judges
// again. Its caller holds the writer lock.
func (l *Ledger) resolve(ctx context.Context, s *session, nonce string, data []byte, create bool, expected kv.Version) (bool, kv.Version, error) {
	var last error
	for i := range 4 {
		if err := sleepCtx(ctx, time.Duration(i)*l.opts.Lease/50); err != nil {
			return false, "", err
		}
		c, ver, err := l.readControl(ctx, s.key)
		if err != nil {
			last = err
			continue
		}
		if c != nil && c.Write == nonce {
			return true, ver, nil
		}
		if (create && c == nil) || (!create && c != nil && ver == expected) {
			// Not landed (or not yet): send the very same write again, so a
			// late copy of the first one and this one cannot both apply.
			nv, err := l.cas(ctx, s.key, data, create, expected)
			if err == nil {
				return true, nv, nil
			}
			if !errors.Is(err, kv.ErrConflict) && permanent(ctx, err) {
				return false, "", err
			}
			last = err
			continue
		}
		s.set(c, ver)
		return false, "", nil
	}
	return false, "", last
}

// cas is one conditional write of a control record.
func (l *Ledger) cas(ctx context.Context, key string, data []byte, create bool, expected kv.Version) (kv.Version, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	if create {
		return l.store.PutIfAbsent(ctx, key, data)
	}
	return l.store.PutIfVersion(ctx, key, data, expected)
}

// permanent reports errors that no retry fixes: the caller's context ended,
// the store is closed, or the store refused the value or key.
func permanent(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, kv.ErrClosed) || errors.Is(err, kv.ErrTooLarge) ||
		errors.Is(err, kv.ErrInvalidKey) || errors.Is(err, errors.ErrUnsupported) || errors.Is(err, ErrFormat)
}

// put writes a plain record, resending it after an unknown outcome (every
// plain write of the ledger is idempotent: same key, same bytes).
func (l *Ledger) put(ctx context.Context, key string, data []byte) error {
	var err error
	for i := range 3 {
		if i > 0 {
			if serr := sleepCtx(ctx, time.Duration(i)*l.opts.Lease/50); serr != nil {
				return serr
			}
		}
		cctx, cancel := context.WithTimeout(ctx, l.opTimeout())
		err = l.store.Put(cctx, key, data)
		cancel()
		if err == nil || permanent(ctx, err) {
			return err
		}
	}
	return err
}

// get reads a plain record, retrying transport errors a few times.
func (l *Ledger) get(ctx context.Context, key string) ([]byte, error) {
	var err error
	for i := range 3 {
		if i > 0 {
			if serr := sleepCtx(ctx, time.Duration(i)*l.opts.Lease/50); serr != nil {
				return nil, serr
			}
		}
		cctx, cancel := context.WithTimeout(ctx, l.opTimeout())
		var data []byte
		data, err = l.store.Get(cctx, key)
		cancel()
		if err == nil || errors.Is(err, kv.ErrNotFound) || permanent(ctx, err) {
			return data, err
		}
	}
	return nil, err
}

// del deletes keys the ledger no longer needs; failures are logged, since
// the orphan sweep finds what is left.
func (l *Ledger) del(ctx context.Context, key string) {
	cctx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	if err := l.store.Delete(cctx, key); err != nil && ctx.Err() == nil {
		l.log.Warn("ledger: delete failed; the janitor's sweep retries", "key", key, "err", err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
