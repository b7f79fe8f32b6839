package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
)

// cluster is a few hosts over one memkv store, each seeing it through a
// hostStore (pausable, cuttable, crashable) with the simulation's monitor
// checking every write, but no random faults.
type cluster struct {
	t     *testing.T
	w     *simWorld
	hosts []*testHost
}

type testHost struct {
	l     *Ledger
	store *hostStore
	stop  context.CancelFunc
	done  chan struct{}
	// handle is the host's Handler; tests swap it.
	mu     sync.Mutex
	handle Handler
}

func (h *testHost) setHandler(f Handler) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handle = f
}

func newCluster(t *testing.T, n int, tweak func(*Options)) *cluster {
	t.Helper()
	scope, _ := keys.Agent("test")
	base := memkv.NewStore()
	w := &simWorld{base: base, rng: rand.New(rand.NewPCG(1, 2)), mon: newMonitor(newLayout(scope), base)}
	w.res.crashSteps = map[string]int{}
	c := &cluster{t: t, w: w}
	for i := range n {
		c.add(fmt.Sprintf("h%d", i), tweak)
	}
	t.Cleanup(func() {
		for _, v := range w.mon.violations() {
			t.Error(v)
		}
		c.closeAll()
	})
	return c
}

// add starts a host; its Run (the janitor) runs until the test ends.
func (c *cluster) add(id string, tweak func(*Options)) *testHost {
	hs := &hostStore{w: c.w, pause: &pauseGate{}, cut: &pauseGate{}}
	db, err := kv.New("test", hs)
	if err != nil {
		c.t.Fatal(err)
	}
	h := &testHost{store: hs, handle: commitEcho}
	opts := Options{Tuning: Tuning{Lease: 3 * time.Second}, Store: db, Agent: "test", HostID: id, AllowProcessLocal: true,
		Logger: quietLogger(),
		Handler: func(ctx context.Context, t *Turn) error {
			h.mu.Lock()
			f := h.handle
			h.mu.Unlock()
			return f(ctx, t)
		}}
	if tweak != nil {
		tweak(&opts)
	}
	h.l, err = Open(opts)
	if err != nil {
		c.t.Fatal(err)
	}
	c.w.mon.silence = h.l.Lease() + h.l.Margin()
	c.w.mon.keyWindow = h.l.opts.IdempotencyWindow
	ctx, cancel := context.WithCancel(context.Background())
	h.stop, h.done = cancel, make(chan struct{})
	go func() {
		defer close(h.done)
		_ = h.l.Run(ctx)
	}()
	c.hosts = append(c.hosts, h)
	return h
}

func (c *cluster) closeAll() {
	c.w.late.Wait()
	for _, h := range c.hosts {
		h.pause().clear()
		h.store.cut.clear()
		_ = h.l.Close(context.Background())
		h.stop()
		<-h.done
	}
	c.hosts = nil
}

func (h *testHost) pause() *pauseGate { return h.store.pause }

// crash stops a host as a crash would.
func (h *testHost) crash() {
	h.store.dead.Store(true)
	h.l.abandon()
	h.stop()
}

// commitEcho commits the event's payload as the turn's output.
func commitEcho(ctx context.Context, t *Turn) error {
	_, err := t.Commit(ctx, []json.RawMessage{t.Event.Payload})
	return err
}

func msg(id string) Event {
	return Event{ID: id, Payload: json.RawMessage(fmt.Sprintf(`{"text":%q}`, id))}
}

// transcript reads a whole transcript through l.
func transcript(t *testing.T, l *Ledger, sid string) []Committed {
	t.Helper()
	var all []Committed
	for after := uint64(0); ; {
		p, err := l.Transcript(context.Background(), sid, after, 0)
		if err != nil {
			t.Fatalf("transcript of %s via %s: %v", sid, l.HostID(), err)
		}
		all = append(all, p.Turns...)
		after = p.Next
		if !p.More {
			return all
		}
	}
}

func eventIDs(turns []Committed) []string {
	var ids []string
	for _, t := range turns {
		ids = append(ids, t.EventIDs...)
	}
	return ids
}

func TestDeliverAcquiresRunsAndReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, nil)
		l := c.hosts[0].l
		ctx := context.Background()
		d, err := l.Deliver(ctx, "s", msg("e1"))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Acquired || !d.Local || d.Duplicate || d.State != StatePending || d.InboxSeq != 1 || d.Holder != "h0" {
			t.Fatalf("first delivery: %+v", d)
		}
		got, err := l.Await(ctx, "s", "e1")
		if err != nil {
			t.Fatal(err)
		}
		if got.Seq != 1 || got.Holder != "h0" || !slices.Equal(got.EventIDs, []string{"e1"}) || string(got.Output[0]) != `{"text":"e1"}` {
			t.Fatalf("committed turn: %+v", got)
		}
		synctest.Wait()
		info := sessionInfo(t, l, "s")
		if info.Holder != "" || info.Pending != 0 || info.CommitSeq != 1 {
			t.Fatalf("after the drain the session is %+v; want released, empty, one commit", info)
		}
		if st := l.Stats(); st.LeasesHeld != 0 || st.Commits != 1 || st.Acquired != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func sessionInfo(t *testing.T, l *Ledger, sid string) SessionInfo {
	t.Helper()
	for info, err := range l.Sessions(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		if info.ID == sid {
			return info
		}
	}
	t.Fatalf("session %s not listed", sid)
	return SessionInfo{}
}

func TestDeliveryIsIdempotentByEventID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		ctx := context.Background()
		block := make(chan struct{})
		c.hosts[0].setHandler(func(ctx context.Context, t *Turn) error {
			<-block
			return commitEcho(ctx, t)
		})
		if _, err := c.hosts[0].l.Deliver(ctx, "s", msg("e1")); err != nil {
			t.Fatal(err)
		}
		// While pending, through either host: a duplicate.
		for _, h := range c.hosts {
			d, err := h.l.Deliver(ctx, "s", Event{ID: "e1", Payload: json.RawMessage(`"another body"`)})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Duplicate || d.State != StatePending || d.InboxSeq != 1 {
				t.Fatalf("redelivery while pending via %s: %+v", h.l.HostID(), d)
			}
		}
		close(block)
		if _, err := c.hosts[1].l.Await(ctx, "s", "e1"); err != nil {
			t.Fatal(err)
		}
		d, err := c.hosts[1].l.Deliver(ctx, "s", msg("e1"))
		if err != nil {
			t.Fatal(err)
		}
		if !d.Duplicate || d.State != StateCommitted || d.CommitSeq != 1 {
			t.Fatalf("redelivery after the commit: %+v", d)
		}
		synctest.Wait()
		turns := transcript(t, c.hosts[1].l, "s")
		if len(turns) != 1 || string(turns[0].Output[0]) != `{"text":"e1"}` {
			t.Fatalf("transcript %+v; want the first delivery's payload, once", turns)
		}
	})
}

func TestQueuedOnAnotherHostAndDrainedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		ctx := context.Background()
		block := make(chan struct{})
		var order []string
		var mu sync.Mutex
		c.hosts[0].setHandler(func(ctx context.Context, t *Turn) error {
			<-block
			mu.Lock()
			order = append(order, t.Event.ID)
			mu.Unlock()
			return commitEcho(ctx, t)
		})
		if d, err := c.hosts[0].l.Deliver(ctx, "s", msg("e1")); err != nil || !d.Acquired {
			t.Fatalf("%+v %v", d, err)
		}
		for i := 2; i <= 5; i++ {
			d, err := c.hosts[1].l.Deliver(ctx, "s", msg(fmt.Sprint("e", i)))
			if err != nil {
				t.Fatal(err)
			}
			if d.Acquired || d.Local || d.Holder != "h0" || d.InboxSeq != uint64(i) {
				t.Fatalf("delivery %d via the other host: %+v; want queued behind h0", i, d)
			}
		}
		close(block)
		if _, err := c.hosts[1].l.Await(ctx, "s", "e5"); err != nil {
			t.Fatal(err)
		}
		if want := []string{"e1", "e2", "e3", "e4", "e5"}; !slices.Equal(order, want) {
			t.Fatalf("turns ran in order %v, want %v", order, want)
		}
		turns := transcript(t, c.hosts[1].l, "s")
		for i, tr := range turns {
			if tr.Seq != uint64(i+1) || tr.Holder != "h0" {
				t.Fatalf("turn %d: %+v", i, tr)
			}
		}
		if got := eventIDs(turns); !slices.Equal(got, []string{"e1", "e2", "e3", "e4", "e5"}) {
			t.Fatalf("committed %v", got)
		}
	})
}

