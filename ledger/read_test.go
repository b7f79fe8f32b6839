package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestTranscriptPagesAndFollow: the committed transcript is read in pages
// through any host, each turn naming the events it consumed; Follow on a
// host that does not hold the session yields turns as they are committed
// elsewhere.
func TestTranscriptPagesAndFollow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, func(o *Options) { o.FollowInterval = 300 * time.Millisecond })
		a, b := c.hosts[0], c.hosts[1]
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var followed []string
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Follow needs the session to exist; wait for the first event.
			for {
				if _, err := b.l.Lookup(ctx, "s", "e0"); err == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			for turn, err := range b.l.Follow(ctx, "s", 0) {
				if err != nil {
					t.Error(err)
					return
				}
				followed = append(followed, turn.EventIDs...)
				if len(followed) == 7 {
					return
				}
			}
		}()
		for i := range 7 {
			if _, err := a.l.Deliver(ctx, "s", msg(fmt.Sprint("e", i))); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		}
		<-done
		want := []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6"}
		if !slices.Equal(followed, want) {
			t.Fatalf("b followed %v; want %v", followed, want)
		}
		var paged []string
		var pages int
		for after := uint64(0); ; pages++ {
			p, err := b.l.Transcript(ctx, "s", after, 3)
			if err != nil {
				t.Fatal(err)
			}
			for i, tr := range p.Turns {
				if tr.Seq != after+uint64(i)+1 {
					t.Fatalf("page after %d: turn %d has seq %d", after, i, tr.Seq)
				}
				paged = append(paged, tr.EventIDs...)
			}
			if p.Head != 7 {
				t.Fatalf("page head %d; want 7", p.Head)
			}
			after = p.Next
			if !p.More {
				break
			}
		}
		if !slices.Equal(paged, want) || pages != 2 {
			t.Fatalf("pages of 3 gave %v in %d further pages; want %v in 2", paged, pages, want)
		}
		if p, err := b.l.Transcript(ctx, "s", 7, 3); err != nil || len(p.Turns) != 0 || p.More || p.Next != 7 {
			t.Fatalf("page after the last turn: %+v %v", p, err)
		}
		st, err := b.l.Lookup(ctx, "s", "e4")
		if err != nil || st.State != StateCommitted || st.CommitSeq != 5 {
			t.Fatalf("Lookup e4: %+v %v; want committed in turn 5", st, err)
		}
		turn, err := b.l.Turn(ctx, "s", st.CommitSeq)
		if err != nil || !slices.Equal(turn.EventIDs, []string{"e4"}) {
			t.Fatalf("Turn 5: %+v %v", turn, err)
		}
		if _, err := b.l.Transcript(ctx, "nope", 0, 0); !errors.Is(err, ErrUnknownSession) {
			t.Fatalf("transcript of an unknown session: %v", err)
		}
	})
}

