package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func deadLetters(t *testing.T, l *Ledger, sid string) []DeadLetter {
	t.Helper()
	var out []DeadLetter
	for d, err := range l.DeadLetters(context.Background(), sid) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// TestPoisonEventsAreDeadLettered: an event that fails MaxAttempts turns
// (default 5) goes to the dead-letter store with its last error, the
// session moves on to the next event, and the event's id stays known as
// dead-lettered. Replay puts it back; Drop removes it for good.
func TestPoisonEventsAreDeadLettered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, func(o *Options) { o.RetryDelay = time.Millisecond })
		a, b := c.hosts[0], c.hosts[1]
		var mu sync.Mutex
		attempts := map[string]int{}
		healed := false
		a.setHandler(func(ctx context.Context, tr *Turn) error {
			mu.Lock()
			attempts[tr.Event.ID]++
			fail := tr.Event.ID == "poison" && !healed
			mu.Unlock()
			if fail {
				return fmt.Errorf("attempt %d: cannot parse", tr.Attempt)
			}
			return commitEcho(ctx, tr)
		})
		b.setHandler(a.handle)
		ctx := context.Background()
		for _, id := range []string{"poison", "next"} {
			if _, err := a.l.Deliver(ctx, "s", msg(id)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.l.Await(ctx, "s", "poison"); !errors.Is(err, ErrDeadLettered) {
			t.Fatalf("Await of the poison event: %v; want ErrDeadLettered", err)
		}
		got, err := b.l.Await(ctx, "s", "next")
		if err != nil || got.Seq != 1 {
			t.Fatalf("the next event: %+v %v; want committed as turn 1", got, err)
		}
		if attempts["poison"] != DefaultMaxAttempts {
			t.Fatalf("the poison event was tried %d times; want %d", attempts["poison"], DefaultMaxAttempts)
		}
		dls := deadLetters(t, b.l, "")
		if len(dls) != 1 || dls[0].EventID != "poison" || dls[0].SessionID != "s" || dls[0].Attempts != 5 ||
			dls[0].LastError != "attempt 5: cannot parse" || string(dls[0].Payload) != string(msg("poison").Payload) {
			t.Fatalf("dead letters %+v", dls)
		}
		if d, err := a.l.Deliver(ctx, "s", msg("poison")); err != nil || !d.Duplicate || d.State != StateDeadLettered {
			t.Fatalf("re-delivering the dead-lettered id: %+v %v; want a duplicate, dead-lettered", d, err)
		}
		if st := a.l.Stats(); st.DeadLettered != 1 {
			t.Fatalf("stats %+v", st)
		}

		// Replay: the handler works now.
		mu.Lock()
		healed = true
		mu.Unlock()
		d, err := b.l.Replay(ctx, "s", "poison")
		if err != nil || d.Duplicate || d.InboxSeq != 3 {
			t.Fatalf("Replay: %+v %v; want re-queued at inbox 3", d, err)
		}
		got, err = a.l.Await(ctx, "s", "poison")
		if err != nil || got.Seq != 2 {
			t.Fatalf("the replayed event: %+v %v; want committed as turn 2", got, err)
		}
		if dls := deadLetters(t, a.l, "s"); len(dls) != 0 {
			t.Fatalf("dead letters after the replay: %+v", dls)
		}
		if _, err := a.l.Replay(ctx, "s", "poison"); err != nil {
			t.Fatalf("replaying a committed event: %v; want a duplicate", err)
		}

		// Drop.
		mu.Lock()
		healed = false
		mu.Unlock()
		if _, err := a.l.Deliver(ctx, "s", msg("poison2")); err != nil {
			t.Fatal(err)
		}
		if _, err := a.l.Await(ctx, "s", "poison2"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.l.Deliver(ctx, "t", Event{ID: "poison", Payload: msg("x").Payload}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.l.Await(ctx, "t", "poison"); !errors.Is(err, ErrDeadLettered) {
			t.Fatal(err)
		}
		if dls := deadLetters(t, a.l, ""); len(dls) != 1 || dls[0].SessionID != "t" {
			t.Fatalf("dead letters %+v; want t's", dls)
		}
		if err := b.l.Drop(ctx, "t", "poison"); err != nil {
			t.Fatal(err)
		}
		if dls := deadLetters(t, a.l, ""); len(dls) != 0 {
			t.Fatalf("dead letters after the drop: %+v", dls)
		}
		if _, err := b.l.Replay(ctx, "t", "poison"); !errors.Is(err, ErrNotDeadLettered) {
			t.Fatalf("Replay after Drop: %v; want ErrNotDeadLettered", err)
		}
		if err := b.l.Drop(ctx, "t", "poison"); !errors.Is(err, ErrNotDeadLettered) {
			t.Fatalf("Drop twice: %v; want ErrNotDeadLettered", err)
		}
	})
}

// TestReplayedPoisonIsDeadLetteredAgain: a replayed event that fails again
// goes back to the dead-letter store, listed once, under a new record; an
// old record left by an interrupted replay is not listed.
func TestReplayedPoisonIsDeadLetteredAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.RetryDelay = time.Millisecond; o.MaxAttempts = 2 })
		h := c.hosts[0]
		h.setHandler(func(ctx context.Context, tr *Turn) error { return errors.New("still broken") })
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", msg("p")); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); !errors.Is(err, ErrDeadLettered) {
			t.Fatal(err)
		}
		// An interrupted replay: the record of the first dead-lettering
		// survives (its delete is dropped).
		h.store.planFault("put", "drop")
		old := c.w.mon.keys.dlq("s", "p", 1)
		before, _ := c.w.base.Get(ctx, old)
		if _, err := h.l.Replay(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		if err := c.w.base.Put(ctx, old, before); err != nil { // as if the delete had been lost
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); !errors.Is(err, ErrDeadLettered) {
			t.Fatal(err)
		}
		dls := deadLetters(t, h.l, "")
		if len(dls) != 1 || dls[0].InboxSeq != 2 {
			t.Fatalf("dead letters %+v; want one, from the second dead-lettering (inbox 2)", dls)
		}
	})
}