// TestPausedHolderIsFencedAndTakenOver: the holder freezes past the lease
// in the middle of a turn; another host takes the session over, runs the
// turn and commits; the old holder's commit, when it wakes, is refused, and
// every host reads only the new holder's turn.
func TestPausedHolderIsFencedAndTakenOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		a, b := c.hosts[0], c.hosts[1]
		ctx := context.Background()
		started := make(chan struct{})
		wake := make(chan struct{})
		var commitErr error
		a.setHandler(func(ctx context.Context, t *Turn) error {
			close(started)
			<-wake // frozen: in the model call, say
			_, commitErr = t.Commit(ctx, []json.RawMessage{json.RawMessage(`"from a"`)})
			return commitErr
		})
		b.setHandler(func(ctx context.Context, t *Turn) error {
			_, err := t.Commit(ctx, []json.RawMessage{json.RawMessage(`"from b"`)})
			return err
		})
		if _, err := a.l.Deliver(ctx, "s", msg("e1")); err != nil {
			t.Fatal(err)
		}
		<-started
		a.pause().set(time.Now().Add(time.Hour)) // a's store calls (its renewals) freeze
		lease := a.l.Lease() + a.l.Margin()
		time.Sleep(lease / 2)
		synctest.Wait()
		if info := sessionInfo(t, b.l, "s"); info.Holder != "h0" {
			t.Fatalf("b took over after %s, before lease + margin: %+v", lease/2, info)
		}
		got, err := b.l.Await(ctx, "s", "e1")
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder != "h1" || string(got.Output[0]) != `"from b"` {
			t.Fatalf("the turn was committed by %s with %s; want h1", got.Holder, got.Output[0])
		}
		a.pause().clear()
		close(wake)
		synctest.Wait()
		for _, line := range c.w.mon.session("s").log {
			t.Log(line)
		}
		if !errors.Is(commitErr, ErrFenced) {
			t.Fatalf("the paused holder's commit returned %v; want ErrFenced", commitErr)
		}
		if st := a.l.Stats(); st.FencedCommits != 1 || st.LeasesHeld != 0 {
			t.Fatalf("old holder's stats %+v; want one fenced commit and no lease", st)
		}
		if st := b.l.Stats(); st.Takeovers != 1 {
			t.Fatalf("new holder's stats %+v; want one takeover", st)
		}
		for _, h := range c.hosts {
			turns := transcript(t, h.l, "s")
			if len(turns) != 1 || turns[0].Holder != "h1" {
				t.Fatalf("%s reads %+v", h.l.HostID(), turns)
			}
		}
	})
}

// TestUnknownOutcomesAreResolvedByReading: a delivery's compare-and-set is
// applied but answered with a timeout, dropped, or applied late; each time
// Deliver acknowledges the event once, as a new event (not a duplicate),
// takes the lease, and the event is committed once.
func TestUnknownOutcomesAreResolvedByReading(t *testing.T) {
	for _, fault := range []string{"lost", "drop", "late"} {
		t.Run(fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, 1, nil)
				h := c.hosts[0]
				ctx := context.Background()
				h.store.planFault("cas", fault)
				d, err := h.l.Deliver(ctx, "s", msg("e1"))
				if err != nil {
					t.Fatal(err)
				}
				if d.Duplicate || !d.Acquired || d.InboxSeq != 1 {
					t.Fatalf("delivery after a %s answer: %+v; want a new event that took the lease", fault, d)
				}
				if _, err := h.l.Await(ctx, "s", "e1"); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if turns := transcript(t, h.l, "s"); len(turns) != 1 {
					t.Fatalf("%d turns committed; want 1", len(turns))
				}
			})
		})
	}
}

