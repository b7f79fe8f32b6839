package evals

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"agentkit/agent"
	"agentkit/storage"
)

// Defaults of Options and StartOptions.
const (
	// DefaultHistoryWindow is how many runs are kept: the newest.
	DefaultHistoryWindow = 50
	// DefaultHeartbeat is how often a running run's snapshot is rewritten
	// with a fresh heartbeat.
	DefaultHeartbeat = 10 * time.Second
	// DefaultConcurrency is how many cases of a run run at once.
	DefaultConcurrency = 4
	// MaxConcurrency bounds StartOptions.Concurrency.
	MaxConcurrency = 64
	// DefaultMaxAttempts is how many times a case is tried when its turn
	// fails on a rate limit or a server error.
	DefaultMaxAttempts = 5
	// DefaultMaxRunning is how many runs a Manager runs at once.
	DefaultMaxRunning = 4
)

// Errors matched with errors.Is.
var (
	// ErrNotFound means no stored run has the id.
	ErrNotFound = errors.New("evals: run not found")
	// ErrBusy means the Manager already runs Options.MaxRunning runs.
	ErrBusy = errors.New("evals: too many runs running")
	// ErrClosed means the Manager was stopped.
	ErrClosed = errors.New("evals: stopped")
	// ErrInvalid means the cases or the run's options are not valid; a
	// problem in one case is a *CaseError, which matches it too.
	ErrInvalid = errors.New("evals: invalid cases")
)

// Sessions is what a run needs of the runtime: *agent.Runtime.
type Sessions interface {
	StartSession(ctx context.Context, req agent.StartRequest) (agent.TurnResult, error)
}

// Options configures a Manager. Sessions, Table and Host.ID are required;
// ForRuntime fills them from a runtime.
type Options struct {
	// Sessions runs the cases' turns.
	Sessions Sessions
	// Table is the agent's eval-run table.
	Table *storage.EvalRuns
	// Host names this host in the runs it owns.
	Host Host
	// Agent and Model label the runs.
	Agent, Model string
	// HistoryWindow is how many runs are kept, the newest by start time;
	// older ones are deleted when a run starts and by Recover. Running
	// runs are never deleted. Zero means DefaultHistoryWindow; negative is
	// an error.
	HistoryWindow int
	// Heartbeat is how often a running run's snapshot is rewritten with a
	// fresh heartbeat; zero means DefaultHeartbeat.
	Heartbeat time.Duration
	// StaleAfter is how old another host's heartbeat may be before its
	// running run counts as interrupted; zero means three heartbeats.
	StaleAfter time.Duration
	// MaxAttempts is how many times a case is tried when its turn fails
	// on a temporary model error (agent.Turn.Retryable: a 429 rate limit or
	// a 5xx); zero means DefaultMaxAttempts.
	MaxAttempts int
	// Backoff returns the pause after the given failed attempt (from 1);
	// nil means 1s, 2s, 4s… up to 30s, each with random jitter. While it
	// runs, every run of the Manager holds its new turns, as they share the
	// model's rate limit.
	Backoff func(attempt int) time.Duration
	// MaxRunning is how many runs may run at once; zero means
	// DefaultMaxRunning.
	MaxRunning int
	// TurnContext is the parent of the cases' turns: canceling it cancels
	// running turns (a server that gives up on its shutdown). Stopping a
	// run does not cancel its running turns; they finish and are graded.
	// Nil means context.Background().
	TurnContext context.Context
	// Logger receives store failures; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// ForRuntime returns a Manager running cases through rt and storing runs
// in rt's eval-run table, owned by rt's host. Fields of opts other than
// Sessions, Table, Host, Agent and Model are used as given.
func ForRuntime(rt *agent.Runtime, opts Options) (*Manager, error) {
	info := rt.Info()
	as, err := rt.Binding().Agent(info.Agent)
	if err != nil {
		return nil, err
	}
	hostname, _ := os.Hostname()
	opts.Sessions = rt
	opts.Table = as.Evals()
	opts.Host = Host{ID: rt.HostID(), Name: hostname, PID: os.Getpid()}
	opts.Agent, opts.Model = info.Agent, info.Model
	return NewManager(opts)
}

// Manager runs eval runs and keeps their history in the eval-run table. It
// is safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	active  map[string]*active
	stopped bool
	wg      sync.WaitGroup

	gateMu    sync.Mutex
	gateUntil time.Time // no new turn starts before it (a rate limit)
}

