package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/keys"
)

// TestSweepDeletesOrphansOnly: the sweep deletes payload blobs no record
// references once they are two epochs old, and turn outputs that can
// never be or no longer are referenced; it keeps everything a record
// references or may still reference.
func TestSweepDeletesOrphansOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.SweepEvery = time.Hour })
		l := c.hosts[0].l
		ctx := context.Background()
		k := c.w.mon.keys
		if _, err := l.Deliver(ctx, "s", msg("e1")); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Await(ctx, "s", "e1"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		put := func(key string) {
			if err := c.w.base.Put(ctx, key, []byte(`{"v":1}`)); err != nil {
				t.Fatal(err)
			}
		}
		orphan := k.blob("s", blobRef(0, "deadbeef")) // a deliverer died after its blob
		stale := k.out("s", outRef(2, 1, "zombie"))   // a fenced holder's output, generation 1 of 1, not committed
		decided := k.out("s", outRef(1, 1, "loser"))  // an attempt at turn 1, which is decided
		future := k.out("s", outRef(2, 2, "next"))    // the next generation's output: keep
		young := k.blob("s", blobRef(1, "cafe"))      // written at epoch 1 by a delivery under way: keep
		for _, key := range []string{orphan, stale, decided, future, young} {
			put(key)
		}
		sweep := func() {
			cur := c.w.mon.current("s")
			if err := l.sweep(ctx, cur); err != nil {
				t.Fatal(err)
			}
		}
		exists := func(key string) bool { return c.w.mon.base.has(key) }
		sweep() // epoch 0 -> 1: deletes blobs of epoch -1 and older: none
		if !exists(orphan) || !exists(young) {
			t.Fatal("the first sweep deleted a blob younger than two epochs")
		}
		if exists(stale) || exists(decided) || !exists(future) {
			t.Fatalf("outputs after the sweep: stale %v decided %v future %v; want only the future one", exists(stale), exists(decided), exists(future))
		}
		sweep() // epoch 1 -> 2: deletes epoch 0
		if exists(orphan) || !exists(young) {
			t.Fatalf("after the second sweep: orphan %v, young %v; want the orphan gone, the young blob kept", exists(orphan), exists(young))
		}
		if cur := c.w.mon.current("s"); cur.Epoch != 2 || cur.Swept != cur.Commit {
			t.Fatalf("record after two sweeps: epoch %d, swept %d, commit %d", cur.Epoch, cur.Swept, cur.Commit)
		}
	})
}

// TestDeliveryRacingTheSweep: two sweeps run while a delivery's blob is
// written but not yet appended, so the blob is taken; the delivery's
// append sees the epoch moved on, refuses to reference the old blob,
// writes it again and appends. No record ever references a missing blob
// (I5, checked by the monitor).
func TestDeliveryRacingTheSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *cluster
		var once sync.Once
		c = newCluster(t, 2, func(o *Options) {
			o.InlineLimit = 8
			o.SweepEvery = time.Hour
			if o.HostID != "h0" {
				return
			}
			o.test.step = func(name string) {
				if name != "deliver:before-write" {
					return
				}
				cur := c.w.mon.current("s")
				if cur == nil || cur.Commit == 0 || len(cur.Pending) > 0 {
					return
				}
				once.Do(func() {
					for range 2 {
						if err := c.hosts[1].l.sweep(context.Background(), c.w.mon.current("s")); err != nil {
							t.Error(err)
						}
					}
				})
			}
		})
		a := c.hosts[0]
		ctx := context.Background()
		big := func(id string) Event {
			return Event{ID: id, Payload: json.RawMessage(fmt.Sprintf(`{"text":%q}`, strings.Repeat(id, 20)))}
		}
		if _, err := a.l.Deliver(ctx, "s", big("a")); err != nil {
			t.Fatal(err)
		}
		if _, err := a.l.Await(ctx, "s", "a"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if _, err := a.l.Deliver(ctx, "s", big("b")); err != nil {
			t.Fatal(err)
		}
		got, err := a.l.Await(ctx, "s", "b")
		if err != nil {
			t.Fatal(err)
		}
		if string(got.Output[0]) != string(big("b").Payload) {
			t.Fatalf("the event's payload came back as %s", got.Output[0])
		}
		if cur := c.w.mon.current("s"); cur.Epoch != 2 {
			t.Fatalf("epoch %d; want the two sweeps to have run during the delivery", cur.Epoch)
		}
	})
}

