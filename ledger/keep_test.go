package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// keyed is msg(id) as a keyed event (a client's Idempotency-Key).
func keyed(id string) Event {
	e := msg(id)
	e.Keyed = true
	return e
}

// send delivers ev through l and waits for its turn.
func send(t *testing.T, l *Ledger, sid string, ev Event) Committed {
	t.Helper()
	ctx := context.Background()
	if _, err := l.Deliver(ctx, sid, ev); err != nil {
		t.Fatalf("delivering %s: %v", ev.ID, err)
	}
	c, err := l.Await(ctx, sid, ev.ID)
	if err != nil {
		t.Fatalf("awaiting %s: %v", ev.ID, err)
	}
	return c
}

// keptKeys lists the ids with a kept key in the shared store.
func keptKeys(t *testing.T, c *cluster, sid string) []string {
	t.Helper()
	var ids []string
	for e, err := range c.w.base.List(context.Background(), c.w.mon.keys.keysPrefix(sid)) {
		if err != nil {
			t.Fatal(err)
		}
		k, err := decodeKeptKey(e.Value)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, k.EventID)
	}
	return ids
}

// TestKeyedRetryPastTheWindow: a keyed event retried after more than
// DedupWindow later messages is a duplicate, answered with the turn that
// consumed it, on the host that ran it and on one that never saw the
// session; Lookup finds it too. An unkeyed id past the window is a new
// event, as before; only keyed ids are kept.
func TestKeyedRetryPastTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, func(o *Options) { o.DedupWindow = 3 })
		a, b := c.hosts[0].l, c.hosts[1].l
		ctx := context.Background()
		for i := range 10 {
			send(t, a, "s", keyed(fmt.Sprint("k", i)))
		}
		for i := range 5 {
			send(t, a, "s", msg(fmt.Sprint("u", i)))
		}
		// k0..k9 have all left the window of 3 (u2..u4 are in it).
		if got := keptKeys(t, c, "s"); len(got) != 10 || got[0] != "k0" {
			t.Fatalf("kept keys %v; want k0..k9", got)
		}
		if ctl := c.w.mon.current("s"); ctl.Keys != 10 || ctl.KeysAt.IsZero() {
			t.Fatalf("the control record counts %d kept keys (oldest %v); want 10", ctl.Keys, ctl.KeysAt)
		}
		for _, l := range []*Ledger{a, b} {
			d, err := l.Deliver(ctx, "s", keyed("k1"))
			if err != nil || !d.Duplicate || d.State != StateCommitted || d.CommitSeq != 2 {
				t.Fatalf("retry of k1 via %s, 14 messages later: %+v %v; want a duplicate committed at 2", l.HostID(), d, err)
			}
			st, err := l.Lookup(ctx, "s", "k1")
			if err != nil || st.State != StateCommitted || st.CommitSeq != 2 {
				t.Fatalf("Lookup of k1 via %s: %+v %v; want committed at 2", l.HostID(), st, err)
			}
			if got, err := l.Await(ctx, "s", "k9"); err != nil || got.Seq != 10 {
				t.Fatalf("Await of k9 via %s: %+v %v; want turn 10", l.HostID(), got, err)
			}
		}
		if d, err := a.Deliver(ctx, "s", msg("u0")); err != nil || d.Duplicate {
			t.Fatalf("an unkeyed id past the window: %+v %v; want a new event", d, err)
		}
		if _, err := a.Await(ctx, "s", "u0"); err != nil {
			t.Fatal(err)
		}
		ids := eventIDs(transcript(t, b, "s"))
		if n := strings.Count(strings.Join(ids, " ")+" ", "k1 "); n != 1 || len(ids) != 16 {
			t.Fatalf("transcript %v; want 16 turns with k1 once", ids)
		}
	})
}

