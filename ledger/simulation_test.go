package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
)

// The simulation: several hosts serve one agent over one memkv store, with
// synctest's fake clock. Clients send events to random sessions through
// random hosts and retry with the same event id after an error, and now
// and then send an event of theirs again long after (a client retrying
// with its Idempotency-Key after many later messages, inside the
// IdempotencyWindow or past it); most events are keyed, the window of
// recent ids is small in three seeds of four (so ids leave it all the
// time), the hosts' wall clocks are set apart by ClockSkew, and one seed
// in five of those caps the kept keys at 2 (MaxKeys); an operator replays and drops
// dead letters; a chaos loop crashes hosts
// (also at every named protocol step), restarts them, and pauses them for
// longer than the lease; the store adds latency and unknown outcomes (a
// write applied but answered with a timeout, dropped and answered with a
// timeout, or a conditional write applied late). The monitor checks I1–I7
// at every write; at the end, with faults off and every host back, the
// ledger must drain, and every acknowledged event must be in exactly one
// committed turn or in the dead-letter store, read through every host.
//
// LEDGER_SIM_SEEDS (default 32) and LEDGER_SIM_SECONDS (simulated seconds
// of chaos per seed, default 40) make a longer sweep:
//
//	LEDGER_SIM_SEEDS=500 LEDGER_SIM_SECONDS=600 go test -run 'Simulation$' ./ledger/

type simConfig struct {
	seed         uint64
	hosts        int
	sessions     int
	clients      int
	duration     time.Duration // of the chaos phase
	lease        time.Duration
	sendEvery    time.Duration // mean pause of a client between events
	faults       faultConfig
	crashAtStep  float64       // chance that a step hook crashes its host
	targets      []string      // steps crashed at far more often in this seed
	midTurnPause float64       // chance that a turn's host freezes as the turn starts
	chaosEvery   time.Duration // mean pause between chaos actions
	bugs         testHooks
	// The idempotency settings: the window of recent ids, the
	// IdempotencyWindow and ClockSkew (host i's wall clock is off by
	// (i-1)·ClockSkew/2), MaxKeys (0: the default); the chance that a
	// client sends one of its acknowledged keyed events again, and that
	// an event is unkeyed.
	dedupWindow int
	idemWindow  time.Duration
	clockSkew   time.Duration
	maxKeys     int
	lateRetry   float64
	unkeyed     float64
}

func defaultSimConfig(seed uint64) simConfig {
	lease := 2 * time.Second
	cfg := simConfig{
		seed: seed, hosts: 3, sessions: 5, clients: 3,
		duration: envDuration("LEDGER_SIM_SECONDS", 40*time.Second), lease: lease,
		sendEvery: 400 * time.Millisecond,
		faults: faultConfig{maxLatency: 20 * time.Millisecond, dropWrite: 0.02, lostAnswer: 0.02, lateCAS: 0.01,
			maxLate: lease / 2},
		crashAtStep: 0.0015, midTurnPause: 0.05,
		chaosEvery: 2 * time.Second,
		// Three steps per seed are crashed at on their first occurrence,
		// so every 16 seeds target every step at least twice.
		targets:     []string{simSteps[int(3*seed)%len(simSteps)], simSteps[int(3*seed+1)%len(simSteps)], simSteps[int(3*seed+2)%len(simSteps)]},
		dedupWindow: []int{2, 3, 4, 64}[seed%4],
		idemWindow:  5 * time.Second, clockSkew: time.Second,
		lateRetry: 0.15, unkeyed: 0.2,
	}
	if seed%5 == 0 && cfg.dedupWindow < 64 {
		cfg.maxKeys = 2
	}
	return cfg
}

// clockOffset is how far host slot's wall clock is off.
func (c simConfig) clockOffset(slot int) time.Duration {
	return time.Duration(slot-1) * c.clockSkew / 2
}