// TestJanitorRateLimit: the janitor takes sessions over at most
// TakeoverRate per second (bursts of one second's worth).
func TestJanitorRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c *cluster
		var mu sync.Mutex
		var took []time.Duration
		start := time.Now()
		c = newCluster(t, 0, nil)
		// Ten sessions, each with an event pending and no holder (as a
		// host's Close leaves them).
		scope, _ := keys.Agent("test")
		k := newLayout(scope)
		for i := range 10 {
			sid := fmt.Sprint("s", i)
			ctl := &control{Version: FormatVersion, Session: sid, NextSeq: 2, Gen: 1, Write: "x",
				Pending: []entry{{Seq: 1, ID: "e", Inline: json.RawMessage(`1`), Size: 1}}}
			if err := c.w.base.Put(context.Background(), k.ctl(sid), mustJSON(ctl)); err != nil {
				t.Fatal(err)
			}
		}
		// The handler is the host's from its start: its janitor may take
		// the first sessions over before add returns.
		c.add("h0", func(o *Options) {
			o.TakeoverRate = 2
			o.Handler = func(ctx context.Context, tr *Turn) error {
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
				return commitEcho(ctx, tr)
			}
		})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(took) != 10 {
			t.Fatalf("%d sessions taken over; want 10", len(took))
		}
		slices.Sort(took)
		// Two at once (the burst), then one every half second.
		if took[9] < 4*time.Second {
			t.Fatalf("the tenth takeover came after %s; at 2 per second it cannot come before 4s", took[9])
		}
		if took[1] > time.Second {
			t.Fatalf("the burst was not used: second takeover after %s", took[1])
		}
	})
}

// TestJanitorJitter: the pauses between scans vary between half and one and
// a half JanitorInterval, so janitors of hosts started together drift apart.
func TestJanitorJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var scans []time.Time
		c := newCluster(t, 0, nil)
		h := c.add("h0", func(o *Options) {
			o.JanitorInterval = time.Second
			o.test.step = func(name string) {
				if name == "janitor:scan" {
					mu.Lock()
					scans = append(scans, time.Now())
					mu.Unlock()
				}
			}
		})
		time.Sleep(60 * time.Second)
		synctest.Wait()
		h.stop()
		<-h.done
		mu.Lock()
		defer mu.Unlock()
		if len(scans) < 40 {
			t.Fatalf("%d scans in 60s with a 1s interval", len(scans))
		}
		gaps := map[time.Duration]bool{}
		for i := 1; i < len(scans); i++ {
			g := scans[i].Sub(scans[i-1])
			if g < 500*time.Millisecond || g > 1500*time.Millisecond {
				t.Fatalf("a pause of %s between scans; want 0.5s to 1.5s", g)
			}
			gaps[g] = true
		}
		if len(gaps) < len(scans)/2 {
			t.Fatalf("only %d distinct pauses in %d scans: no jitter", len(gaps), len(scans))
		}
	})
}

// sweepTwice runs two sweeps of session s from l with seen, the idle record
// the janitor read before the session moved on, and reports whether they
// went ahead: the blob epoch moved, or an orphan blob of epoch 0 (which two
// sweeps of an idle session delete) is gone.
func sweepTwice(t *testing.T, c *cluster, l *Ledger, seen *control, orphan string) (epochBefore, epochAfter uint64, orphanKept bool) {
	t.Helper()
	epochBefore = c.w.mon.current("s").Epoch
	for range 2 {
		if err := l.sweep(context.Background(), seen); err != nil {
			t.Error(err)
		}
	}
	return epochBefore, c.w.mon.current("s").Epoch, c.w.mon.base.has(orphan)
}

