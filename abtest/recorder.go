package abtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"agentkit/kv"
	"agentkit/storage"
)

// DefaultFlushInterval is how often Run writes the host's state into the
// snapshot when it changed.
const DefaultFlushInterval = 10 * time.Second

// verifyEvery is how many flush intervals pass between checks that the
// stored snapshot still holds this host's state when nothing changed.
const verifyEvery = 6

// RecorderOptions configures a Recorder.
type RecorderOptions struct {
	// HostID names this host in the snapshot's host marks. Required.
	HostID string
	// Experiments are the agent's experiments, for the figures (an
	// experiment found only in the stored state is still reported).
	Experiments []Experiment
	// KeepSamples keeps every sample in a derived table. By default, once
	// the snapshot holds a session's latest sample, the session's earlier
	// samples (which the latest one includes, samples being cumulative)
	// are deleted, so the derived table keeps one sample per session and
	// experiment. A native table is never pruned.
	KeepSamples bool
	// Logger receives flush failures; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Recorder records the A/B samples of one host and keeps the shared
// snapshot: every sample is a blind append to the A/B table, the host's
// sessions' latest metrics are kept in memory, and Flush merges them into
// the stored snapshot (State.Join), so every host's view survives in it and
// a host with no sessions of its own, such as a replacement, reports
// everyone's figures. It is safe for concurrent use.
type Recorder struct {
	table *storage.ABs
	opts  RecorderOptions
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex
	local   State
	gen     uint64               // bumped by every Record
	flushed uint64               // gen at the last successful flush
	prune   map[[2]string]string // experiment, session → latest sample time (RFC 3339), awaiting pruning
}

// NewRecorder returns a recorder writing to table. It fails when the
// experiments do not validate or HostID is empty.
func NewRecorder(table *storage.ABs, opts RecorderOptions) (*Recorder, error) {
	if table == nil {
		return nil, errors.New("abtest: NewRecorder needs the agent's A/B table (storage.AgentStore.ABs)")
	}
	if opts.HostID == "" {
		return nil, errors.New("abtest: Options.HostID is empty; name the host")
	}
	if err := Validate(opts.Experiments); err != nil {
		return nil, err
	}
	r := &Recorder{table: table, opts: opts, log: opts.Logger, now: opts.Now, local: State{}, prune: map[[2]string]string{}}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r, nil
}

// Experiments returns the configured experiments.
func (r *Recorder) Experiments() []Experiment { return slices.Clone(r.opts.Experiments) }

// Experiment returns the configured experiment named name, or false.
func (r *Recorder) Experiment(name string) (Experiment, bool) {
	for _, e := range r.opts.Experiments {
		if e.Name == name {
			return e, true
		}
	}
	return Experiment{}, false
}

// Metrics returns this host's latest metrics of a session in an
// experiment, or false when the host has none.
func (r *Recorder) Metrics(experiment, sessionID string) (SessionMetrics, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.local[experiment][sessionID]
	return m, ok
}

// Record stores one sample, the session's cumulative metrics after a
// turn, as a blind append (storage.ABs.PutSample: a failure is logged,
// counted and dropped, never failing the turn), and keeps it for the
// snapshot.
func (r *Recorder) Record(ctx context.Context, experiment, sessionID string, m SessionMetrics) {
	if err := m.check(); err != nil {
		r.log.Warn("abtest: dropping an impossible sample", "experiment", experiment, "sessionId", sessionID, "error", err)
		return
	}
	doc, err := json.Marshal(m)
	if err != nil {
		return // unreachable: the metrics are plain data
	}
	r.table.PutSample(ctx, storage.ABSample{
		Experiment: experiment, Variant: m.Variant, SessionID: sessionID,
		At: m.UpdatedAt, Metrics: doc,
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.local.Join(State{experiment: {sessionID: m}}) {
		r.gen++
		r.prune[[2]string{experiment, sessionID}] = m.UpdatedAt.UTC().Format(time.RFC3339Nano)
	}
}

// Flush merges this host's state into the stored snapshot. It writes only
// when the snapshot lacks some of the state (or this host's mark), reads the
// snapshot back and writes again if a concurrent writer dropped the state
// (possible over a native snapshot table or a backend without CAS; over the
// derived table with CAS, storage.ABs.UpdateSnapshot never loses a write).
// Then, unless KeepSamples, it prunes the samples the snapshot now holds.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	local, gen, prune := r.local.Clone(), r.gen, maps.Clone(r.prune)
	r.mu.Unlock()
	if local.Sessions() == 0 {
		return nil
	}
	var err error
	for attempt := 1; attempt <= 4; attempt++ {
		if err = r.write(ctx, local); err != nil {
			return fmt.Errorf("abtest: writing the A/B snapshot: %w", err)
		}
		var snap Snapshot
		snap, err = r.readSnapshot(ctx)
		if errors.Is(err, errors.ErrUnsupported) {
			err = nil // the backend cannot Get: the write is all there is
			break
		}
		if err == nil && snap.Sessions.Includes(local) {
			break
		}
		if err == nil {
			err = errors.New("another host's write replaced this host's state in the A/B snapshot")
		}
		select {
		case <-time.After(time.Duration(rand.Int64N(int64(attempt) * int64(20*time.Millisecond)))):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return fmt.Errorf("abtest: the A/B snapshot: %w", err)
	}
	r.mu.Lock()
	r.flushed = max(r.flushed, gen)
	r.mu.Unlock()
	if !r.opts.KeepSamples {
		r.pruneSamples(ctx, prune)
	}
	return nil
}

// write merges local into the stored snapshot, unless it already holds it.
func (r *Recorder) write(ctx context.Context, local State) error {
	return r.table.UpdateSnapshot(ctx, func(old json.RawMessage) (json.RawMessage, error) {
		snap, err := DecodeSnapshot(old)
		if err != nil {
			return nil, err
		}
		if _, marked := snap.Hosts[r.opts.HostID]; marked && snap.Sessions.Includes(local) {
			return nil, storage.ErrSkip
		}
		snap.Sessions.Join(local)
		now := r.now().UTC()
		snap.V = SnapshotVersion
		snap.UpdatedAt = now
		snap.Hosts[r.opts.HostID] = HostMark{UpdatedAt: now, Sessions: local.Sessions()}
		snap.pruneHosts()
		snap.Figures = Figures(r.opts.Experiments, snap.Sessions)
		return json.Marshal(snap)
	})
}

// pruneSamples deletes the samples older than each session's latest one.
func (r *Recorder) pruneSamples(ctx context.Context, prune map[[2]string]string) {
	for k, at := range prune {
		t, _ := time.Parse(time.RFC3339Nano, at)
		if _, err := r.table.PruneSamples(ctx, k[0], k[1], t); err != nil {
			r.log.Warn("abtest: pruning superseded samples failed; they stay and are retried after the next flush", "experiment", k[0], "sessionId", k[1], "error", err)
			continue
		}
		r.mu.Lock()
		if r.prune[k] == at {
			delete(r.prune, k)
		}
		r.mu.Unlock()
	}
}

// readSnapshot reads and decodes the stored snapshot; none stored is the
// empty snapshot. A backend that cannot Get gives an error matching
// errors.ErrUnsupported.
func (r *Recorder) readSnapshot(ctx context.Context) (Snapshot, error) {
	data, err := r.table.GetSnapshot(ctx)
	if errors.Is(err, kv.ErrNotFound) {
		return DecodeSnapshot(nil)
	}
	if err != nil {
		return Snapshot{}, err
	}
	return DecodeSnapshot(data)
}

// Run flushes every interval (DefaultFlushInterval when not positive)
// while the state changed, checks now and then that the snapshot still
// holds it, and returns when ctx ends, without a last flush: call Flush
// once the host's turns are over.
func (r *Recorder) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultFlushInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		dirty := r.gen != r.flushed
		r.mu.Unlock()
		if !dirty && tick%verifyEvery != 0 {
			continue
		}
		if err := r.Flush(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("abtest: flushing the A/B snapshot failed; retrying at the next interval", "error", err)
		}
	}
}

// Report is GET /v1/abs: the figures merged from the stored snapshot and
// this host's state.
type Report struct {
	// Experiments are the figures, configured experiments first.
	Experiments []ExperimentFigures `json:"experiments"`
	// Hosts are the hosts whose state the snapshot holds, newest first;
	// this host is marked Self.
	Hosts []HostReport `json:"hosts"`
	// SnapshotUpdatedAt is when the stored snapshot was last written.
	SnapshotUpdatedAt time.Time `json:"snapshotUpdatedAt,omitzero"`
	// SnapshotError says why the stored snapshot could not be read; the
	// figures are then this host's alone.
	SnapshotError string `json:"snapshotError,omitempty"`
}

// HostReport is one host of the Report.
type HostReport struct {
	ID string `json:"id"`
	HostMark
	// Self is true for the host answering.
	Self bool `json:"self"`
}

// Report returns the figures of the stored snapshot merged with this host's
// latest state.
func (r *Recorder) Report(ctx context.Context) Report {
	r.mu.Lock()
	local := r.local.Clone()
	r.mu.Unlock()
	rep := Report{Hosts: []HostReport{}}
	merged := State{}
	snap, err := r.readSnapshot(ctx)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		rep.SnapshotError = "the store cannot Get, so the stored snapshot cannot be read back: these figures are this host's alone"
	case err != nil:
		rep.SnapshotError = "reading the stored snapshot failed, so these figures are this host's alone: " + err.Error()
	default:
		merged.Join(snap.Sessions)
		rep.SnapshotUpdatedAt = snap.UpdatedAt
		for id, h := range snap.Hosts {
			if id != r.opts.HostID {
				rep.Hosts = append(rep.Hosts, HostReport{ID: id, HostMark: h})
			}
		}
	}
	merged.Join(local)
	rep.Hosts = append(rep.Hosts, HostReport{ID: r.opts.HostID, HostMark: HostMark{UpdatedAt: r.now().UTC(), Sessions: local.Sessions()}, Self: true})
	slices.SortFunc(rep.Hosts, func(a, b HostReport) int { return b.UpdatedAt.Compare(a.UpdatedAt) })
	rep.Experiments = Figures(r.opts.Experiments, merged)
	if rep.Experiments == nil {
		rep.Experiments = []ExperimentFigures{}
	}
	return rep
}