// TestKeptDeadLetterAndReplay: a keyed event dead-lettered and pushed out
// of the window is kept as dead-lettered; a replay keeps it keyed, and
// once consumed and pushed out again its kept key names its turn.
func TestKeptDeadLetterAndReplay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.DedupWindow = 1 })
		h := c.hosts[0]
		var mu sync.Mutex
		healed := false
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			mu.Lock()
			fail := tr.Event.ID == "p" && !healed
			mu.Unlock()
			if fail {
				return Permanent(errors.New("cannot read it"))
			}
			return commitEcho(ctx, tr)
		})
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", keyed("p")); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "p"); !errors.Is(err, ErrDeadLettered) {
			t.Fatalf("Await of the poison event: %v", err)
		}
		send(t, h.l, "s", keyed("k1")) // pushes p out of the window
		if d, err := h.l.Deliver(ctx, "s", keyed("p")); err != nil || !d.Duplicate || d.State != StateDeadLettered {
			t.Fatalf("retry of the dead-lettered p past the window: %+v %v; want a dead-lettered duplicate", d, err)
		}
		mu.Lock()
		healed = true
		mu.Unlock()
		if _, err := h.l.Replay(ctx, "s", "p"); err != nil {
			t.Fatal(err)
		}
		if ctl := c.w.mon.current("s"); len(ctl.Pending) == 1 && !ctl.Pending[0].Keyed {
			t.Fatalf("the replayed event lost its Keyed mark: %+v", ctl.Pending[0])
		}
		got, err := h.l.Await(ctx, "s", "p")
		if err != nil {
			t.Fatal(err)
		}
		send(t, h.l, "s", keyed("k2")) // pushes p out again
		d, err := h.l.Deliver(ctx, "s", keyed("p"))
		if err != nil || !d.Duplicate || d.State != StateCommitted || d.CommitSeq != got.Seq {
			t.Fatalf("retry of p after its replay committed as %d: %+v %v", got.Seq, d, err)
		}
	})
}

// TestKeptKeyWriteIsRetried: the put of a kept key that fails (dropped,
// or applied with its answer lost) is sent again, and the evicting commit
// waits for it: the turn commits once, the kept key is in the store (the
// monitor checks it is there before the id leaves the window).
func TestKeptKeyWriteIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.DedupWindow = 1 })
		h := c.hosts[0]
		var runs sync.Map
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			n, _ := runs.LoadOrStore(tr.Event.ID, new(int))
			*n.(*int)++
			return commitEcho(ctx, tr)
		})
		send(t, h.l, "s", keyed("k0"))
		for range 4 {
			h.store.planFault("put", "drop")
		}
		h.store.planFault("put", "lost")
		got := send(t, h.l, "s", keyed("k1"))
		if n, _ := runs.Load("k1"); got.Seq != 2 || *n.(*int) != 1 {
			t.Fatalf("k1 committed as %d after %d runs; want turn 2 after one run (the commit waits for its kept key)", got.Seq, *n.(*int))
		}
		if ids := keptKeys(t, c, "s"); len(ids) != 1 || ids[0] != "k0" {
			t.Fatalf("kept keys %v; want k0", ids)
		}
		if d, err := h.l.Deliver(context.Background(), "s", keyed("k0")); err != nil || !d.Duplicate || d.CommitSeq != 1 {
			t.Fatalf("retry of k0: %+v %v", d, err)
		}
	})
}

// TestMaxKeys: a session keeping MaxKeys kept keys refuses a new keyed
// event with a BusyError that names the limit and waits for the oldest to
// expire; nothing is queued. Retries of kept ids are still answered, and
// unkeyed events still queued. Once the keys expire and the janitor
// collects them, keyed events are taken again.
func TestMaxKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window, skew = time.Hour, time.Minute
		c := newCluster(t, 1, func(o *Options) {
			o.DedupWindow, o.MaxKeys, o.IdempotencyWindow, o.ClockSkew = 1, 2, window, skew
		})
		h := c.hosts[0]
		ctx := context.Background()
		for _, id := range []string{"k0", "k1", "k2"} {
			send(t, h.l, "s", keyed(id))
		}
		_, err := h.l.Deliver(ctx, "s", keyed("k3"))
		var busy *BusyError
		if !errors.As(err, &busy) || !errors.Is(err, ErrBusy) || busy.Keys != 2 {
			t.Fatalf("a keyed event with 2 kept keys and MaxKeys 2: %v; want a BusyError with Keys 2", err)
		}
		if lo := window + skew; busy.RetryAfter < lo || busy.RetryAfter > lo+time.Minute {
			t.Fatalf("RetryAfter %v; want about the window and the skew, %v", busy.RetryAfter, lo)
		}
		if msg := err.Error(); !strings.Contains(msg, "2 idempotency keys") || !strings.Contains(msg, "MaxKeys") {
			t.Fatalf("the refusal says %q; want the limit named", msg)
		}
		if _, err := h.l.Lookup(ctx, "s", "k3"); !errors.Is(err, ErrUnknownEvent) {
			t.Fatalf("the refused event is known to the session: %v", err)
		}
		if d, err := h.l.Deliver(ctx, "s", keyed("k0")); err != nil || !d.Duplicate {
			t.Fatalf("a retry of a kept key at the limit: %+v %v; want a duplicate", d, err)
		}
		send(t, h.l, "s", msg("u0")) // unkeyed: not limited (it pushes k2 out: 3 kept)
		time.Sleep(window + skew)
		synctest.Wait()
		if _, err := h.l.Deliver(ctx, "s", keyed("k3")); !errors.Is(err, ErrBusy) {
			t.Fatalf("k3 before the janitor could collect: %v; want still busy", err)
		}
		time.Sleep(3 * h.l.opts.JanitorInterval) // a scan or two
		synctest.Wait()
		if ids := keptKeys(t, c, "s"); len(ids) != 0 {
			t.Fatalf("kept keys after the window: %v", ids)
		}
		if ctl := c.w.mon.current("s"); ctl.Keys != 0 || !ctl.KeysAt.IsZero() {
			t.Fatalf("the control record counts %d kept keys (oldest %v) after the collection", ctl.Keys, ctl.KeysAt)
		}
		send(t, h.l, "s", keyed("k3"))
	})
}