func envDuration(name string, def time.Duration) time.Duration {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// simResult is what one seed saw.
type simResult struct {
	violations  []string
	acked       int
	commits     int
	deadLetters int
	takeovers   int64
	fenced      int64
	selfFenced  int64
	crashes     int
	crashSteps  map[string]int
	pauses      int
	cuts        int
	// The idempotency paths: duplicates answered from a kept key, keyed
	// deliveries refused at MaxKeys, kept keys collected, and keyed
	// events queued again once their kept key was gone.
	keptHits, keyRefusals, keysCollected, keyedAgain int
}

// simHost is one host slot; each restart is a new incarnation (a new
// Ledger, a new host id, a new view of the store).
type simHost struct {
	w    *simWorld
	slot int

	mu        sync.Mutex
	inc       int
	l         *Ledger
	store     *hostStore
	stopRun   context.CancelFunc
	runDone   chan struct{}
	alive     bool
	deadSince time.Time
	pause     *pauseGate
	cut       *pauseGate
	// crashed are the incarnations crashed so far, whose janitors and
	// runners the seed waits for before it ends.
	crashed []crashedHost
}

type crashedHost struct {
	l       *Ledger
	runDone chan struct{}
}

func (h *simHost) ledger() *Ledger {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.alive {
		return nil
	}
	return h.l
}

// start brings up a new incarnation.
func (h *simHost) start(t *testing.T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.w
	h.inc++
	hs := &hostStore{w: w, slot: h.slot, pause: h.pause, cut: h.cut}
	db, err := kv.New("sim", hs)
	if err != nil {
		t.Fatal(err)
	}
	var l *Ledger
	opts := Options{Tuning: Tuning{Lease: w.cfg.lease, MaxAttempts: 3, MaxPending: 8, DedupWindow: w.cfg.dedupWindow, RetryAfter: 300 * time.Millisecond, FollowInterval: 200 * time.Millisecond,
		IdempotencyWindow: w.cfg.idemWindow, ClockSkew: w.cfg.clockSkew, MaxKeys: w.cfg.maxKeys},
		Store: db, Agent: "sim", HostID: fmt.Sprintf("h%d.%d", h.slot, h.inc), AllowProcessLocal: true,
		InlineLimit: 64, MaxInlineBytes: 512,
		TurnInlineLimit: 512,
		SweepEvery:      4 * time.Second,
		Handler:         func(ctx context.Context, t *Turn) error { return h.handle(ctx, l, hs, t) },
		Logger:          quietLogger(),
	}
	opts.test = w.cfg.bugs
	offset := w.cfg.clockOffset(h.slot)
	opts.test.now = func() time.Time { return time.Now().Add(offset) }
	inc := h.inc
	opts.test.step = func(name string) {
		if strings.HasSuffix(name, ":timer") {
			// A frozen process runs no timers either: they fire late,
			// racing whatever else wakes up with them.
			hs.pause.wait()
			return
		}
		w.stepHook(h, inc, name)
	}
	l, err = Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Run(ctx)
	}()
	h.l, h.store, h.stopRun, h.runDone, h.alive = l, hs, cancel, done, true
}

// crash stops the current incarnation as a crash would: its store answers
// nothing more, its leases are left to expire.
func (h *simHost) crash(inc int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.alive || (inc != 0 && inc != h.inc) {
		return false
	}
	h.alive = false
	h.deadSince = time.Now()
	h.w.addStats(h.l.Stats())
	h.store.dead.Store(true)
	h.l.abandon()
	h.stopRun()
	h.crashed = append(h.crashed, crashedHost{h.l, h.runDone})
	return true
}

