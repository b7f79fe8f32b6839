package ledger

import (
	"context"
	"errors"
	"io"
	"iter"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// This file is the simulation's store: one memkv store shared by every
// simulated host, seen by each host through its own hostStore, which adds
// latency, pauses, crashes and unknown outcomes. Every operation is applied
// under the world's lock, so the monitor (monitor_test.go) sees each change
// of a control record as one atomic step and checks the invariants there.

// errTimeout is what a host sees when its write's answer is lost: the
// write may or may not have been applied.
var errTimeout = errors.New("sim: timeout (the write may have landed)")

// errCrashed is what the store answers a crashed host.
var errCrashed = errors.New("sim: host crashed")

// faultConfig sets how often store faults happen, per write.
type faultConfig struct {
	maxLatency time.Duration // each call waits up to this before and after
	dropWrite  float64       // not applied, answered with a timeout
	lostAnswer float64       // applied, answered with a timeout
	lateCAS    float64       // a conditional write applied later, answered with a timeout now
	maxLate    time.Duration
}

// hostStore is one host incarnation's view of the shared store.
type hostStore struct {
	w     *simWorld
	slot  int
	dead  atomic.Bool
	pause *pauseGate
	cut   *pauseGate // a network cut: calls fail at once until it ends

	scriptMu sync.Mutex
	script   []scripted // faults for the next writes, in order (unit tests)
}

// scripted is a fault planned for a coming write: fault ("drop", "lost",
// "late") hits the next write whose kind is op ("cas" or "put").
type scripted struct{ op, fault string }

// planFault makes the next write of kind op ("cas", "put") fail with
// fault ("drop": not applied; "lost": applied, answered with a timeout;
// "late": applied after a while, answered with a timeout now).
func (h *hostStore) planFault(op, fault string) {
	h.scriptMu.Lock()
	defer h.scriptMu.Unlock()
	h.script = append(h.script, scripted{op, fault})
}

func (h *hostStore) scriptedFault(op string) string {
	h.scriptMu.Lock()
	defer h.scriptMu.Unlock()
	for i, f := range h.script {
		if f.op == op {
			h.script = append(h.script[:i], h.script[i+1:]...)
			return f.fault
		}
	}
	return ""
}

var (
	_ kv.Store          = (*hostStore)(nil)
	_ kv.CAS            = (*hostStore)(nil)
	_ kv.ProcessLocaler = (*hostStore)(nil)
)

// pauseGate stops a host's store calls (and its handler) until a time: a
// process pause (GC, a frozen VM) as seen from outside. Clearing it wakes
// the waiters.
type pauseGate struct {
	mu      sync.Mutex
	until   time.Time
	changed chan struct{}
}

func (p *pauseGate) set(until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if until.After(p.until) {
		p.until = until
	}
}

func (p *pauseGate) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.until = time.Time{}
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// active reports whether the gate is closed now.
func (p *pauseGate) active() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().Before(p.until)
}

// wait blocks while the host is paused. A pause ignores contexts, as a
// frozen process would.
func (p *pauseGate) wait() {
	for {
		p.mu.Lock()
		d := time.Until(p.until)
		if d <= 0 {
			p.mu.Unlock()
			return
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		ch := p.changed
		p.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ch:
		}
		t.Stop()
	}
}

func (h *hostStore) ProcessLocal() bool { return true }

// enter runs before an operation: latency, pause, network cut, crash.
func (h *hostStore) enter(ctx context.Context) error {
	if h.dead.Load() {
		return errCrashed
	}
	if h.cut.active() {
		return errTimeout
	}
	if err := sleepCtx(ctx, h.w.latency()); err != nil {
		return err
	}
	h.pause.wait()
	if h.dead.Load() {
		return errCrashed
	}
	return ctx.Err()
}

// leave runs after an applied operation: latency, and a crash loses the
// answer.
func (h *hostStore) leave(ctx context.Context) error {
	time.Sleep(h.w.latency())
	h.pause.wait()
	if h.dead.Load() {
		return errCrashed
	}
	return nil
}

// writeFault decides the fate of a write: "" (normal), "drop", "lost" or
// "late" (conditional writes only).
func (h *hostStore) writeFault(conditional bool) string {
	op := "put"
	if conditional {
		op = "cas"
	}
	if f := h.scriptedFault(op); f != "" {
		return f
	}
	f := h.w.faults()
	if f == nil {
		return ""
	}
	x := h.w.float()
	switch {
	case x < f.dropWrite:
		return "drop"
	case x < f.dropWrite+f.lostAnswer:
		return "lost"
	case conditional && x < f.dropWrite+f.lostAnswer+f.lateCAS:
		return "late"
	}
	return ""
}

func (h *hostStore) Put(ctx context.Context, key string, value []byte) error {
	if err := h.enter(ctx); err != nil {
		return err
	}
	fault := h.writeFault(false)
	if fault == "drop" {
		return errTimeout
	}
	h.w.put(key, value)
	if fault == "lost" {
		return errTimeout
	}
	return h.leave(ctx)
}