// TestKeptKeysExpireOnTime: a kept key is deleted IdempotencyWindow after
// it was written, not before, even by a host whose wall clock runs ahead
// of the writer's by ClockSkew; after that a retry is a new event.
func TestKeptKeysExpireOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window, skew = time.Minute, 10 * time.Second
		tweak := func(o *Options) { o.DedupWindow, o.IdempotencyWindow, o.ClockSkew = 1, window, skew }
		c := newCluster(t, 1, tweak)
		c.add("fast", func(o *Options) {
			tweak(o)
			o.test.now = func() time.Time { return time.Now().Add(skew) }
		})
		a := c.hosts[0].l
		ctx := context.Background()
		send(t, a, "s", keyed("k0"))
		send(t, a, "s", keyed("k1")) // k0 leaves the window: kept
		data, err := c.w.base.Get(ctx, c.w.mon.keys.kept("s", "k0"))
		if err != nil {
			t.Fatal(err)
		}
		k, _ := decodeKeptKey(data)
		time.Sleep(time.Until(k.At.Add(window - time.Second)))
		synctest.Wait()
		if ids := keptKeys(t, c, "s"); len(ids) != 1 {
			t.Fatalf("a second before the window ends the kept keys are %v; want k0", ids)
		}
		if d, err := a.Deliver(ctx, "s", keyed("k0")); err != nil || !d.Duplicate || d.CommitSeq != 1 {
			t.Fatalf("retry of k0 inside the window: %+v %v", d, err)
		}
		time.Sleep(time.Second + 3*a.opts.JanitorInterval)
		synctest.Wait()
		if ids := keptKeys(t, c, "s"); len(ids) != 0 {
			t.Fatalf("the window and the janitor's scans have passed, and the kept keys are %v", ids)
		}
		d, err := a.Deliver(ctx, "s", keyed("k0"))
		if err != nil || d.Duplicate {
			t.Fatalf("retry of k0 after the window: %+v %v; want a new event", d, err)
		}
		if got, err := a.Await(ctx, "s", "k0"); err != nil || got.Seq != 3 {
			t.Fatalf("the new k0: %+v %v; want turn 3", got, err)
		}
	})
}

// TestCollectionCountsAgainSafely: a collection that another collection
// overtook (and after it an evicting commit) leaves the count as the
// other made it, so the kept key the commit wrote is still read and its
// retry is a duplicate.
func TestCollectionCountsAgainSafely(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window, skew = time.Minute, time.Second
		tweak := func(o *Options) {
			o.DedupWindow, o.IdempotencyWindow, o.ClockSkew = 1, window, skew
			o.JanitorInterval = 24 * time.Hour // the test collects by hand
		}
		c := newCluster(t, 0, nil)
		var once sync.Once
		var b *testHost
		a := c.add("a", func(o *Options) {
			tweak(o)
			o.test.step = func(name string) {
				if name != "keys:delete" {
					return
				}
				once.Do(func() {
					// Between a's listing and its count: b collects too,
					// then a commit pushes k2 out of the window.
					if err := b.l.collectKeys(context.Background(), "s"); err != nil {
						t.Error(err)
					}
					send(t, b.l, "s", keyed("k3"))
				})
			}
		})
		b = c.add("b", tweak)
		ctx := context.Background()
		for _, id := range []string{"k0", "k1", "k2"} {
			send(t, a.l, "s", keyed(id))
		}
		time.Sleep(window + skew + time.Second) // k0 and k1 expire
		if err := a.l.collectKeys(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		ctl := c.w.mon.current("s")
		if ids := keptKeys(t, c, "s"); len(ids) != 1 || ids[0] != "k2" || ctl.Keys != 1 {
			t.Fatalf("kept keys %v, counted %d; want k2, counted once", ids, ctl.Keys)
		}
		if d, err := a.l.Deliver(ctx, "s", keyed("k2")); err != nil || !d.Duplicate || d.CommitSeq != 3 {
			t.Fatalf("retry of k2: %+v %v; want a duplicate committed at 3", d, err)
		}
	})
}