// handle is the simulation's turn: it reads the transcript before the
// turn (whose digest goes into the output, for I6), takes some model time
// (now and then longer than the lease), may fail (poison and flaky
// events), performs side effects after Check (self-fencing), and commits.
func (h *simHost) handle(ctx context.Context, l *Ledger, hs *hostStore, t *Turn) error {
	w := h.w
	w.handling.Add(1)
	defer w.handling.Add(-1)
	if w.faultsOn.Load() && w.float() < w.cfg.midTurnPause {
		// A pause in the middle of a turn (a long GC, a frozen VM): the
		// classic zombie, which wakes up after another host took over.
		hs.pause.set(time.Now().Add(time.Duration((1.5 + 2*w.float()) * float64(w.cfg.lease))))
		w.resMu.Lock()
		w.res.pauses++
		w.resMu.Unlock()
	}
	hs.pause.wait()
	var turns []Committed
	for after := uint64(0); after < t.Seq-1; {
		p, err := l.Transcript(ctx, t.SessionID, after, 50)
		if err != nil {
			return err
		}
		turns = append(turns, p.Turns...)
		after = p.Next
		if !p.More {
			break
		}
	}
	if uint64(len(turns)) < t.Seq-1 {
		w.mon.violate("I6 %s: turn %d started from a transcript of %d turns", t.SessionID, t.Seq, len(turns))
		return errors.New("short transcript")
	}
	base := digest(turns[:t.Seq-1])
	think := time.Duration(w.float() * float64(300*time.Millisecond))
	switch x := w.float(); {
	case x < 0.04:
		think = w.cfg.lease + time.Duration(w.float()*float64(2*w.cfg.lease)) // a long model call
	case x < 0.12:
		// A call that ignores its context (a client without
		// cancellation): the turn may outlive its lease and try to commit
		// as a zombie.
		time.Sleep(time.Duration((0.5 + 2.5*w.float()) * float64(w.cfg.lease)))
		think = 0
	}
	if err := sleepCtx(ctx, think); err != nil {
		return err
	}
	hs.pause.wait()
	var p simPayload
	_ = json.Unmarshal(t.Event.Payload, &p)
	switch {
	case p.Kind == "poison":
		return errors.New("poison event")
	case p.Kind == "flaky" && w.float() < 0.6:
		return errors.New("flaky failure")
	}
	// Side effects start only after Check. A turn without any (a final
	// answer) commits even when self-fenced: the store's fence decides.
	for range max(0, w.intn(4)-1) {
		if err := t.Check(); err != nil {
			return err
		}
		w.effect(t.SessionID, t.Generation)
	}
	out := []json.RawMessage{mustJSON(simOutput{Event: t.Event.ID, Base: base, Host: l.HostID()})}
	if p.Kind == "bigout" {
		out = append(out, mustJSON(strings.Repeat("x", 600)))
	}
	_, err := t.Commit(ctx, out)
	return err
}

type simPayload struct {
	Kind string `json:"kind"`
	Pad  string `json:"pad,omitempty"`
}

// addStats adds a crashed incarnation's counters to the seed's result.
func (w *simWorld) addStats(st Stats) {
	w.resMu.Lock()
	defer w.resMu.Unlock()
	w.res.takeovers += st.Takeovers
	w.res.fenced += st.FencedCommits
	w.res.selfFenced += st.SelfFenced
}

func (w *simWorld) effect(sid string, gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mon.effect(sid, gen)
}

// stepHook crashes a host at a protocol step now and then.
func (w *simWorld) stepHook(h *simHost, inc int, name string) {
	p := w.cfg.crashAtStep
	w.resMu.Lock()
	if name == "deliver:kept" {
		w.res.keptHits++
	}
	if slices.Contains(w.cfg.targets, name) {
		// A targeted step crashes its first occurrence, then one more now
		// and then.
		switch w.res.crashSteps[name] {
		case 0:
			p = 1
		case 1:
			p = 0.2
		}
	}
	w.resMu.Unlock()
	if !w.faultsOn.Load() || w.float() >= p {
		return
	}
	if h.crash(inc) {
		w.resMu.Lock()
		w.res.crashes++
		w.res.crashSteps[name]++
		w.resMu.Unlock()
	}
}

// ack is a client's record of an acknowledged event.
type ack struct{ sid, id string }

