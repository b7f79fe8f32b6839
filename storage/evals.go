package storage

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"

	"agentkit/keys"
	"agentkit/kv"
)

// EvalRun is one stored eval-run snapshot. The snapshot's content (status,
// case counts, per-case results) belongs to the evals package; storage keeps
// it as a JSON document.
type EvalRun struct {
	// Agent is the agent the run belongs to.
	Agent string `json:"agent"`
	// ID is the run id; a run is stored once per id, last write wins.
	ID string `json:"runId"`
	// Snapshot is the run snapshot, a JSON document.
	Snapshot json.RawMessage `json:"snapshot"`
}

// EvalTable is a backend-native eval-run table, given as Config.Evals. The
// eval runner (package evals) upserts a run's snapshot when the run starts,
// progresses and finishes, deletes runs past the history window, and lists
// every run of an agent at serve start. Methods are called concurrently.
type EvalTable interface {
	// PutRun creates or replaces the run (run.Agent, run.ID).
	PutRun(ctx context.Context, run EvalRun) error
	// DeleteRun removes a run; a missing run is not an error.
	DeleteRun(ctx context.Context, agent, runID string) error
	// ListRuns yields every run of the agent. An error ends the sequence.
	ListRuns(ctx context.Context, agent string) iter.Seq2[EvalRun, error]
}

// EvalRuns is one agent's eval-run table: the native table, the derived one
// (one key per run, agentkit/v1/{agent}/eval-runs/{runId}), or, for a
// backend without Delete or List, process memory.
type EvalRuns struct{ a *AgentStore }

// Mode says where the runs live.
func (e *EvalRuns) Mode() Mode { return e.a.b.evalsMode }

// Put creates or replaces the snapshot of run runID. The error is returned:
// the caller decides whether a lost snapshot matters.
func (e *EvalRuns) Put(ctx context.Context, runID string, snapshot json.RawMessage) error {
	if runID == "" {
		return errors.New("storage: the eval run id is empty; give the run an id")
	}
	if err := checkJSON("eval run snapshot", snapshot); err != nil {
		return err
	}
	return e.a.b.evals.PutRun(ctx, EvalRun{Agent: e.a.Name(), ID: runID, Snapshot: snapshot})
}

// Delete removes run runID; a missing run is not an error.
func (e *EvalRuns) Delete(ctx context.Context, runID string) error {
	if runID == "" {
		return errors.New("storage: the eval run id is empty; give the run an id")
	}
	return e.a.b.evals.DeleteRun(ctx, e.a.Name(), runID)
}

// List yields every stored run of the agent: for the derived table in key
// order, for the memory table in run id order. An error, such as a record
// written by a newer agentkit (ErrNewerFormat), ends the sequence.
func (e *EvalRuns) List(ctx context.Context) iter.Seq2[EvalRun, error] {
	return e.a.b.evals.ListRuns(ctx, e.a.Name())
}

// derivedEvals stores one key per run over the core; it needs Put, Delete
// and List. On a backend with the CAS group, a run too large for one value
// keeps its case results in pages of their own (evalpages.go).
type derivedEvals struct{ db *kv.DB }

func evalKey(agent, runID string) (string, error) {
	k, err := keys.Agent(agent)
	if err != nil {
		return "", fmt.Errorf("storage: %w", err)
	}
	key, err := k.EvalRun(runID)
	if err != nil {
		return "", fmt.Errorf("storage: %w", err)
	}
	return key, nil
}

// memoryEvals keeps runs in process memory, for backends without Delete or
// List.
type memoryEvals struct {
	mu   sync.Mutex
	runs map[string]map[string]EvalRun // agent → run id → run
}

func newMemoryEvals() *memoryEvals { return &memoryEvals{runs: map[string]map[string]EvalRun{}} }

func (m *memoryEvals) PutRun(ctx context.Context, run EvalRun) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	run.Snapshot = slices.Clone(run.Snapshot)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runs[run.Agent] == nil {
		m.runs[run.Agent] = map[string]EvalRun{}
	}
	m.runs[run.Agent][run.ID] = run
	return nil
}

func (m *memoryEvals) DeleteRun(ctx context.Context, agent, runID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.runs[agent], runID)
	return nil
}

func (m *memoryEvals) ListRuns(ctx context.Context, agent string) iter.Seq2[EvalRun, error] {
	return func(yield func(EvalRun, error) bool) {
		if err := ctx.Err(); err != nil {
			yield(EvalRun{}, err)
			return
		}
		m.mu.Lock()
		runs := make([]EvalRun, 0, len(m.runs[agent]))
		for _, r := range m.runs[agent] {
			r.Snapshot = slices.Clone(r.Snapshot)
			runs = append(runs, r)
		}
		m.mu.Unlock()
		slices.SortFunc(runs, func(a, b EvalRun) int { return cmp.Compare(a.ID, b.ID) })
		for _, r := range runs {
			if !yield(r, nil) {
				return
			}
		}
	}
}

var (
	_ EvalTable = derivedEvals{}
	_ EvalTable = (*memoryEvals)(nil)
)

// unsupported explains a missing capability in storage terms.
func unsupported(b *Binding, what, method string) error {
	return fmt.Errorf("storage: %s needs a backend with %s, and %q has none (it has %s): %w",
		what, method, b.name, b.caps.String(), errors.ErrUnsupported)
}