// NewManager checks opts and returns a Manager.
func NewManager(opts Options) (*Manager, error) {
	switch {
	case opts.Sessions == nil:
		return nil, errors.New("evals: Options.Sessions is nil; pass the runtime (or use ForRuntime)")
	case opts.Table == nil:
		return nil, errors.New("evals: Options.Table is nil; pass the agent's eval-run table (storage.AgentStore.Evals)")
	case opts.Host.ID == "":
		return nil, errors.New("evals: Options.Host.ID is empty; name the host (agent.Runtime.HostID)")
	case opts.HistoryWindow < 0:
		return nil, fmt.Errorf("evals: Options.HistoryWindow is %d; use 0 for the default (%d) or a positive count", opts.HistoryWindow, DefaultHistoryWindow)
	case opts.Heartbeat < 0 || opts.StaleAfter < 0 || opts.MaxAttempts < 0 || opts.MaxRunning < 0:
		return nil, errors.New("evals: Options.Heartbeat, StaleAfter, MaxAttempts and MaxRunning must not be negative; 0 means the default")
	}
	if opts.HistoryWindow == 0 {
		opts.HistoryWindow = DefaultHistoryWindow
	}
	if opts.Heartbeat == 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.StaleAfter == 0 {
		opts.StaleAfter = 3 * opts.Heartbeat
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.MaxRunning == 0 {
		opts.MaxRunning = DefaultMaxRunning
	}
	if opts.Backoff == nil {
		opts.Backoff = defaultBackoff
	}
	if opts.TurnContext == nil {
		opts.TurnContext = context.Background()
	}
	m := &Manager{opts: opts, log: opts.Logger, now: opts.Now, active: map[string]*active{}}
	if m.log == nil {
		m.log = slog.Default()
	}
	if m.now == nil {
		m.now = time.Now
	}
	return m, nil
}

// defaultBackoff is 1s, 2s, 4s… capped at 30s, each between half and all
// of it at random.
func defaultBackoff(attempt int) time.Duration {
	d := min(time.Second<<min(attempt-1, 5), 30*time.Second)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// HistoryWindow returns how many runs are kept.
func (m *Manager) HistoryWindow() int { return m.opts.HistoryWindow }

// StartOptions describe one run.
type StartOptions struct {
	// Name labels the run, such as the cases file's name.
	Name string
	// Source says who starts it: "cli", "api" or "go" (the default).
	Source string
	// Concurrency is how many cases run at once: 0 means
	// DefaultConcurrency, at most MaxConcurrency.
	Concurrency int
	// OnProgress, when set, receives a copy of the run when it starts,
	// after each case and when it ends, from the run's goroutines, one
	// call at a time.
	OnProgress func(Run)
}

// active is a run this Manager runs.
type active struct {
	mu     sync.Mutex
	run    Run
	reason string // why it stopped early, or ""
	status Status // the status it stopped with, when reason is set

	writeMu    sync.Mutex // orders snapshot writes
	progressMu sync.Mutex // one OnProgress call at a time
	onProgress func(Run)

	stop    context.CancelFunc
	stopped context.Context // done when no new case may start
	done    chan struct{}
}

// snapshot returns a copy of the run.
func (a *active) snapshot() Run {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.run.clone()
}

// halt stops dispatching cases; the first reason given wins.
func (a *active) halt(status Status, reason string) {
	a.mu.Lock()
	if a.reason == "" {
		a.status, a.reason = status, reason
	}
	a.mu.Unlock()
	a.stop()
}

// Start validates the cases, stores the new run's snapshot (status
// running) and runs its cases in the background. It returns the run as
// stored. Errors: a *CaseError or other validation error, ErrBusy,
// ErrClosed, or the store's error when the first snapshot cannot be
// stored (the run does not start).
func (m *Manager) Start(ctx context.Context, cases []Case, so StartOptions) (Run, error) {
	cases = slices.Clone(cases)
	if err := Check(cases); err != nil {
		return Run{}, err
	}
	switch {
	case so.Concurrency == 0:
		so.Concurrency = DefaultConcurrency
	case so.Concurrency < 0 || so.Concurrency > MaxConcurrency:
		return Run{}, fmt.Errorf("%w: concurrency %d is out of range; use 1 to %d", ErrInvalid, so.Concurrency, MaxConcurrency)
	}
	if so.Source == "" {
		so.Source = "go"
	}
	now := m.now().UTC()
	run := Run{
		V: FormatVersion, ID: newRunID(now), Status: StatusRunning, Name: so.Name, Source: so.Source,
		Agent: m.opts.Agent, Model: m.opts.Model, Host: m.opts.Host, HeartbeatAt: now, StartedAt: now,
		Concurrency: so.Concurrency, Counts: Counts{Total: len(cases)}, Cases: make([]CaseResult, len(cases)),
	}
	for i, c := range cases {
		var exp *Expect
		if !c.Expect.IsZero() {
			e := c.Expect
			exp = &e
		}
		run.Cases[i] = CaseResult{Name: c.Name, Input: c.Input, Expect: exp, Status: CasePending}
	}
	stopped, stop := context.WithCancel(context.Background())
	a := &active{run: run, onProgress: so.OnProgress, stop: stop, stopped: stopped, done: make(chan struct{})}

	m.mu.Lock()
	switch {
	case m.stopped:
		m.mu.Unlock()
		stop()
		return Run{}, ErrClosed
	case len(m.active) >= m.opts.MaxRunning:
		m.mu.Unlock()
		stop()
		return Run{}, fmt.Errorf("%w: %d runs are running on this host, the most it runs at once; wait for one to end", ErrBusy, len(m.active))
	}
	m.active[run.ID] = a
	m.wg.Add(1)
	m.mu.Unlock()

	if err := m.save(ctx, a); err != nil {
		m.mu.Lock()
		delete(m.active, run.ID)
		m.mu.Unlock()
		m.wg.Done()
		stop()
		return Run{}, fmt.Errorf("evals: storing the new run: %w", err)
	}
	if err := m.Prune(ctx); err != nil {
		m.log.Warn("evals: pruning runs past the history window failed; they are pruned at the next run", "error", err)
	}
	m.progress(a)
	first := a.snapshot()
	go m.exec(a, cases)
	return first, nil
}

// Run starts a run and waits for it to end. When ctx ends first, the run
// stops (no new case starts), its running cases finish, and it ends
// interrupted.
func (m *Manager) Run(ctx context.Context, cases []Case, so StartOptions) (Run, error) {
	run, err := m.Start(ctx, cases, so)
	if err != nil {
		return Run{}, err
	}
	m.mu.Lock()
	a := m.active[run.ID]
	m.mu.Unlock()
	if a == nil { // already over
		return m.Get(context.WithoutCancel(ctx), run.ID)
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		a.halt(StatusInterrupted, "the run was canceled before every case ran")
		<-a.done
	}
	return a.snapshot(), nil
}

// exec runs a run's cases, at most Concurrency at a time, and ends it.
func (m *Manager) exec(a *active, cases []Case) {
	defer func() {
		m.mu.Lock()
		delete(m.active, a.run.ID)
		m.mu.Unlock()
		close(a.done)
		m.wg.Done()
	}()
	hbDone := make(chan struct{})
	go m.heartbeat(a, hbDone)

	sem := make(chan struct{}, a.run.Concurrency)
	var wg sync.WaitGroup
dispatch:
	for i, c := range cases {
		select {
		case <-a.stopped.Done():
			break dispatch
		case sem <- struct{}{}:
		}
		if a.stopped.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m.runCase(a, i, c)
		}()
	}
	wg.Wait()
	close(hbDone)

	a.mu.Lock()
	r := &a.run
	r.Status = StatusFinished
	if r.Counts.Done < r.Counts.Total || a.reason != "" {
		r.Status, r.Error = a.status, a.reason
		if r.Status == "" {
			r.Status = StatusInterrupted
		}
	}
	r.FinishedAt = m.now().UTC()
	r.HeartbeatAt = r.FinishedAt
	a.mu.Unlock()
	// The last snapshot matters most: retry it.
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := m.save(ctx, a)
		cancel()
		if err == nil {
			break
		}
		if attempt == 3 {
			m.log.Error("evals: storing the run's last snapshot failed; the store keeps an older one, which other hosts will mark interrupted", "runId", a.run.ID, "error", err)
			break
		}
		time.Sleep(time.Duration(attempt) * time.Second)
	}
	m.progress(a)
}