// TestCrashLoopsAreCounted: an event whose turn crashes its host every time
// is dead-lettered after MaxAttempts starts, counted durably across the
// crashes, without another start.
func TestCrashLoopsAreCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, nil)
		var mu sync.Mutex
		starts := 0
		crasher := func(h *testHost) Handler {
			return func(ctx context.Context, tr *Turn) error {
				mu.Lock()
				starts++
				mu.Unlock()
				h.crash()
				<-ctx.Done()
				return ctx.Err()
			}
		}
		c.hosts[0].setHandler(crasher(c.hosts[0]))
		ctx := context.Background()
		if _, err := c.hosts[0].l.Deliver(ctx, "s", msg("crash")); err != nil {
			t.Fatal(err)
		}
		for i := 1; ; i++ {
			synctest.Wait()
			h := c.add(fmt.Sprint("h", i), nil) // a replacement host
			h.setHandler(crasher(h))
			if _, err := h.l.Await(ctx, "s", "crash"); errors.Is(err, ErrDeadLettered) {
				break
			}
			if i > 10 {
				t.Fatal("the crash loop never stopped")
			}
		}
		if starts != DefaultMaxAttempts {
			t.Fatalf("the crashing turn started %d times; want %d", starts, DefaultMaxAttempts)
		}
		if dls := deadLetters(t, c.hosts[len(c.hosts)-1].l, "s"); len(dls) != 1 || dls[0].Attempts != 5 {
			t.Fatalf("dead letters %+v", dls)
		}
	})
}

// TestLateDeadLetterWriteCannotResurrect: a host froze while writing a dead
// letter, the event was dead-lettered by another host, replayed and
// committed, and left the de-duplication window; the frozen write landing
// now must not bring the dead letter back (it would be replayed and
// committed twice).
func TestLateDeadLetterWriteCannotResurrect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.RetryDelay = time.Millisecond; o.MaxAttempts = 1; o.DedupWindow = 2 })
		h := c.hosts[0]
		var mu sync.Mutex
		healed := false
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			mu.Lock()
			defer mu.Unlock()
			if !healed {
				return errors.New("broken")
			}
			return commitEcho(ctx, tr)
		})
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", msg("p")); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); !errors.Is(err, ErrDeadLettered) {
			t.Fatal(err)
		}
		key := c.w.mon.keys.dlq("s", "p", 1)
		data, _ := c.w.base.Get(ctx, key)
		original, err := decodeDeadLetter(data)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		healed = true
		mu.Unlock()
		if _, err := h.l.Replay(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b", "c"} { // p leaves the window of 2
			if _, err := h.l.Deliver(ctx, "s", msg(id)); err != nil {
				t.Fatal(err)
			}
			if _, err := h.l.Await(ctx, "s", id); err != nil {
				t.Fatal(err)
			}
		}
		// The frozen host's write lands now.
		if err := h.l.createDeadLetter(ctx, key, *original); err != nil {
			t.Fatal(err)
		}
		if dls := deadLetters(t, h.l, ""); len(dls) != 0 {
			t.Fatalf("a late write brought back %+v", dls)
		}
	})
}