func runSimulation(t *testing.T, cfg simConfig) simResult {
	scope, _ := keys.Agent("sim")
	base := memkv.NewStore()
	k := newLayout(scope)
	w := &simWorld{cfg: cfg, base: base, rng: rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15)), mon: newMonitor(k, base)}
	w.res.crashSteps = map[string]int{}
	w.mon.trace = os.Getenv("LEDGER_SIM_TRACE")
	w.mon.silence = cfg.lease + cfg.lease/5 // the default margin
	w.mon.keyWindow = cfg.idemWindow
	w.mon.offset = func(host string) time.Duration {
		var slot int
		if _, err := fmt.Sscanf(host, "h%d.", &slot); err != nil {
			return 0
		}
		return cfg.clockOffset(slot)
	}
	w.faultsOn.Store(true)
	hosts := make([]*simHost, cfg.hosts)
	for i := range hosts {
		hosts[i] = &simHost{w: w, slot: i, pause: &pauseGate{}, cut: &pauseGate{}}
		hosts[i].start(t)
	}
	var (
		acksMu  sync.Mutex
		acks    []ack
		dropped = map[ack]bool{}
	)
	chaosCtx, stopChaos := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	pick := func() *Ledger {
		for range 20 {
			if l := hosts[w.intn(len(hosts))].ledger(); l != nil {
				return l
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}
	for c := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			type sent struct {
				sid string
				ev  Event
			}
			var mine []sent // this client's acknowledged keyed events
			for n := 0; chaosCtx.Err() == nil; n++ {
				time.Sleep(time.Duration(w.float() * 2 * float64(cfg.sendEvery)))
				var (
					sid   string
					ev    Event
					again = len(mine) > 0 && w.float() < cfg.lateRetry
				)
				if again {
					// A retry long after: the same event, which the session
					// must still know unless its key has expired.
					old := mine[w.intn(len(mine))]
					sid, ev = old.sid, old.ev
				} else {
					sid = fmt.Sprintf("s%d", w.intn(cfg.sessions))
					p := simPayload{Kind: "ok"}
					switch x := w.float(); {
					case x < 0.04:
						p.Kind = "poison"
					case x < 0.10:
						p.Kind = "flaky"
					case x < 0.22:
						p.Pad = strings.Repeat("p", 80+w.intn(200)) // over InlineLimit: a blob
					case x < 0.27:
						p.Kind = "bigout"
					}
					ev = Event{ID: fmt.Sprintf("c%d-%d", c, n), Payload: mustJSON(p), Keyed: w.float() >= cfg.unkeyed}
				}
				for range 12 {
					l := pick()
					if l == nil {
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), 3*cfg.lease)
					d, err := l.Deliver(ctx, sid, ev)
					cancel()
					if err == nil {
						w.mu.Lock()
						ms := w.mon.session(sid)
						ms.log = append(ms.log, fmt.Sprintf("%s ack %s via %s: %+v", time.Now().Format("15:04:05.000"), ev.ID, l.HostID(), d))
						w.mu.Unlock()
						acksMu.Lock()
						acks = append(acks, ack{sid, ev.ID})
						acksMu.Unlock()
						if ev.Keyed && !again {
							mine = append(mine, sent{sid, ev})
						}
						break
					}
					var busy *BusyError
					if errors.As(err, &busy) {
						if busy.Keys > 0 {
							w.resMu.Lock()
							w.res.keyRefusals++
							w.resMu.Unlock()
						}
						time.Sleep(busy.RetryAfter)
					} else {
						time.Sleep(time.Duration(w.float() * float64(200*time.Millisecond)))
					}
				}
			}
		}()
	}
	// The operator replays most dead letters and drops a few.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for chaosCtx.Err() == nil {
			time.Sleep(5 * time.Second)
			l := pick()
			if l == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*cfg.lease)
			var dls []DeadLetter
			for d, err := range l.DeadLetters(ctx, "") {
				if err != nil {
					break
				}
				dls = append(dls, d)
			}
			for _, d := range dls {
				switch x := w.float(); {
				case x < 0.05:
					// An unknown outcome may have dropped it too.
					acksMu.Lock()
					dropped[ack{d.SessionID, d.EventID}] = true
					acksMu.Unlock()
					err := l.Drop(ctx, d.SessionID, d.EventID)
					w.mu.Lock()
					ms := w.mon.session(d.SessionID)
					ms.log = append(ms.log, fmt.Sprintf("%s drop %s via %s: %v", time.Now().Format("15:04:05.000"), d.EventID, l.HostID(), err))
					w.mu.Unlock()
				case x < 0.6:
					_, _ = l.Replay(ctx, d.SessionID, d.EventID)
				}
			}
			cancel()
		}
	}()
	// Chaos: crashes, restarts, pauses longer than the lease.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for chaosCtx.Err() == nil {
			time.Sleep(time.Duration(w.float() * 2 * float64(cfg.chaosEvery)))
			if chaosCtx.Err() != nil {
				return
			}
			for _, h := range hosts {
				h.mu.Lock()
				down := !h.alive && time.Since(h.deadSince) > cfg.lease/2
				h.mu.Unlock()
				if down && w.float() < 0.7 {
					h.start(t)
				}
			}
			// Mostly strike a host that holds sessions: that is where a
			// pause or a cut makes a zombie.
			h := hosts[w.intn(len(hosts))]
			if w.float() < 0.7 {
				for _, c := range hosts {
					if l := c.ledger(); l != nil && l.Stats().LeasesHeld > 0 {
						h = c
						break
					}
				}
			}
			long := func() time.Time {
				return time.Now().Add(time.Duration((1.5 + 2*w.float()) * float64(cfg.lease)))
			}
			switch x := w.float(); {
			case x < 0.15:
				if h.crash(0) {
					w.resMu.Lock()
					w.res.crashes++
					w.resMu.Unlock()
				}
			case x < 0.65:
				h.pause.set(long())
				w.resMu.Lock()
				w.res.pauses++
				w.resMu.Unlock()
			case x < 0.9:
				// A network cut: the host runs on, its store calls fail.
				h.cut.set(long())
				w.resMu.Lock()
				w.res.cuts++
				w.resMu.Unlock()
			}
		}
	}()
	time.Sleep(cfg.duration)
	stopChaos()
	wg.Wait()

	// Quiet: faults off, every host back; the ledger must drain.
	w.faultsOn.Store(false)
	for _, h := range hosts {
		h.pause.clear()
		h.cut.clear()
		if h.ledger() == nil {
			h.start(t)
		}
	}
	w.late.Wait()
	drained := false
	for range 600 {
		time.Sleep(time.Second)
		if w.quiescent() {
			drained = true
			break
		}
	}
	res := w.finalCheck(t, hosts, acks, dropped, drained)
	for _, h := range hosts {
		if l := h.ledger(); l != nil {
			st := l.Stats()
			res.takeovers += st.Takeovers
			res.fenced += st.FencedCommits
			res.selfFenced += st.SelfFenced
			if err := l.Close(context.Background()); err != nil {
				t.Errorf("close: %v", err)
			}
		}
		h.mu.Lock()
		h.stopRun()
		done := h.runDone
		h.mu.Unlock()
		<-done
	}
	// A crashed host's turn may still be in a call that ignores its
	// context, and its janitor and runners may still be stopping; the seed
	// ends once they have all returned.
	for w.handling.Load() > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	for _, h := range hosts {
		h.mu.Lock()
		crashed := h.crashed
		h.mu.Unlock()
		for _, c := range crashed {
			<-c.runDone
			c.l.wg.Wait()
		}
	}
	return res
}