// heartbeat rewrites the run's snapshot every Heartbeat until done closes.
func (m *Manager) heartbeat(a *active, done chan struct{}) {
	t := time.NewTicker(m.opts.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		a.mu.Lock()
		a.run.HeartbeatAt = m.now().UTC()
		a.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), m.opts.Heartbeat)
		if err := m.save(ctx, a); err != nil {
			m.log.Warn("evals: storing the run's heartbeat failed", "runId", a.run.ID, "error", err)
		}
		cancel()
	}
}

// runCase runs one case, retrying on temporary model errors, grades it and
// stores the run's snapshot.
func (m *Manager) runCase(a *active, i int, c Case) {
	a.mu.Lock()
	a.run.Cases[i].Status = CaseRunning
	a.run.Cases[i].StartedAt = m.now().UTC()
	id := a.run.ID
	a.mu.Unlock()
	title := fmt.Sprintf("eval %s: %s", id, c.Name)
	if len(title) > agent.MaxTitleBytes {
		title = title[:agent.MaxTitleBytes]
		for len(title) > 0 && !isRuneStart(title[len(title)-1]) {
			title = title[:len(title)-1]
		}
	}

	res := CaseResult{}
	for attempt := 1; ; attempt++ {
		if !m.waitGate(a.stopped) {
			m.requeue(a, i)
			return
		}
		start := m.now()
		tr, err := m.opts.Sessions.StartSession(m.opts.TurnContext, agent.StartRequest{
			Message: c.Input, ChannelID: agent.EvalChannel, Title: title,
		})
		res.Attempts = attempt
		res.LatencyMs = m.now().Sub(start).Milliseconds()
		if err != nil {
			if errors.Is(err, agent.ErrClosed) {
				a.halt(StatusInterrupted, "the runtime closed before every case ran")
				m.requeue(a, i)
				return
			}
			a.halt(StatusFailed, "a case could not run, so the run stopped: "+err.Error())
			res.Status, res.Error = CaseErrored, "the case could not run: "+err.Error()
			break
		}
		res.SessionID, res.Usage = tr.SessionID, tr.Turn.Usage
		res.Answer = tr.Turn.Result
		if tr.Turn.Status == agent.StatusFailed && tr.Turn.Retryable && attempt < m.opts.MaxAttempts {
			wait := m.opts.Backoff(attempt)
			m.log.Info("evals: the model is rate limited or failing; backing off", "runId", id, "case", c.Name, "attempt", attempt, "wait", wait.String())
			m.pause(wait)
			continue
		}
		if tr.Turn.Status != agent.StatusCompleted {
			res.Status = CaseErrored
			res.Error = "the turn failed: " + tr.Turn.Result
			if attempt > 1 {
				res.Error += fmt.Sprintf(" (after %d attempts)", attempt)
			}
			break
		}
		g, err := grade(m.opts.TurnContext, c, tr.Turn.Result)
		res.Grade = &g
		switch {
		case err != nil:
			res.Status, res.Error = CaseErrored, err.Error()
		case g.Pass:
			res.Status = CasePassed
		default:
			res.Status = CaseFailed
		}
		break
	}
	if len(res.Answer) > MaxAnswerBytes {
		cut := MaxAnswerBytes
		for cut > 0 && !isRuneStart(res.Answer[cut]) {
			cut--
		}
		res.Answer, res.AnswerTruncated = res.Answer[:cut], true
	}

	a.mu.Lock()
	cr := &a.run.Cases[i]
	res.Name, res.Input, res.Expect, res.StartedAt = cr.Name, cr.Input, cr.Expect, cr.StartedAt
	res.FinishedAt = m.now().UTC()
	*cr = res
	cnt := &a.run.Counts
	cnt.Done++
	switch res.Status {
	case CasePassed:
		cnt.Passed++
	case CaseFailed:
		cnt.Failed++
	default:
		cnt.Errored++
	}
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := m.save(ctx, a); err != nil {
		m.log.Warn("evals: storing the run's progress failed; the next write retries", "runId", id, "error", err)
	}
	cancel()
	m.progress(a)
}