// TestUnknownCommitOutcome: the commit's compare-and-set is applied but
// answered with a timeout; Commit reports success, once, and the turn is
// committed once.
func TestUnknownCommitOutcome(t *testing.T) {
	for _, fault := range []string{"lost", "drop", "late"} {
		t.Run(fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, 1, nil)
				h := c.hosts[0]
				var commits int
				h.setHandler(func(ctx context.Context, tr *Turn) error {
					h.store.planFault("cas", fault)
					_, err := tr.Commit(ctx, []json.RawMessage{tr.Event.Payload})
					if err == nil {
						commits++
					}
					return err
				})
				ctx := context.Background()
				if _, err := h.l.Deliver(ctx, "s", msg("e1")); err != nil {
					t.Fatal(err)
				}
				if _, err := h.l.Await(ctx, "s", "e1"); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if turns := transcript(t, h.l, "s"); len(turns) != 1 || commits != 1 {
					t.Fatalf("%d turns committed, Commit succeeded %d times; want 1 and 1", len(turns), commits)
				}
			})
		})
	}
}

// TestDrainBeforeRelease: a delivery lands between the holder's last
// commit and its release; the release's compare-and-set fails on the new
// version, the holder keeps draining, and the event is committed by the
// same generation at once, without waiting for a janitor.
func TestDrainBeforeRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *cluster
		var once sync.Once
		delivered := make(chan struct{})
		c = newCluster(t, 2, func(o *Options) {
			if o.HostID != "h0" {
				return
			}
			o.test.step = func(name string) {
				if name == "release:before-write" {
					once.Do(func() {
						if _, err := c.hosts[1].l.Deliver(context.Background(), "s", msg("late")); err != nil {
							t.Error(err)
						}
						close(delivered)
					})
				}
			}
		})
		ctx := context.Background()
		start := time.Now()
		if _, err := c.hosts[0].l.Deliver(ctx, "s", msg("first")); err != nil {
			t.Fatal(err)
		}
		<-delivered
		got, err := c.hosts[1].l.Await(ctx, "s", "late")
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder != "h0" || got.Generation != 1 {
			t.Fatalf("the late event was committed by %s at generation %d; want the draining holder h0 at generation 1", got.Holder, got.Generation)
		}
		if waited := time.Since(start); waited >= c.hosts[0].l.Lease() {
			t.Fatalf("the late event waited %s; it should not wait for a lease to expire", waited)
		}
		synctest.Wait()
		if info := sessionInfo(t, c.hosts[1].l, "s"); info.Holder != "" || info.Pending != 0 || info.CommitSeq != 2 {
			t.Fatalf("session %+v; want released with both events committed", info)
		}
	})
}

// TestRenewalDuringLongTurns: a turn runs for five leases; the holder's
// renewals keep the lease, so no other host takes over and the commit
// lands.
func TestRenewalDuringLongTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		a := c.hosts[0]
		lease := a.l.Lease()
		a.setHandler(func(ctx context.Context, tr *Turn) error {
			if err := sleepCtx(ctx, 5*lease); err != nil {
				return err
			}
			return commitEcho(ctx, tr)
		})
		ctx := context.Background()
		if _, err := a.l.Deliver(ctx, "s", msg("long")); err != nil {
			t.Fatal(err)
		}
		got, err := c.hosts[1].l.Await(ctx, "s", "long")
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder != "h0" || got.Generation != 1 {
			t.Fatalf("committed by %s at generation %d; want h0 at 1", got.Holder, got.Generation)
		}
		if st := c.hosts[1].l.Stats(); st.Takeovers != 0 {
			t.Fatalf("the other host took over %d times during a renewed lease", st.Takeovers)
		}
		// Renewed about every lease/3: the renewal counter shows it.
		cur := c.w.mon.current("s")
		if cur.Renew < 12 {
			t.Fatalf("renewal counter %d after five leases; want one renewal every third of a lease", cur.Renew)
		}
	})
}