// quiescent reports whether every session has an empty inbox, no holder
// and nothing left to flush.
func (w *simWorld) quiescent() bool {
	for e, err := range w.base.List(context.Background(), w.mon.keys.ctlPrefix()) {
		if err != nil {
			return false
		}
		c, err := decodeControl(e.Value)
		if err != nil || (c.Deleted == nil && (len(c.Pending) > 0 || c.Holder != "" || len(c.Unflushed) > 0)) {
			return false
		}
	}
	return true
}

// finalCheck checks the drained ledger against the clients' acks and the
// monitor's history.
func (w *simWorld) finalCheck(t *testing.T, hosts []*simHost, acks []ack, dropped map[ack]bool, drained bool) simResult {
	w.resMu.Lock()
	res := w.res
	w.resMu.Unlock()
	m := w.mon
	if !drained {
		var stuck []string
		for e := range w.base.List(context.Background(), m.keys.ctlPrefix()) {
			stuck = append(stuck, string(e.Value))
		}
		m.violate("the ledger did not drain within 10 simulated minutes of quiet: %s", strings.Join(stuck, "\n"))
	}
	ctx := context.Background()
	dead := map[ack]bool{}
	for d, err := range hosts[0].ledger().DeadLetters(ctx, "") {
		if err != nil {
			m.violate("listing dead letters: %v", err)
			break
		}
		dead[ack{d.SessionID, d.EventID}] = true
	}
	res.deadLetters = len(dead)
	// I1 against the acknowledgements.
	seen := map[ack]bool{}
	for _, a := range acks {
		if seen[a] {
			continue
		}
		seen[a] = true
		ms := m.session(a.sid)
		n := ms.commits[a.id]
		if dead[a] {
			n++
		}
		// A client retry after the session forgot the id (the documented
		// window) is a new event: each such re-delivery allows one more.
		if n < 1 && !dropped[a] || n > 1+ms.expired[a.id] {
			m.violate("I1 %s: acknowledged event %s is in %d places (committed %v, dead-lettered %v, dropped %v)",
				a.sid, a.id, n, m.session(a.sid).committedIDs[a.id] != 0, dead[a], dropped[a])
		}
	}
	res.acked = len(seen)
	for d := range dead {
		// A re-delivery after the session forgot the id is a new event,
		// which may commit beside the old one's dead letter.
		if _, ok := m.session(d.sid).committedIDs[d.id]; ok && m.session(d.sid).expired[d.id] == 0 {
			m.violate("I1 %s: event %s is both committed and dead-lettered", d.sid, d.id)
		}
	}
	// I6: every host reads exactly the committed transcript.
	sids := make([]string, 0, len(m.sessions))
	for sid := range m.sessions {
		sids = append(sids, sid)
	}
	sort.Strings(sids)
	for _, h := range hosts {
		l := h.ledger()
		for _, sid := range sids {
			want := m.sessions[sid].committed
			var got []Committed
			for after := uint64(0); ; {
				p, err := l.Transcript(ctx, sid, after, 40)
				if err != nil {
					m.violate("I6 %s: reading the transcript through %s: %v", sid, l.HostID(), err)
					break
				}
				got = append(got, p.Turns...)
				after = p.Next
				if !p.More {
					break
				}
			}
			if len(got) != len(want) {
				m.violate("I6 %s: %s reads %d committed turns, the history has %d", sid, l.HostID(), len(got), len(want))
				continue
			}
			for i := range got {
				if got[i].Seq != uint64(i+1) || got[i].TurnID != want[i].TurnID || !slices.Equal(got[i].EventIDs, want[i].EventIDs) {
					m.violate("I6 %s: %s reads turn %d as %s %v, the history has %s %v", sid, l.HostID(), i+1,
						got[i].TurnID, got[i].EventIDs, want[i].TurnID, want[i].EventIDs)
					break
				}
			}
			res.commits += len(want)
		}
	}
	res.keysCollected, res.keyedAgain = m.keysCollected, m.keyedAgain
	res.violations = m.violations()
	if len(res.violations) > 0 && os.Getenv("LEDGER_SIM_VERBOSE") != "" {
		for _, sid := range sids {
			if !slices.ContainsFunc(res.violations, func(v string) bool { return strings.Contains(v, " "+sid+":") }) {
				continue
			}
			t.Logf("history of %s:", sid)
			for _, line := range m.sessions[sid].log {
				t.Log(line)
			}
		}
	}
	return res
}