func (h *hostStore) Get(ctx context.Context, key string) ([]byte, error) {
	if err := h.enter(ctx); err != nil {
		return nil, err
	}
	v, err := h.w.base.Get(context.Background(), key)
	if err != nil {
		return nil, err
	}
	return v, h.leave(ctx)
}

func (h *hostStore) Delete(ctx context.Context, key string) error {
	if err := h.enter(ctx); err != nil {
		return err
	}
	fault := h.writeFault(false)
	if fault == "drop" {
		return errTimeout
	}
	h.w.delete(key)
	if fault == "lost" {
		return errTimeout
	}
	return h.leave(ctx)
}

func (h *hostStore) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		if err := h.enter(ctx); err != nil {
			yield(kv.Entry{}, err)
			return
		}
		for e, err := range h.w.base.List(context.Background(), prefix) {
			if err == nil && h.dead.Load() {
				err = errCrashed
			}
			if !yield(e, err) || err != nil {
				return
			}
		}
	}
}

func (h *hostStore) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for e, err := range h.List(ctx, prefix) {
			if !yield(e.Key, err) || err != nil {
				return
			}
		}
	}
}

func (h *hostStore) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	if err := h.enter(ctx); err != nil {
		return nil, "", err
	}
	v, ver, err := h.w.base.GetWithVersion(context.Background(), key)
	if err != nil {
		return nil, "", err
	}
	return v, ver, h.leave(ctx)
}

func (h *hostStore) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	return h.conditional(ctx, key, value, "")
}

func (h *hostStore) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	return h.conditional(ctx, key, value, expected)
}

// conditional is PutIfAbsent (expected "") or PutIfVersion.
func (h *hostStore) conditional(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := h.enter(ctx); err != nil {
		return "", err
	}
	switch h.writeFault(true) {
	case "drop":
		return "", errTimeout
	case "lost":
		_, _ = h.w.cas(key, value, expected)
		return "", errTimeout
	case "late":
		d := 100 * time.Millisecond
		if f := h.w.faults(); f != nil {
			d = time.Duration(h.w.float() * float64(f.maxLate))
		}
		h.w.late.Add(1)
		go func() {
			defer h.w.late.Done()
			time.Sleep(d)
			_, _ = h.w.cas(key, value, expected)
		}()
		return "", errTimeout
	}
	ver, err := h.w.cas(key, value, expected)
	if err != nil {
		return "", err
	}
	return ver, h.leave(ctx)
}

// The world's side: every change applied under w.mu, with the monitor
// watching.

func (w *simWorld) latency() time.Duration {
	f := w.faults()
	if f == nil || f.maxLatency <= 0 {
		return 0
	}
	return time.Duration(w.float() * float64(f.maxLatency))
}

func (w *simWorld) faults() *faultConfig {
	if !w.faultsOn.Load() {
		return nil
	}
	return &w.cfg.faults
}

func (w *simWorld) float() float64 {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.Float64()
}

func (w *simWorld) intn(n int) int {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.IntN(n)
}

func (w *simWorld) put(key string, value []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mon.beforePut(key, value)
	old, _ := w.base.Get(context.Background(), key)
	_ = w.base.Put(context.Background(), key, value)
	if w.isCtl(key) {
		w.mon.controlChanged(key, old, value) // only a broken variant puts a control record
	}
}

func (w *simWorld) delete(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mon.beforeDelete(key)
	_ = w.base.Delete(context.Background(), key)
}

func (w *simWorld) cas(key string, value []byte, expected kv.Version) (kv.Version, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old, _, _ := w.base.GetWithVersion(context.Background(), key)
	var ver kv.Version
	var err error
	if expected == "" {
		ver, err = w.base.PutIfAbsent(context.Background(), key, value)
	} else {
		ver, err = w.base.PutIfVersion(context.Background(), key, value, expected)
	}
	if err == nil && w.isCtl(key) {
		w.mon.controlChanged(key, old, value)
	}
	return ver, err
}

// simWorld holds the shared store, the randomness, the fault switches and
// the monitor.
type simWorld struct {
	cfg      simConfig
	base     *memkv.Store
	mu       sync.Mutex // serializes every write with the monitor's checks
	rngMu    sync.Mutex
	rng      *rand.Rand
	faultsOn atomic.Bool
	late     sync.WaitGroup // late conditional writes still to land
	mon      *monitor
	resMu    sync.Mutex
	res      simResult
	handling atomic.Int64 // turns in the simulation's handler
}

// quietLogger drops the ledger's logs, which the faults make plentiful.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// isCtl reports whether key is a control record key.
func (w *simWorld) isCtl(key string) bool { return strings.HasPrefix(key, w.mon.keys.ctlPrefix()) }