// TestSelfFencing: the holder's store becomes unreachable right after a
// renewal; Check turns ErrSelfFenced exactly Lease × (1 − DriftAllowance)
// after that renewal was sent, and the turn's context ends with that
// cause.
func TestSelfFencing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.DriftAllowance = 0.2 })
		h := c.hosts[0]
		lease := h.l.Lease()
		var sent, firstRefusal, ctxEnd time.Time
		var cause, refusal error
		done := make(chan struct{})
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			defer close(done)
			// Wait for a renewal, then cut the store off.
			r := tr.r
			r.mu.Lock()
			before := r.lastSent
			r.mu.Unlock()
			for sent = before; !sent.After(before); time.Sleep(time.Millisecond) {
				r.mu.Lock()
				sent = r.lastSent
				r.mu.Unlock()
			}
			h.store.cut.set(time.Now().Add(time.Hour))
			for tr.Check() == nil && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			firstRefusal, refusal = time.Now(), tr.Check()
			<-ctx.Done()
			ctxEnd, cause = time.Now(), context.Cause(ctx)
			return ctx.Err()
		})
		if _, err := h.l.Deliver(context.Background(), "s", msg("e")); err != nil {
			t.Fatal(err)
		}
		<-done
		h.store.cut.clear()
		want := sent.Add(time.Duration(float64(lease) * 0.8))
		if d := firstRefusal.Sub(want); d < 0 || d > time.Millisecond || !errors.Is(refusal, ErrSelfFenced) {
			t.Fatalf("Check first refused (%v) %s after the last renewal was sent; want ErrSelfFenced after %s (lease × (1 − 0.2))",
				refusal, firstRefusal.Sub(sent), want.Sub(sent))
		}
		if !ctxEnd.Equal(want) || !errors.Is(cause, ErrSelfFenced) {
			t.Fatalf("the turn's context ended at +%s with cause %v; want +%s with ErrSelfFenced", ctxEnd.Sub(sent), cause, want.Sub(sent))
		}
		if st := h.l.Stats(); st.SelfFenced != 1 {
			t.Fatalf("stats %+v; want one self-fenced turn", st)
		}
	})
}

// TestTakeoverWaitsForLeasePlusMargin: a holder freezes right after a
// renewal; another host takes over no earlier than Lease + Margin after
// the last renewal (the monitor checks the same rule in every test).
func TestTakeoverWaitsForLeasePlusMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A short janitor interval: the contender acts as soon as the rule
		// allows, so a takeover a little early would show.
		c := newCluster(t, 2, func(o *Options) { o.Margin = 2 * time.Second; o.JanitorInterval = 100 * time.Millisecond })
		a, b := c.hosts[0], c.hosts[1]
		block := make(chan struct{})
		var unblock sync.Once
		t.Cleanup(func() { unblock.Do(func() { close(block) }) }) // also when the test fails
		a.setHandler(func(ctx context.Context, tr *Turn) error {
			<-block
			return errors.New("never")
		})
		ctx := context.Background()
		if _, err := a.l.Deliver(ctx, "s", msg("e")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		frozen := time.Now()
		a.pause().set(frozen.Add(time.Hour))
		silence := a.l.Lease() + a.l.Margin()
		time.Sleep(silence - time.Millisecond)
		synctest.Wait()
		if st := b.l.Stats(); st.Takeovers != 0 {
			t.Fatalf("b took over %s after a's last write, before lease + margin (%s)", time.Since(frozen), silence)
		}
		if _, err := b.l.Await(ctx, "s", "e"); err != nil {
			t.Fatal(err)
		}
		if st := b.l.Stats(); st.Takeovers != 1 {
			t.Fatalf("stats %+v; want one takeover", st)
		}
		// One janitor interval (at most 1.5 × Lease/2) after the silence.
		if late := time.Since(frozen); late > silence+a.l.Lease() {
			t.Fatalf("takeover came %s after the last renewal; want within lease + margin + a janitor interval", late)
		}
		unblock.Do(func() { close(block) })
		a.pause().clear()
	})
}

// TestCloseHandsOver: Close releases a held session with its inbox as it
// is; another host's janitor picks it up on its next scan instead of
// waiting for the lease to run out.
func TestCloseHandsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		a, b := c.hosts[0], c.hosts[1]
		ctx := context.Background()
		started, block := make(chan struct{}), make(chan struct{})
		var once sync.Once
		// The first turn waits until the queue has filled and Close began.
		a.setHandler(func(ctx context.Context, tr *Turn) error {
			once.Do(func() { close(started); <-block })
			return commitEcho(ctx, tr)
		})
		for i := range 4 {
			if _, err := a.l.Deliver(ctx, "s", msg(fmt.Sprint("e", i))); err != nil {
				t.Fatal(err)
			}
		}
		<-started
		closed := make(chan error)
		go func() { closed <- a.l.Close(ctx) }()
		synctest.Wait()
		close(block) // the running turn finishes; no new turn starts
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		info := sessionInfo(t, b.l, "s")
		if info.Holder != "" || info.Pending != 3 || info.CommitSeq != 1 {
			t.Fatalf("after a's Close: %+v; want released with three events pending and one committed", info)
		}
		if _, err := b.l.Await(ctx, "s", "e3"); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited >= b.l.Lease() {
			t.Fatalf("b took %s to pick the handed-over session up; want less than a lease", waited)
		}
		turns := transcript(t, b.l, "s")
		if got := eventIDs(turns); !slices.Equal(got, []string{"e0", "e1", "e2", "e3"}) {
			t.Fatalf("committed %v", got)
		}
		if _, err := a.l.Deliver(ctx, "s", msg("after")); !errors.Is(err, ErrClosed) {
			t.Fatalf("Deliver after Close: %v; want ErrClosed", err)
		}
	})
}