// TestOldOpenDeadLetterIsNotCurrent: the record of a first dead-lettering
// stays open (its replay could not close it); the event is dead-lettered
// again, replayed and committed, and leaves the window. The old record
// must not be listed (a replay of it would commit the event twice).
func TestOldOpenDeadLetterIsNotCurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.RetryDelay = time.Millisecond; o.MaxAttempts = 1; o.DedupWindow = 2 })
		h := c.hosts[0]
		var mu sync.Mutex
		fails := 2 // the first two dead-letterings
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			mu.Lock()
			defer mu.Unlock()
			if tr.Event.ID == "p" && fails > 0 {
				fails--
				return errors.New("broken")
			}
			return commitEcho(ctx, tr)
		})
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", msg("p")); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); !errors.Is(err, ErrDeadLettered) {
			t.Fatal(err)
		}
		for range 3 { // the replay cannot close the first record
			h.store.planFault("put", "drop")
		}
		if _, err := h.l.Replay(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); !errors.Is(err, ErrDeadLettered) {
			t.Fatal(err)
		}
		if dls := deadLetters(t, h.l, ""); len(dls) != 1 || dls[0].InboxSeq != 2 {
			t.Fatalf("dead letters %+v; want the second dead-lettering only", dls)
		}
		if _, err := h.l.Replay(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b", "c"} { // p leaves the window of 2
			if _, err := h.l.Deliver(ctx, "s", msg(id)); err != nil {
				t.Fatal(err)
			}
			if _, err := h.l.Await(ctx, "s", id); err != nil {
				t.Fatal(err)
			}
		}
		if dls := deadLetters(t, h.l, ""); len(dls) != 0 {
			t.Fatalf("an old, superseded dead letter is listed: %+v", dls)
		}
	})
}

// TestPermanentErrorsAreDeadLetteredAtOnce: a Handler error wrapped with
// Permanent dead-letters its event after that one attempt, with that error
// as the last error; the session goes on, and an event delivered while
// the holder dead-letters (so the same runner takes it next) starts with
// no error of its own.
func TestPermanentErrorsAreDeadLetteredAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *cluster
		var once sync.Once
		c = newCluster(t, 2, func(o *Options) {
			o.RetryDelay = time.Millisecond
			if o.HostID != "h0" {
				return
			}
			o.test.step = func(name string) {
				if name == "deadletter:after-write" {
					once.Do(func() {
						if _, err := c.hosts[1].l.Deliver(context.Background(), "s", msg("later")); err != nil {
							t.Error(err)
						}
					})
				}
			}
		})
		h := c.hosts[0]
		var mu sync.Mutex
		attempts := map[string]int{}
		lastErrs := map[string]string{}
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			mu.Lock()
			attempts[tr.Event.ID]++
			lastErrs[tr.Event.ID] = tr.LastError
			mu.Unlock()
			if tr.Event.ID == "bad" {
				return Permanent(fmt.Errorf("event %q is not a message", tr.Event.ID))
			}
			return commitEcho(ctx, tr)
		})
		c.hosts[1].setHandler(h.handle)
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", msg("bad")); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "bad"); !errors.Is(err, ErrDeadLettered) {
			t.Fatalf("Await of the unreadable event: %v; want ErrDeadLettered", err)
		}
		dls := deadLetters(t, h.l, "s")
		if len(dls) != 1 || dls[0].EventID != "bad" || dls[0].Attempts != 1 || dls[0].LastError != `event "bad" is not a message` {
			t.Fatalf("dead letters %+v; want bad's, after 1 attempt, with its error", dls)
		}
		if got, err := h.l.Await(ctx, "s", "later"); err != nil || got.Seq != 1 {
			t.Fatalf("the later event: %+v %v; want committed as turn 1", got, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if attempts["bad"] != 1 || attempts["later"] != 1 || lastErrs["later"] != "" {
			t.Fatalf("attempts %v, last errors seen %q; want one each, and none for later", attempts, lastErrs)
		}
	})
}

// TestPermanentErrorAfterSelfFenceIsRetried: a Handler returning a
// PermanentError after its turn's context ended (here: self-fenced while
// the store was away) is tried again, not dead-lettered: the error may be
// the cancellation's.
func TestPermanentErrorAfterSelfFenceIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, func(o *Options) { o.RetryDelay = time.Millisecond })
		h, other := c.hosts[0], c.hosts[1]
		var mu sync.Mutex
		attempts := 0
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			mu.Lock()
			attempts++
			n := attempts
			mu.Unlock()
			if n == 1 {
				h.store.cut.set(time.Now().Add(h.l.Lease())) // shorter than lease + margin
				<-ctx.Done()
				time.Sleep(h.l.Lease()) // the store is back
				return Permanent(context.Cause(ctx))
			}
			return commitEcho(ctx, tr)
		})
		other.setHandler(h.handle)
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", msg("e")); err != nil {
			t.Fatal(err)
		}
		got, err := other.l.Await(ctx, "s", "e") // h's own store is away for a while
		if err != nil || got.Seq != 1 {
			t.Fatalf("Await: %+v %v; want committed as turn 1 on the second attempt", got, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if attempts != 2 || len(deadLetters(t, other.l, "")) != 0 {
			t.Fatalf("%d attempts, dead letters %+v; want 2 attempts and none", attempts, deadLetters(t, other.l, ""))
		}
	})
}