// idleSession commits one turn on h0 and returns the session's record once
// it is idle (no holder, nothing pending, a turn since the last sweep: what
// the janitor sweeps), with an orphan blob of epoch 0 planted beside it.
func idleSession(t *testing.T, c *cluster) (idle *control, orphan string) {
	t.Helper()
	ctx := context.Background()
	a := c.hosts[0]
	if _, err := a.l.Deliver(ctx, "s", msg("e1")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.l.Await(ctx, "s", "e1"); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	idle = c.w.mon.current("s")
	if idle.Holder != "" || len(idle.Pending) > 0 || idle.Commit <= idle.Swept {
		t.Fatalf("set-up: the record is not idle with a turn to sweep: holder %q, %d pending, commit %d, swept %d", idle.Holder, len(idle.Pending), idle.Commit, idle.Swept)
	}
	orphan = c.w.mon.keys.blob("s", blobRef(0, "deadbeef"))
	if err := c.w.base.Put(ctx, orphan, []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	// Two sweeps of an idle session take this orphan: that is what the
	// tests below check does not happen once the session is busy.
	return idle, orphan
}

// TestSweepSkipsASessionWithALiveHolder: the janitor read a session idle,
// then a host took it (a delivery took the lease and committed a turn);
// the sweep's compare-and-set sees the holder and gives up: the blob epoch
// stays and nothing is deleted, even with no message pending.
func TestSweepSkipsASessionWithALiveHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type result struct {
			holder        string
			before, after uint64
			kept          bool
		}
		var c *cluster
		var once sync.Once
		var armed atomic.Pointer[control] // the idle record, once e1 is done
		var orphan atomic.Value
		results := make(chan result, 1)
		c = newCluster(t, 2, func(o *Options) {
			o.SweepEvery = time.Hour
			o.JanitorInterval = time.Hour
			if o.HostID != "h0" {
				return
			}
			o.test.step = func(name string) {
				// Between the commit of e2 and the release: h0 holds the
				// session and its inbox is empty.
				idle := armed.Load()
				if name != "flush" || idle == nil {
					return
				}
				cur := c.w.mon.current("s")
				if cur == nil || cur.Holder != "h0" || len(cur.Pending) > 0 || cur.LastTurn == idle.LastTurn {
					return
				}
				once.Do(func() {
					before, after, kept := sweepTwice(t, c, c.hosts[1].l, idle, orphan.Load().(string))
					results <- result{cur.Holder, before, after, kept}
				})
			}
		})
		idle, o := idleSession(t, c)
		orphan.Store(o)
		armed.Store(idle)
		ctx := context.Background()
		if _, err := c.hosts[0].l.Deliver(ctx, "s", msg("e2")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.hosts[0].l.Await(ctx, "s", "e2"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // h0 flushed and released
		var r result
		select {
		case r = <-results:
		default:
			t.Fatal("set-up: h0 never flushed e2's turn while holding the session with an empty inbox")
		}
		if r.after != r.before {
			t.Errorf("the sweep moved the blob epoch from %d to %d while %s held the session", r.before, r.after, r.holder)
		}
		if !r.kept {
			t.Errorf("the sweep deleted an orphan blob while %s held the session", r.holder)
		}
	})
}

// TestSweepSkipsASessionWithPendingMessages: the janitor read a session
// idle; then a message was delivered and its host shut down, handing the
// session off with the message still queued and no holder. The sweep's
// compare-and-set sees the pending message and gives up: the blob epoch
// stays and nothing is deleted. The next host takes the message over and
// answers it.
func TestSweepSkipsASessionWithPendingMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, func(o *Options) {
			o.SweepEvery = time.Hour
			o.JanitorInterval = time.Hour
		})
		idle, orphan := idleSession(t, c)
		ctx := context.Background()
		a, b := c.hosts[0], c.hosts[1]
		// h0 starts e2's turn and holds it until it is closing; e3 waits
		// behind it, and the close hands the session off with e3 queued.
		started, finish := make(chan struct{}), make(chan struct{})
		a.setHandler(func(ctx context.Context, tr *Turn) error {
			if tr.Event.ID == "e2" {
				close(started)
				<-finish
			}
			return commitEcho(ctx, tr)
		})
		for _, id := range []string{"e2", "e3"} {
			if _, err := a.l.Deliver(ctx, "s", msg(id)); err != nil {
				t.Fatal(err)
			}
		}
		<-started
		closed := make(chan error, 1)
		go func() { closed <- a.l.Close(ctx) }()
		synctest.Wait()
		close(finish)
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		cur := c.w.mon.current("s")
		if cur.Holder != "" || len(cur.Pending) != 1 || cur.Pending[0].ID != "e3" {
			t.Fatalf("set-up: after h0's close the record has holder %q and %d pending; want no holder and e3 pending", cur.Holder, len(cur.Pending))
		}
		before, after, kept := sweepTwice(t, c, b.l, idle, orphan)
		if after != before {
			t.Errorf("the sweep moved the blob epoch from %d to %d with a message pending", before, after)
		}
		if !kept {
			t.Error("the sweep deleted an orphan blob with a message pending")
		}
		// The session still serves: h1 takes e3 over.
		if err := b.l.takeOver(ctx, c.w.mon.current("s")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.l.Await(ctx, "s", "e3"); err != nil {
			t.Fatal(err)
		}
	})
}