// TestDedupWindow: a session remembers DedupWindow consumed event ids;
// within the window a re-delivery is a duplicate, beyond it the id is new.
func TestDedupWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.DedupWindow = 3 })
		l := c.hosts[0].l
		ctx := context.Background()
		for i := range 5 {
			id := fmt.Sprint("e", i)
			if _, err := l.Deliver(ctx, "s", msg(id)); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Await(ctx, "s", id); err != nil {
				t.Fatal(err)
			}
		}
		d, err := l.Deliver(ctx, "s", msg("e2"))
		if err != nil || !d.Duplicate || d.State != StateCommitted || d.CommitSeq != 3 {
			t.Fatalf("re-delivery of e2 (inside the window of 3): %+v %v; want a duplicate committed at 3", d, err)
		}
		d, err = l.Deliver(ctx, "s", msg("e1"))
		if err != nil || d.Duplicate {
			t.Fatalf("re-delivery of e1 (outside the window of 3): %+v %v; want a new event", d, err)
		}
		if _, err := l.Lookup(ctx, "s", "e0"); !errors.Is(err, ErrUnknownEvent) {
			t.Fatalf("Lookup of e0: %v; want ErrUnknownEvent", err)
		}
	})
}

// TestBackPressure: past MaxPending events or MaxPendingBytes, a delivery
// is refused with a BusyError (RetryAfter set) and nothing is queued; a
// re-delivery of a queued event is still a duplicate; once the inbox
// drains, deliveries are accepted again.
func TestBackPressure(t *testing.T) {
	for _, limit := range []string{"count", "bytes"} {
		t.Run(limit, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, 1, func(o *Options) {
					o.RetryAfter = 7 * time.Second
					if limit == "count" {
						o.MaxPending = 3
					} else {
						o.MaxPendingBytes = 3 * int64(len(msg("e0").Payload))
					}
				})
				h := c.hosts[0]
				block := make(chan struct{})
				var unblock sync.Once
				t.Cleanup(func() { unblock.Do(func() { close(block) }) }) // also when the test fails
				h.setHandler(func(ctx context.Context, tr *Turn) error {
					<-block
					return commitEcho(ctx, tr)
				})
				ctx := context.Background()
				for i := range 3 {
					if _, err := h.l.Deliver(ctx, "s", msg(fmt.Sprint("e", i))); err != nil {
						t.Fatal(err)
					}
				}
				_, err := h.l.Deliver(ctx, "s", msg("e3"))
				var busy *BusyError
				if !errors.As(err, &busy) || !errors.Is(err, ErrBusy) || busy.RetryAfter != 7*time.Second || busy.Pending != 3 {
					t.Fatalf("fourth delivery: %v; want a BusyError with 3 pending and RetryAfter 7s", err)
				}
				if d, err := h.l.Deliver(ctx, "s", msg("e1")); err != nil || !d.Duplicate {
					t.Fatalf("re-delivery of a queued event while full: %+v %v; want a duplicate", d, err)
				}
				if _, err := h.l.Lookup(ctx, "s", "e3"); !errors.Is(err, ErrUnknownEvent) {
					t.Fatalf("the refused event is known to the session: %v", err)
				}
				unblock.Do(func() { close(block) })
				if _, err := h.l.Await(ctx, "s", "e2"); err != nil {
					t.Fatal(err)
				}
				if _, err := h.l.Deliver(ctx, "s", msg("e3")); err != nil {
					t.Fatalf("after the drain: %v", err)
				}
			})
		})
	}
}