func TestSimulation(t *testing.T) {
	seeds := envInt("LEDGER_SIM_SEEDS", 32)
	total := simResult{crashSteps: map[string]int{}}
	for seed := 1; seed <= seeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				res := runSimulation(t, defaultSimConfig(uint64(seed)))
				for _, v := range res.violations {
					t.Error(v)
				}
				t.Logf("acked %d events, %d commits, %d dead letters, %d crashes, %d pauses, %d network cuts, %d takeovers, %d fenced commits, %d self-fenced turns",
					res.acked, res.commits/3, res.deadLetters, res.crashes, res.pauses, res.cuts, res.takeovers, res.fenced, res.selfFenced)
				total.acked += res.acked
				total.takeovers += res.takeovers
				total.fenced += res.fenced
				total.selfFenced += res.selfFenced
				total.deadLetters += res.deadLetters
				total.keptHits += res.keptHits
				total.keyRefusals += res.keyRefusals
				total.keysCollected += res.keysCollected
				total.keyedAgain += res.keyedAgain
				for k, v := range res.crashSteps {
					total.crashSteps[k] += v
				}
			})
		})
	}
	if t.Failed() {
		return
	}
	// The run must have exercised what it claims to test.
	if total.takeovers == 0 || total.fenced == 0 || total.deadLetters == 0 {
		t.Errorf("the simulation never saw a takeover (%d), a fenced commit (%d) or a dead letter (%d)", total.takeovers, total.fenced, total.deadLetters)
	}
	if total.keptHits == 0 || total.keyRefusals == 0 || total.keysCollected == 0 || total.keyedAgain == 0 {
		t.Errorf("the simulation never answered a retry from a kept key (%d), refused a keyed event at MaxKeys (%d), collected a kept key (%d) or queued a keyed event again after its key expired (%d)",
			total.keptHits, total.keyRefusals, total.keysCollected, total.keyedAgain)
	}
	for _, step := range simSteps {
		if total.crashSteps[step] == 0 {
			t.Errorf("no host crashed at step %q in %d seeds", step, seeds)
		}
	}
	t.Logf("in all: %d acknowledged events, %d takeovers, %d fenced commits, %d self-fenced turns, crashes by step %v",
		total.acked, total.takeovers, total.fenced, total.selfFenced, total.crashSteps)
	t.Logf("idempotency: %d retries answered from a kept key, %d keyed events refused at MaxKeys, %d kept keys collected, %d keyed events queued again after their key expired",
		total.keptHits, total.keyRefusals, total.keysCollected, total.keyedAgain)
}

