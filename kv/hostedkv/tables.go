package hostedkv

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"net/url"

	"agentkit/hosted/wire"
	"agentkit/kv"
	"agentkit/storage"
)

// Tables returns the storage service's native eval-run and A/B tables when
// db was opened by this driver, for storage.Config's Evals and ABs:
//
//	if evals, abs, ok := hostedkv.Tables(db); ok {
//		cfg.Evals, cfg.ABs = evals, abs
//	}
//
// The A/B table also implements storage.ABSnapshotter. ok is false for a
// store of another driver.
func Tables(db *kv.DB) (storage.EvalTable, storage.ABTable, bool) {
	s, ok := storeOf(db)
	if !ok {
		return nil, nil, false
	}
	return s.EvalTable(), s.ABTable(), true
}

func storeOf(db *kv.DB) (*Store, bool) {
	if db == nil {
		return nil, false
	}
	s, ok := db.Backend().(*Store)
	return s, ok
}

// EvalTable returns the namespace's native eval-run table.
func (s *Store) EvalTable() storage.EvalTable { return evalTable{s} }

// ABTable returns the namespace's native A/B table, which also keeps the
// snapshot (storage.ABSnapshotter).
func (s *Store) ABTable() storage.ABTable { return abTable{s} }

// evalTable is storage.EvalTable over the service's eval_runs table.
type evalTable struct{ s *Store }

var _ storage.EvalTable = evalTable{}

func (t evalTable) PutRun(ctx context.Context, run storage.EvalRun) error {
	if !json.Valid(run.Snapshot) {
		return fmt.Errorf("hostedkv: eval run %q: the snapshot is not a JSON document", run.ID)
	}
	return t.s.expect(ctx, call{method: http.MethodPut, resource: "evals", write: true,
		query: url.Values{"agent": {run.Agent}, "run": {run.ID}}, body: run.Snapshot, headers: jsonType},
		http.StatusNoContent, "put eval run "+run.ID)
}

func (t evalTable) DeleteRun(ctx context.Context, agent, runID string) error {
	return t.s.expect(ctx, call{method: http.MethodDelete, resource: "evals", write: true,
		query: url.Values{"agent": {agent}, "run": {runID}}}, http.StatusNoContent, "delete eval run "+runID)
}

func (t evalTable) ListRuns(ctx context.Context, agent string) iter.Seq2[storage.EvalRun, error] {
	return func(yield func(storage.EvalRun, error) bool) {
		q := url.Values{"agent": {agent}}
		for l, err := range t.s.pages(ctx, "evals", q, "", func(l *line) string { return *l.RunID }) {
			if err != nil {
				yield(storage.EvalRun{}, fmt.Errorf("hostedkv: list eval runs: %w", err))
				return
			}
			if !yield(storage.EvalRun{Agent: agent, ID: *l.RunID, Snapshot: l.Snapshot}, nil) {
				return
			}
		}
	}
}

// abTable is storage.ABTable and storage.ABSnapshotter over the service's
// ab_samples and ab_snapshots tables.
type abTable struct{ s *Store }

var (
	_ storage.ABTable       = abTable{}
	_ storage.ABSnapshotter = abTable{}
)

var jsonType = map[string]string{"Content-Type": wire.ContentJSON}

// PutSample appends one sample. The table is keyed by agent, experiment,
// session and time, so a resent sample is stored once.
func (t abTable) PutSample(ctx context.Context, x storage.ABSample) error {
	body, err := json.Marshal(wire.ABSample{Agent: x.Agent, Experiment: x.Experiment, Variant: x.Variant,
		SessionID: x.SessionID, At: x.At, Metrics: x.Metrics})
	if err != nil {
		return fmt.Errorf("hostedkv: encode the A/B sample: %w", err)
	}
	return t.s.expect(ctx, call{method: http.MethodPost, resource: "ab-samples", write: true, body: body, headers: jsonType},
		http.StatusNoContent, "put A/B sample")
}

func (t abTable) PutSnapshot(ctx context.Context, agent string, snapshot json.RawMessage) error {
	return t.s.expect(ctx, call{method: http.MethodPut, resource: "ab-snapshot", write: true,
		query: url.Values{"agent": {agent}}, body: snapshot, headers: jsonType}, http.StatusNoContent, "put A/B snapshot")
}

func (t abTable) GetSnapshot(ctx context.Context, agent string) (json.RawMessage, error) {
	resp, err := t.s.do(ctx, call{method: http.MethodGet, resource: "ab-snapshot", query: url.Values{"agent": {agent}}})
	if err != nil {
		return nil, fmt.Errorf("hostedkv: get A/B snapshot: %w", err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("hostedkv: get A/B snapshot: %w", t.s.errorFrom(resp))
	}
	b, err := readBody(resp)
	if err != nil {
		return nil, fmt.Errorf("hostedkv: get A/B snapshot: %w", err)
	}
	return b, nil
}

// expect sends c and checks the answer's status.
func (s *Store) expect(ctx context.Context, c call, want int, what string) error {
	resp, err := s.do(ctx, c)
	if err != nil {
		return fmt.Errorf("hostedkv: %s: %w", what, err)
	}
	defer drain(resp)
	if resp.StatusCode != want {
		return fmt.Errorf("hostedkv: %s: %w", what, s.errorFrom(resp))
	}
	return nil
}
