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
	opts := Options{Store: db, Agent: "test", HostID: id, AllowProcessLocal: true, Lease: 3 * time.Second,
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

var _ = strings.Repeat