// simSteps are the protocol steps at which the simulation must have
// crashed a host at least once.
var simSteps = []string{
	"deliver:before-write", "deliver:after-write", "deliver:blob",
	"attempt:before-write", "attempt:after-write", "turn:start",
	"commit:before-write", "commit:after-write", "commit:out", "flush",
	"renew:before-write", "renew:after-write",
	"release:before-write", "release:after-write",
	"deadletter:put", "deadletter:before-write", "deadletter:after-write",
	"takeover:before-write", "takeover:after-write",
	"sweep:before-write", "sweep:after-write",
	"keys:put", "keys:delete", "keys:before-write", "keys:after-write",
}

func TestSimulationCatchesBrokenVariants(t *testing.T) {
	for _, v := range []struct {
		name string
		bugs testHooks
		// More zombies, or more contention, than the main run.
		tweak func(*simConfig)
	}{
		{"commit without the generation check", testHooks{rules: noFence{}}, func(c *simConfig) {
			c.sessions, c.clients, c.midTurnPause = 2, 5, 0.15
		}},
		{"release without the pending check", testHooks{rules: blindRelease{}}, func(c *simConfig) {
			c.sessions, c.clients = 3, 6
			c.faults.maxLatency = 150 * time.Millisecond
		}},
		{"eviction without the kept key", testHooks{rules: forgetfulEviction{}}, func(c *simConfig) {
			c.dedupWindow = 2
		}},
		{"keyed delivery without the kept-key look-up", testHooks{rules: blindDelivery{}}, func(c *simConfig) {
			c.dedupWindow, c.lateRetry = 2, 0.4
		}},
		{"expiry without the clock-skew margin", testHooks{rules: hastyExpiry{}}, func(c *simConfig) {
			c.dedupWindow, c.clockSkew = 2, 2*time.Second
		}},
	} {
		t.Run(v.name, func(t *testing.T) {
			// Seeds run until the checker objects (usually within a few);
			// with LEDGER_SIM_BROKEN_SEEDS set, that many seeds run and the
			// catch rate is reported.
			sweep := envInt("LEDGER_SIM_BROKEN_SEEDS", 0)
			limit := max(sweep, 40)
			caught, ran := 0, 0
			var first string
			for seed := 1; seed <= limit && (sweep > 0 || caught == 0); seed++ {
				ran++
				synctest.Test(t, func(t *testing.T) {
					cfg := defaultSimConfig(uint64(1000 + seed))
					cfg.bugs = v.bugs
					cfg.duration = 30 * time.Second
					v.tweak(&cfg)
					res := runSimulation(t, cfg)
					if len(res.violations) > 0 {
						caught++
						if first == "" {
							first = fmt.Sprintf("seed %d: %s", seed, res.violations[0])
						}
					}
				})
			}
			if caught == 0 {
				t.Fatalf("the checker found nothing wrong with the broken variant in %d seeds", ran)
			}
			t.Logf("caught in %d of %d seeds; first violation: %s", caught, ran, first)
		})
	}
}