// TestDeleteIsAFencedTombstone: deleting a session while its holder runs a
// turn fences the holder (its commit fails with ErrDeleted), refuses later
// deliveries, reads, and lists the discarded events; every key of the
// session but the tombstone is deleted.
func TestDeleteIsAFencedTombstone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, nil)
		a, b := c.hosts[0], c.hosts[1]
		ctx := context.Background()
		started, release := make(chan struct{}), make(chan struct{})
		var commitErr error
		a.setHandler(func(ctx context.Context, tr *Turn) error {
			if tr.Event.ID != "running" {
				return commitEcho(ctx, tr)
			}
			close(started)
			<-release
			_, commitErr = tr.Commit(context.WithoutCancel(ctx), []json.RawMessage{tr.Event.Payload})
			return commitErr
		})
		if _, err := a.l.Deliver(ctx, "s", msg("done")); err != nil {
			t.Fatal(err)
		}
		if _, err := a.l.Await(ctx, "s", "done"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.l.Deliver(ctx, "s", msg("running")); err != nil {
			t.Fatal(err)
		}
		<-started
		if _, err := b.l.Deliver(ctx, "s", msg("queued")); err != nil {
			t.Fatal(err)
		}
		if err := b.l.Delete(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		close(release)
		synctest.Wait()
		if !errors.Is(commitErr, ErrDeleted) || !errors.Is(commitErr, ErrFenced) {
			t.Fatalf("the holder's commit after the deletion returned %v; want ErrFenced and ErrDeleted", commitErr)
		}
		if _, err := a.l.Deliver(ctx, "s", msg("after")); !errors.Is(err, ErrDeleted) {
			t.Fatalf("delivery to a deleted session: %v; want ErrDeleted", err)
		}
		if _, err := a.l.Transcript(ctx, "s", 0, 0); !errors.Is(err, ErrDeleted) {
			t.Fatalf("transcript of a deleted session: %v; want ErrDeleted", err)
		}
		if err := a.l.Delete(ctx, "s"); err != nil {
			t.Fatalf("deleting again: %v; want nil", err)
		}
		if err := a.l.Delete(ctx, "never"); !errors.Is(err, ErrUnknownSession) {
			t.Fatalf("deleting an unknown session: %v; want ErrUnknownSession", err)
		}
		cur := c.w.mon.current("s")
		if cur.Deleted == nil || !cur.Deleted.Purged || !slices.Equal(cur.Deleted.Discarded, []string{"running", "queued"}) {
			t.Fatalf("tombstone %+v; want purged, discarding running and queued", cur.Deleted)
		}
		var left []string
		for k := range c.w.base.ListKeys(ctx, c.w.mon.keys.root) {
			if !strings.HasPrefix(k, c.w.mon.keys.ctlPrefix()) {
				left = append(left, k)
			}
		}
		if len(left) > 0 {
			t.Fatalf("keys left after the deletion: %v", left)
		}
		if info := sessionInfo(t, b.l, "s"); !info.Deleted {
			t.Fatalf("the session list shows %+v; want the tombstone", info)
		}
	})
}

// TestIdempotencyKeys: a turn's side-effect keys are
// {sessionId}/{commitSeq}/{n}, the same for every attempt of the turn.
func TestIdempotencyKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.RetryDelay = time.Millisecond })
		h := c.hosts[0]
		var keys []string
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			keys = append(keys, tr.IdempotencyKey(0)+" "+tr.IdempotencyKey(1))
			if tr.Attempt < 2 {
				return errors.New("the model is down")
			}
			return commitEcho(ctx, tr)
		})
		ctx := context.Background()
		for _, id := range []string{"a", "b"} {
			if _, err := h.l.Deliver(ctx, "sess-1", msg(id)); err != nil {
				t.Fatal(err)
			}
			if _, err := h.l.Await(ctx, "sess-1", id); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"sess-1/1/0 sess-1/1/1", "sess-1/1/0 sess-1/1/1", "sess-1/2/0 sess-1/2/1", "sess-1/2/0 sess-1/2/1"}
		if !slices.Equal(keys, want) {
			t.Fatalf("keys per attempt %q; want %q", keys, want)
		}
	})
}

// TestFailedAttempts: a handler error, a panic, or a return without a
// commit is a failed attempt: the event is tried again, the error is
// recorded, and the host goes on.
func TestFailedAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.RetryDelay = time.Millisecond })
		h := c.hosts[0]
		var seen []string
		h.setHandler(func(ctx context.Context, tr *Turn) error {
			seen = append(seen, fmt.Sprintf("%d:%s", tr.Attempt, tr.LastError))
			switch tr.Attempt {
			case 1:
				return errors.New("boom")
			case 2:
				panic("kaboom")
			case 3:
				return nil // forgot to commit
			}
			return commitEcho(ctx, tr)
		})
		ctx := context.Background()
		if _, err := h.l.Deliver(ctx, "s", msg("e")); err != nil {
			t.Fatal(err)
		}
		if _, err := h.l.Await(ctx, "s", "e"); err != nil {
			t.Fatal(err)
		}
		if len(seen) != 4 || seen[0] != "1:" || !strings.HasPrefix(seen[1], "2:boom") ||
			!strings.HasPrefix(seen[2], "3:handler panicked: kaboom") || !strings.HasPrefix(seen[3], "4:the handler returned without committing") {
			t.Fatalf("attempts saw %q", seen)
		}
	})
}

