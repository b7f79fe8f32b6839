package storetest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"sync"

	"agentkit/kv"
	"agentkit/storage"
)

// Native is a backend-native eval-run and A/B table kept in memory, as a
// program would write one over its own database: it implements
// storage.EvalTable, storage.ABTable and storage.ABSnapshotter, with the
// last-write-wins snapshot such a table typically has (no compare-and-set).
// Give it as storage.Config.Evals and .ABs (agent: through a kv.Funcs
// backend). It is safe for concurrent use.
type Native struct {
	mu        sync.Mutex
	runs      map[string]map[string]json.RawMessage // agent → run id → snapshot
	samples   []storage.ABSample
	snapshots map[string]json.RawMessage
	calls     map[string]int
}

// NewNative returns an empty native table.
func NewNative() *Native {
	return &Native{runs: map[string]map[string]json.RawMessage{}, snapshots: map[string]json.RawMessage{}, calls: map[string]int{}}
}

var (
	_ storage.EvalTable     = (*Native)(nil)
	_ storage.ABTable       = (*Native)(nil)
	_ storage.ABSnapshotter = (*Native)(nil)
)

// Calls returns how many times each method ran.
func (n *Native) Calls() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]int{}
	for k, v := range n.calls {
		out[k] = v
	}
	return out
}

// PutRun stores a run snapshot.
func (n *Native) PutRun(ctx context.Context, run storage.EvalRun) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls["PutRun"]++
	if n.runs[run.Agent] == nil {
		n.runs[run.Agent] = map[string]json.RawMessage{}
	}
	n.runs[run.Agent][run.ID] = slices.Clone(run.Snapshot)
	return nil
}

// DeleteRun removes a run.
func (n *Native) DeleteRun(ctx context.Context, agent, runID string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls["DeleteRun"]++
	delete(n.runs[agent], runID)
	return nil
}

// ListRuns yields the agent's runs by id.
func (n *Native) ListRuns(ctx context.Context, agent string) iter.Seq2[storage.EvalRun, error] {
	return func(yield func(storage.EvalRun, error) bool) {
		n.mu.Lock()
		n.calls["ListRuns"]++
		var runs []storage.EvalRun
		for id, s := range n.runs[agent] {
			runs = append(runs, storage.EvalRun{Agent: agent, ID: id, Snapshot: slices.Clone(s)})
		}
		n.mu.Unlock()
		slices.SortFunc(runs, func(a, b storage.EvalRun) int { return cmp.Compare(a.ID, b.ID) })
		for _, r := range runs {
			if !yield(r, nil) {
				return
			}
		}
	}
}

// RunIDs returns the ids of the agent's stored runs, sorted.
func (n *Native) RunIDs(agent string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ids []string
	for id := range n.runs[agent] {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// PutSample appends a sample.
func (n *Native) PutSample(ctx context.Context, s storage.ABSample) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls["PutSample"]++
	s.Metrics = slices.Clone(s.Metrics)
	n.samples = append(n.samples, s)
	return nil
}

// Samples returns the samples stored, in order.
func (n *Native) Samples() []storage.ABSample {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.samples)
}

// PutSnapshot replaces the agent's snapshot: last write wins.
func (n *Native) PutSnapshot(ctx context.Context, agent string, snapshot json.RawMessage) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls["PutSnapshot"]++
	n.snapshots[agent] = slices.Clone(snapshot)
	return nil
}

// GetSnapshot returns the agent's snapshot.
func (n *Native) GetSnapshot(ctx context.Context, agent string) (json.RawMessage, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls["GetSnapshot"]++
	s, ok := n.snapshots[agent]
	if !ok {
		return nil, fmt.Errorf("storetest: no snapshot of %q: %w", agent, kv.ErrNotFound)
	}
	return slices.Clone(s), nil
}