// noFence is the broken variant that commits without the generation
// check: its commits ignore the lease and take the event wherever it is in
// the inbox.
type noFence struct{ realRules }

func (noFence) fence(r *runner, step string, c *control) *FencedError {
	if step == "commit" {
		return nil
	}
	return r.fenced(c)
}

func (noFence) commitParent(*runner) (context.Context, error) { return context.Background(), nil }

func (noFence) consume(c *control, t *Turn) error {
	for i := range c.Pending {
		if c.Pending[i].Seq == t.InboxSeq {
			c.Pending = append(c.Pending[:i:i], c.Pending[i+1:]...)
			break
		}
	}
	c.Commit++
	return nil
}

// blindRelease is the broken variant that releases without the pending
// check.
type blindRelease struct{ realRules }

// release is the deliberately broken release: a plain
// put of the cached record with the holder cleared, checking neither the
// inbox nor the version.
func (blindRelease) release(r *runner) bool {
	c := r.s.snapshot()
	if c == nil {
		return true
	}
	c.Holder = ""
	c.Renew++
	c.dropFlushed(r.s.flushedThrough())
	c.Write = randomHex(8)
	c.Version = FormatVersion
	err := r.l.put(r.ctx, r.s.key, encode(kindControl, c))
	r.s.invalidate()
	if err == nil {
		r.mu.Lock()
		r.released = true
		r.mu.Unlock()
		r.cancel(nil)
	}
	return err == nil || r.ctx.Err() != nil
}

// forgetfulEviction is the broken variant that lets keyed ids leave the
// window without writing their kept keys.
type forgetfulEviction struct{ realRules }

func (forgetfulEviction) evicts(*control, int) []recent { return nil }

// blindDelivery is the broken variant whose deliveries never look for a
// kept key: a keyed id past the window is queued as a new event.
type blindDelivery struct{ realRules }

func (blindDelivery) kept(context.Context, *Ledger, *control, string) (*keptKey, error) {
	return nil, nil
}

// hastyExpiry is the broken variant that deletes kept keys once the
// window has passed on the deleter's clock, without the clock-skew margin.
type hastyExpiry struct{ realRules }

func (hastyExpiry) expired(at, now time.Time, window, _ time.Duration) bool {
	return realRules{}.expired(at, now, window, 0)
}