// TestNewerFormatIsRefused: records written by a newer agentkit (a higher
// format version) are refused with ErrFormat, never misread or
// overwritten.
func TestNewerFormatIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, nil)
		l := c.hosts[0].l
		ctx := context.Background()
		key := c.w.mon.keys.ctl("s")
		future := []byte(`{"v":2,"session":"s","gen":9,"pending":[{"seq":1,"id":"x","size":1}]}`)
		if err := c.w.base.Put(ctx, key, future); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Deliver(ctx, "s", msg("e")); !errors.Is(err, ErrFormat) {
			t.Fatalf("Deliver over a newer record: %v; want ErrFormat", err)
		}
		if _, err := l.Transcript(ctx, "s", 0, 0); !errors.Is(err, ErrFormat) {
			t.Fatalf("Transcript of a newer record: %v; want ErrFormat", err)
		}
		if got, _ := c.w.base.Get(ctx, key); string(got) != string(future) {
			t.Fatalf("the newer record was overwritten: %s", got)
		}
		for _, bad := range []string{`{"session":"s"}`, `not json`} {
			if _, err := decodeControl([]byte(bad)); !errors.Is(err, ErrFormat) {
				t.Errorf("decoding %s: %v; want ErrFormat", bad, err)
			}
		}
	})
}

// TestInvalidDeliveries: bad arguments get clear errors and nothing is
// written.
func TestInvalidDeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, func(o *Options) { o.MaxEventBytes = 100 })
		l := c.hosts[0].l
		ctx := context.Background()
		for _, tc := range []struct {
			sid  string
			ev   Event
			want string
		}{
			{"", msg("e"), "session id is empty"},
			{"s", Event{Payload: json.RawMessage(`1`)}, "event id is empty"},
			{"s", Event{ID: strings.Repeat("i", MaxEventIDBytes+1), Payload: json.RawMessage(`1`)}, "event id is 257 bytes"},
			{"s", Event{ID: "e", Payload: json.RawMessage(`"` + strings.Repeat("p", 100) + `"`)}, "payload is 102 bytes"},
			{"s", Event{ID: "e", Payload: json.RawMessage(`{not json`)}, "must be a JSON value"},
			{"s", Event{ID: "e"}, "must be a JSON value"},
		} {
			if _, err := l.Deliver(ctx, tc.sid, tc.ev); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Deliver(%q, %.20q): %v; want an error containing %q", tc.sid, tc.ev.ID, err, tc.want)
			}
		}
		for range c.w.base.ListKeys(ctx, "") {
			t.Fatal("a refused delivery wrote to the store")
		}
	})
}

// TestPassiveLedger: a passive ledger (for tools) delivers and replays
// without taking leases; a serving host's janitor picks the session up at
// its next scan.
func TestPassiveLedger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 1, nil)
		tool := c.add("tool", func(o *Options) { o.Passive = true; o.Handler = nil })
		ctx := context.Background()
		d, err := tool.l.Deliver(ctx, "s", msg("e"))
		if err != nil {
			t.Fatal(err)
		}
		if d.Acquired || d.Local || d.Holder != "" {
			t.Fatalf("a passive delivery: %+v; want queued with no holder", d)
		}
		start := time.Now()
		got, err := tool.l.Await(ctx, "s", "e")
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder != "h0" {
			t.Fatalf("the turn ran on %s; want the serving host", got.Holder)
		}
		// At most one jittered janitor interval, and Await on a host that
		// does not hold the session sees the commit within FollowInterval.
		o := c.hosts[0].l.opts
		if waited := time.Since(start); waited > o.JanitorInterval*3/2+tool.l.opts.FollowInterval {
			t.Fatalf("the serving host took %s to pick it up; want one janitor interval", waited)
		}
		if st := tool.l.Stats(); st.LeasesHeld != 0 || st.Acquired != 0 || st.Takeovers != 0 {
			t.Fatalf("the passive ledger's stats: %+v", st)
		}
	})
}
