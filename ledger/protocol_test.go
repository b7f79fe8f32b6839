package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/kv"
)

// TestProtocolOnRealStores runs the protocol, with real time, on
// PostgreSQL, Redis, NATS and SQLite: three hosts (each with its own
// client of the store) serve six sessions while four clients send events
// through random hosts and retry with the same id; one host is killed and
// another frozen for longer than the lease. Afterwards every host reads
// the same gap-free transcripts, each turn computed from exactly the
// committed turns before it (I6), and every acknowledged event is in
// exactly one committed turn (I1).
func TestProtocolOnRealStores(t *testing.T) {
	if testing.Short() {
		t.Skip("runs against the real servers")
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			runProtocol(t, b.make(t))
		})
	}
}

type protoHost struct {
	l      *Ledger
	g      *gate
	cancel context.CancelFunc
	done   chan struct{}
	dead   bool
}

func runProtocol(t *testing.T, be backend) {
	const nHosts, nSessions, nClients, perClient = 3, 6, 4, 30
	lease := time.Second
	agent := "ledger-proto-" + randomSuffix()
	hosts := make([]*protoHost, nHosts)
	var hostsMu sync.Mutex
	for i := range hosts {
		g := &gate{db: be.open(t)}
		db, err := kv.New(be.name, g)
		if err != nil {
			t.Fatal(err)
		}
		h := &protoHost{g: g, done: make(chan struct{})}
		h.l, err = Open(Options{Tuning: Tuning{Lease: lease, JanitorInterval: lease / 4}, Store: db, Agent: agent, HostID: fmt.Sprint("h", i),
			RetryDelay: 20 * time.Millisecond, InlineLimit: 256, Logger: quietLogger(),
			Handler: func(ctx context.Context, tr *Turn) error { return protoTurn(ctx, h.l, tr) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		go func() {
			defer close(h.done)
			_ = h.l.Run(ctx)
		}()
		hosts[i] = h
	}
	alive := func() []*protoHost {
		hostsMu.Lock()
		defer hostsMu.Unlock()
		var out []*protoHost
		for _, h := range hosts {
			if !h.dead {
				out = append(out, h)
			}
		}
		return out
	}
	var acksMu sync.Mutex
	acked := map[string]string{} // event id -> session
	var wg sync.WaitGroup
	for c := range nClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for n := range perClient {
				sid := fmt.Sprint("s", rng.IntN(nSessions))
				id := fmt.Sprintf("c%d-%d", c, n)
				payload := fmt.Sprintf(`{"text":%q}`, id)
				if rng.IntN(10) == 0 {
					payload = fmt.Sprintf(`{"text":%q}`, strings.Repeat(id, 60)) // a blob
				}
				for try := 0; ; try++ {
					live := alive()
					h := live[rng.IntN(len(live))]
					ctx, cancel := context.WithTimeout(context.Background(), 5*lease)
					_, err := h.l.Deliver(ctx, sid, Event{ID: id, Payload: json.RawMessage(payload)})
					cancel()
					if err == nil {
						acksMu.Lock()
						acked[id] = sid
						acksMu.Unlock()
						break
					}
					if try == 20 {
						t.Errorf("event %s was never acknowledged: %v", id, err)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			}
		}()
	}
	// Chaos: kill one host while it holds a session, then freeze another
	// one that holds a session for longer than the lease.
	holding := func(h *protoHost) {
		for h.l.Stats().LeasesHeld == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	holding(hosts[0])
	hostsMu.Lock()
	hosts[0].dead = true
	hostsMu.Unlock()
	hosts[0].g.dead.Store(true)
	hosts[0].l.abandon()
	hosts[0].cancel()
	holding(hosts[1])
	hosts[1].g.freeze(lease * 5 / 2)
	thawed := time.Now().Add(lease * 5 / 2)
	wg.Wait()
	time.Sleep(time.Until(thawed))

	// Drain.
	reader := hosts[2].l
	// A generous budget: it is spent only when the drain is slow (a
	// loaded machine); a session that never drains still fails the test.
	deadline := time.Now().Add(90 * time.Second)
	for {
		busy := 0
		for info, err := range reader.Sessions(context.Background()) {
			if err != nil {
				t.Fatal(err)
			}
			if info.Holder != "" || info.Pending > 0 {
				busy++
			}
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still busy 90s after the last delivery", busy)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Check through every live host.
	var transcripts map[string][]Committed
	for _, h := range alive() {
		got := map[string][]Committed{}
		for s := range nSessions {
			sid := fmt.Sprint("s", s)
			turns, err := fullTranscript(h.l, sid)
			if err != nil {
				t.Fatalf("%s reading %s: %v", h.l.HostID(), sid, err)
			}
			for i, tr := range turns {
				if tr.Seq != uint64(i+1) {
					t.Fatalf("%s: %s has turn %d at position %d", h.l.HostID(), sid, tr.Seq, i+1)
				}
				var out simOutput
				if err := json.Unmarshal(tr.Output[0], &out); err != nil {
					t.Fatal(err)
				}
				if want := digest(turns[:i]); out.Base != want {
					t.Fatalf("I6: %s turn %d (by %s) was computed from another transcript (%s, want %s)", sid, tr.Seq, tr.Holder, out.Base, want)
				}
			}
			got[sid] = turns
		}
		if transcripts == nil {
			transcripts = got
			continue
		}
		for sid, turns := range got {
			if digest(turns) != digest(transcripts[sid]) {
				t.Fatalf("I6: hosts read different transcripts of %s", sid)
			}
		}
	}
	seen := map[string]int{}
	for sid, turns := range transcripts {
		for _, tr := range turns {
			for _, id := range tr.EventIDs {
				seen[id]++
				if acked[id] != "" && acked[id] != sid {
					t.Errorf("event %s sent to %s was committed in %s", id, acked[id], sid)
				}
			}
		}
	}
	for id := range acked {
		if seen[id] != 1 {
			t.Errorf("I1: acknowledged event %s is in %d committed turns", id, seen[id])
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("I1: event %s committed %d times", id, n)
		}
	}
	var st Stats
	for _, h := range alive() {
		s := h.l.Stats()
		st.Takeovers += s.Takeovers
		st.FencedCommits += s.FencedCommits
		st.Commits += s.Commits
	}
	t.Logf("%s: %d events acknowledged, %d turns committed by the surviving hosts, %d takeovers, %d fenced commits",
		be.name, len(acked), st.Commits, st.Takeovers, st.FencedCommits)
	if st.Takeovers == 0 {
		t.Errorf("no host took a session over: the kill and the freeze did not exercise the takeover")
	}
	for _, h := range alive() {
		if err := h.l.Close(context.Background()); err != nil {
			t.Error(err)
		}
		h.cancel()
		<-h.done
	}
}

// protoTurn reads the transcript before the turn, so its output records
// the digest of what it continued from, and commits.
func protoTurn(ctx context.Context, l *Ledger, tr *Turn) error {
	turns, err := fullTranscript(l, tr.SessionID)
	if err != nil {
		return err
	}
	if uint64(len(turns)) < tr.Seq-1 {
		return errors.New("the transcript is shorter than the committed turns")
	}
	out := mustJSON(simOutput{Event: tr.Event.ID, Base: digest(turns[:tr.Seq-1]), Host: l.HostID()})
	_, err = tr.Commit(ctx, []json.RawMessage{out})
	return err
}

func fullTranscript(l *Ledger, sid string) ([]Committed, error) {
	var all []Committed
	for after := uint64(0); ; {
		p, err := l.Transcript(context.Background(), sid, after, 0)
		if errors.Is(err, ErrUnknownSession) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		all = append(all, p.Turns...)
		after = p.Next
		if !p.More {
			return all, nil
		}
	}
}