// TestDeleteForgetsKeptKeys: deleting a session deletes its kept keys.
func TestDeleteForgetsKeptKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.DedupWindow = 1 })
		l := c.hosts[0].l
		for _, id := range []string{"k0", "k1", "k2"} {
			send(t, l, "s", keyed(id))
		}
		if ids := keptKeys(t, c, "s"); len(ids) != 2 {
			t.Fatalf("kept keys %v", ids)
		}
		if err := l.Delete(context.Background(), "s"); err != nil {
			t.Fatal(err)
		}
		if ids := keptKeys(t, c, "s"); len(ids) != 0 {
			t.Fatalf("kept keys of a deleted session: %v", ids)
		}
	})
}

// TestKeyedDeliveryCost: an unkeyed delivery to a session this host served
// last is one compare-and-set and nothing else, kept keys or not; a keyed
// one reads its kept key first once the session keeps any, and not
// before.
func TestKeyedDeliveryCost(t *testing.T) {
	counting := newCountingDB(memkv.New())
	db, err := kv.New("counting", counting)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{}, 1)
	l, err := Open(Options{Store: db, Agent: "cost", Logger: quietLogger(), Tuning: Tuning{DedupWindow: 2},
		Handler: func(ctx context.Context, tr *Turn) error {
			_, err := tr.Commit(ctx, []json.RawMessage{json.RawMessage(`{}`)})
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	// The worker waits for proceed before its turn, so the calls counted
	// when Deliver returns are the acknowledgement's own, not also those
	// of the turn the worker runs meanwhile on a loaded machine.
	proceed := make(chan struct{})
	l.opts.test.step = func(name string) {
		switch name {
		case "turn:start":
			<-proceed
		case "release:after-write":
			released <- struct{}{}
		}
	}
	ctx := context.Background()
	deliver := func(ev Event) map[string]int {
		t.Helper()
		counting.reset()
		if _, err := l.Deliver(ctx, "s", ev); err != nil {
			t.Fatal(err)
		}
		calls := counting.snapshot()
		proceed <- struct{}{}
		<-released
		return calls
	}
	one := func(got map[string]int, want map[string]int, what string) {
		t.Helper()
		for _, op := range []string{"get", "cas", "put", "delete", "list"} {
			if got[op] != want[op] {
				t.Fatalf("%s made the store calls %v; want %v", what, got, want)
			}
		}
	}
	deliver(msg("first")) // the record is cached from here on
	one(deliver(keyed("k0")), map[string]int{"cas": 1}, "a keyed delivery to a session keeping no kept key")
	deliver(keyed("k1"))
	deliver(keyed("k2")) // its commit pushes k0 out: kept
	one(deliver(msg("u0")), map[string]int{"cas": 1}, "an unkeyed delivery to a session keeping kept keys")
	one(deliver(keyed("k3")), map[string]int{"get": 1, "cas": 1}, "a keyed delivery to a session keeping kept keys")
}

// TestIdempotencySettings: the defaults, and a negative MaxKeys refused by
// name.
func TestIdempotencySettings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, nil)
		st := c.hosts[0].l.Settings()
		if st.IdempotencyWindow != DefaultIdempotencyWindow || st.ClockSkew != DefaultClockSkew || st.MaxKeys != DefaultMaxKeys {
			t.Fatalf("settings %+v; want the idempotency defaults", st.Tuning)
		}
		_, err := Open(Options{Store: memkv.New(), Agent: "a", AllowProcessLocal: true, Passive: true, Tuning: Tuning{MaxKeys: -1}})
		if err == nil || !strings.Contains(err.Error(), "MaxKeys") {
			t.Fatalf("MaxKeys -1: %v; want an error naming MaxKeys", err)
		}
	})
}