// TestLargePayloadsAndOutputs: payloads over InlineLimit go to blobs and
// outputs over TurnInlineLimit to their own key before the commit; both
// come back intact, from every host, and the blobs of consumed events are
// deleted.
func TestLargePayloadsAndOutputs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, func(o *Options) { o.InlineLimit = 16; o.TurnInlineLimit = 64 })
		big := json.RawMessage(fmt.Sprintf(`{"text":%q}`, strings.Repeat("x", 500)))
		c.hosts[0].setHandler(func(ctx context.Context, tr *Turn) error {
			_, err := tr.Commit(ctx, []json.RawMessage{tr.Event.Payload, tr.Event.Payload})
			return err
		})
		ctx := context.Background()
		if _, err := c.hosts[0].l.Deliver(ctx, "s", Event{ID: "big", Payload: big}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.hosts[0].l.Await(ctx, "s", "big"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, h := range c.hosts {
			turns := transcript(t, h.l, "s")
			if len(turns) != 1 || len(turns[0].Output) != 2 || string(turns[0].Output[1]) != string(big) {
				t.Fatalf("%s reads %+v", h.l.HostID(), turns)
			}
		}
		var blobs, outs []string
		for k := range c.w.base.ListKeys(ctx, c.w.mon.keys.data("s")) {
			switch {
			case strings.Contains(k, "/in/"):
				blobs = append(blobs, k)
			case strings.Contains(k, "/out/"):
				outs = append(outs, k)
			}
		}
		if len(blobs) != 0 || len(outs) != 0 {
			t.Fatalf("left behind: blobs %v, outputs %v", blobs, outs)
		}
	})
}

// TestCommitAfterSelfFence: self-fencing stops side effects, not the
// commit. A holder whose renewal was late (its turn's context ended with
// ErrSelfFenced) but that still holds the lease commits its finished work;
// the store's generation check is what decides.
func TestCommitAfterSelfFence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		h := c.hosts[0]
		var commitErr error
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			h.store.cut.set(time.Now().Add(h.l.Lease())) // shorter than lease + margin
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrSelfFenced) {
				t.Errorf("the turn ended with %v; want ErrSelfFenced", context.Cause(ctx))
			}
			time.Sleep(h.l.Lease()) // the store is back
			_, commitErr = tr.Commit(ctx, []json.RawMessage{tr.Event.Payload})
			return commitErr
		})
		if _, err := h.l.Deliver(context.Background(), "s", msg("e")); err != nil {
			t.Fatal(err)
		}
		got, err := c.hosts[1].l.Await(context.Background(), "s", "e")
		if err != nil {
			t.Fatal(err)
		}
		if commitErr != nil || got.Holder != "h0" || got.Generation != 1 {
			t.Fatalf("commit after self-fencing: %v, turn by %s at generation %d; want h0's commit at 1", commitErr, got.Holder, got.Generation)
		}
	})
}

// TestLostAnswerThenAnotherWrite: a delivery's append lands but its answer
// is lost, and another host appends before the first host reads back; the
// first host finds its event already pending (its own write) and must keep
// the payload blob the entry references (I5, checked by the monitor).
func TestLostAnswerThenAnotherWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *cluster
		var once sync.Once
		c = newCluster(t, 2, func(o *Options) {
			o.InlineLimit = 8
			if o.HostID != "h0" {
				return
			}
			o.test.step = func(name string) {
				if name == "deliver:after-write" {
					once.Do(func() {
						if _, err := c.hosts[1].l.Deliver(context.Background(), "s", msg("other")); err != nil {
							t.Error(err)
						}
					})
				}
			}
		})
		a := c.hosts[0]
		ctx := context.Background()
		big := Event{ID: "big", Payload: json.RawMessage(`{"text":"` + strings.Repeat("x", 100) + `"}`)}
		a.store.planFault("cas", "lost")
		d, err := a.l.Deliver(ctx, "s", big)
		if err != nil {
			t.Fatal(err)
		}
		if d.State != StatePending {
			t.Fatalf("delivery: %+v", d)
		}
		got, err := a.l.Await(ctx, "s", "big")
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Output[0]) != string(big.Payload) {
			t.Fatalf("the event came back as %s", got.Output[0])
		}
	})
}