// requeue puts a case that did not run back to pending.
func (m *Manager) requeue(a *active, i int) {
	a.mu.Lock()
	a.run.Cases[i].Status = CasePending
	a.run.Cases[i].StartedAt = time.Time{}
	a.mu.Unlock()
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// pause holds new turns for d (a rate limit).
func (m *Manager) pause(d time.Duration) {
	m.gateMu.Lock()
	defer m.gateMu.Unlock()
	if until := m.now().Add(d); until.After(m.gateUntil) {
		m.gateUntil = until
	}
}

// waitGate waits until new turns may start; false when stopped first.
func (m *Manager) waitGate(stopped context.Context) bool {
	for {
		if stopped.Err() != nil {
			return false
		}
		m.gateMu.Lock()
		wait := m.gateUntil.Sub(m.now())
		m.gateMu.Unlock()
		if wait <= 0 {
			return true
		}
		select {
		case <-time.After(wait):
		case <-stopped.Done():
			return false
		}
	}
}

// save stores the run's current snapshot. Writes are made in the order
// the snapshots are taken.
func (m *Manager) save(ctx context.Context, a *active) error {
	a.writeMu.Lock()
	defer a.writeMu.Unlock()
	run := a.snapshot()
	doc, err := json.Marshal(run)
	if err != nil {
		return err
	}
	return m.opts.Table.Put(ctx, run.ID, doc)
}

// progress hands the run to OnProgress.
func (m *Manager) progress(a *active) {
	if a.onProgress == nil {
		return
	}
	a.progressMu.Lock()
	defer a.progressMu.Unlock()
	a.onProgress(a.snapshot())
}

// Stop stops every run of this Manager (no new case starts; running cases
// finish and are graded; the runs end interrupted) and refuses new runs.
// Wait waits for the runs to end.
func (m *Manager) Stop() {
	m.mu.Lock()
	m.stopped = true
	runs := make([]*active, 0, len(m.active))
	for _, a := range m.active {
		runs = append(runs, a)
	}
	m.mu.Unlock()
	for _, a := range runs {
		a.halt(StatusInterrupted, "the server stopped before every case ran")
	}
}

// Wait waits until no run of this Manager runs, or ctx ends.
func (m *Manager) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newRunID returns a run id that sorts by start time: the UTC time to the
// millisecond and a random suffix.
func newRunID(now time.Time) string {
	b := make([]byte, 3)
	rand.Read(b)
	return now.UTC().Format("20060102T150405.000Z") + "-" + hex.EncodeToString(b)
}

// list reads every stored run; runs this Manager runs are replaced by their
// live copy. Records that do not decode are skipped with a warning.
func (m *Manager) list(ctx context.Context) ([]Run, error) {
	var runs []Run
	seen := map[string]bool{}
	for rec, err := range m.opts.Table.List(ctx) {
		if err != nil {
			return nil, err
		}
		r, err := decodeRun(rec.ID, rec.Snapshot)
		if err != nil {
			m.log.Warn("evals: skipping a stored run", "runId", rec.ID, "error", err)
			continue
		}
		seen[r.ID] = true
		runs = append(runs, r)
	}
	m.mu.Lock()
	for i, r := range runs {
		if a := m.active[r.ID]; a != nil {
			runs[i] = a.snapshot()
		}
	}
	for id, a := range m.active {
		if !seen[id] {
			runs = append(runs, a.snapshot())
		}
	}
	m.mu.Unlock()
	slices.SortFunc(runs, func(a, b Run) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	return runs, nil
}

// List returns the stored runs, newest first. A run still marked running
// whose host has stopped sending heartbeats (for StaleAfter) is marked
// interrupted first.
func (m *Manager) List(ctx context.Context) ([]Run, error) {
	runs, err := m.list(ctx)
	if err != nil {
		return nil, err
	}
	for i, r := range runs {
		if m.stale(r) {
			runs[i] = m.interrupt(ctx, r, fmt.Sprintf("its host %s (%s, pid %d) stopped sending heartbeats after %s",
				r.Host.ID, r.Host.Name, r.Host.PID, r.HeartbeatAt.Format(time.RFC3339)))
		}
	}
	return runs, nil
}

// Get returns one run: its live copy when this Manager runs it, else the
// stored snapshot (marked interrupted when its host's heartbeat is stale).
// An unknown id is ErrNotFound.
func (m *Manager) Get(ctx context.Context, id string) (Run, error) {
	m.mu.Lock()
	a := m.active[id]
	m.mu.Unlock()
	if a != nil {
		return a.snapshot(), nil
	}
	runs, err := m.List(ctx)
	if err != nil {
		return Run{}, err
	}
	for _, r := range runs {
		if r.ID == id {
			return r, nil
		}
	}
	return Run{}, fmt.Errorf("%w: %q", ErrNotFound, id)
}

// mine reports whether this Manager runs r now.
func (m *Manager) mine(r Run) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.active[r.ID] != nil
}

// stale reports whether r is marked running, is not run by this Manager,
// and its host's last heartbeat is older than StaleAfter.
func (m *Manager) stale(r Run) bool {
	return r.Status == StatusRunning && !m.mine(r) && m.now().Sub(r.HeartbeatAt) > m.opts.StaleAfter
}

// orphaned reports whether r is marked running by an earlier process on
// this host's state root: that process is gone, since this one holds the
// state root's lock.
func (m *Manager) orphaned(r Run) bool {
	h := m.opts.Host
	return r.Status == StatusRunning && !m.mine(r) &&
		h.ID != "" && r.Host.ID == h.ID && r.Host.Name == h.Name
}

// interrupt marks r interrupted in the store, unless the stored snapshot
// changed since r was read (its host is alive after all, or another host
// marked it first): then it returns the stored snapshot as it is.
func (m *Manager) interrupt(ctx context.Context, r Run, reason string) Run {
	out := r
	err := m.opts.Table.Update(ctx, r.ID, func(old json.RawMessage) (json.RawMessage, error) {
		if old == nil {
			return nil, storage.ErrSkip // deleted meanwhile
		}
		cur, err := decodeRun(r.ID, old)
		if err != nil {
			return nil, err
		}
		out = cur
		if cur.Status != StatusRunning || !cur.HeartbeatAt.Equal(r.HeartbeatAt) {
			return nil, storage.ErrSkip
		}
		cur.Status, cur.Error = StatusInterrupted, reason
		cur.FinishedAt = m.now().UTC()
		for i := range cur.Cases {
			if cur.Cases[i].Status == CaseRunning {
				cur.Cases[i].Status = CasePending
			}
		}
		out = cur
		return json.Marshal(cur)
	})
	if err != nil {
		m.log.Warn("evals: marking a run interrupted failed; it is retried at the next listing", "runId", r.ID, "error", err)
		return r
	}
	if out.Status == StatusInterrupted && r.Status == StatusRunning {
		m.log.Info("evals: marked a run interrupted", "runId", r.ID, "reason", reason)
	}
	return out
}

// Recover is the start-up pass over the stored runs: every run is listed
// back; a run left running by an earlier process on this state root is
// marked interrupted at once, and one whose host (another one) has not
// sent a heartbeat for StaleAfter is marked interrupted too, while runs
// with a live heartbeat are left to their hosts. Runs past the history
// window are then deleted. It returns the runs after the pass, newest
// first.
func (m *Manager) Recover(ctx context.Context) ([]Run, error) {
	runs, err := m.list(ctx)
	if err != nil {
		return nil, err
	}
	for i, r := range runs {
		switch {
		case m.orphaned(r):
			runs[i] = m.interrupt(ctx, r, fmt.Sprintf("its process (pid %d) stopped while it ran; found by the next process on its state root (host id %s)", r.Host.PID, r.Host.ID))
		case m.stale(r):
			runs[i] = m.interrupt(ctx, r, fmt.Sprintf("its host %s (%s, pid %d) stopped sending heartbeats after %s",
				r.Host.ID, r.Host.Name, r.Host.PID, r.HeartbeatAt.Format(time.RFC3339)))
		}
	}
	if err := m.prune(ctx, runs); err != nil {
		return runs, err
	}
	if len(runs) > m.opts.HistoryWindow {
		runs = runs[:m.opts.HistoryWindow]
	}
	return runs, nil
}

// Prune deletes the runs past the history window: all but the
// HistoryWindow newest by start time, running runs excepted.
func (m *Manager) Prune(ctx context.Context) error {
	runs, err := m.list(ctx)
	if err != nil {
		return err
	}
	return m.prune(ctx, runs)
}

func (m *Manager) prune(ctx context.Context, runs []Run) error {
	for _, r := range runs[min(len(runs), m.opts.HistoryWindow):] {
		if r.Status == StatusRunning {
			continue
		}
		if err := m.opts.Table.Delete(ctx, r.ID); err != nil {
			return err
		}
	}
	return nil
}
