package client

import (
	"context"
	"encoding/json"
	"iter"

	"agentkit/kv"
	"agentkit/kv/hostedkv"
	"agentkit/kv/hostedkv/wire"
	"agentkit/storage"
)

// Tables returns the storage service's native eval-run and A/B tables when
// db was opened by the agentkit+http(s) driver, for storage.Config's Evals
// and ABs:
//
//	if evals, abs, ok := client.Tables(db); ok {
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
	return evalTable{s}, abTable{s}, true
}

// evalTable is storage.EvalTable over the service's eval_runs table.
type evalTable struct{ s *hostedkv.Store }

var _ storage.EvalTable = evalTable{}

func (t evalTable) PutRun(ctx context.Context, run storage.EvalRun) error {
	return t.s.PutEvalRun(ctx, run.Agent, run.ID, run.Snapshot)
}

func (t evalTable) DeleteRun(ctx context.Context, agent, runID string) error {
	return t.s.DeleteEvalRun(ctx, agent, runID)
}

func (t evalTable) ListRuns(ctx context.Context, agent string) iter.Seq2[storage.EvalRun, error] {
	return func(yield func(storage.EvalRun, error) bool) {
		for r, err := range t.s.EvalRuns(ctx, agent) {
			if err != nil {
				yield(storage.EvalRun{}, err)
				return
			}
			if !yield(storage.EvalRun{Agent: agent, ID: r.RunID, Snapshot: r.Snapshot}, nil) {
				return
			}
		}
	}
}

// abTable is storage.ABTable and storage.ABSnapshotter over the service's
// ab_samples and ab_snapshots tables.
type abTable struct{ s *hostedkv.Store }

var (
	_ storage.ABTable       = abTable{}
	_ storage.ABSnapshotter = abTable{}
)

// PutSample appends one sample. The table is keyed by agent, experiment,
// session and time, so a resent sample is stored once.
func (t abTable) PutSample(ctx context.Context, x storage.ABSample) error {
	return t.s.PutABSample(ctx, wire.ABSample{Agent: x.Agent, Experiment: x.Experiment, Variant: x.Variant,
		SessionID: x.SessionID, At: x.At, Metrics: x.Metrics})
}

func (t abTable) PutSnapshot(ctx context.Context, agent string, snapshot json.RawMessage) error {
	return t.s.PutABSnapshot(ctx, agent, snapshot)
}

func (t abTable) GetSnapshot(ctx context.Context, agent string) (json.RawMessage, error) {
	return t.s.ABSnapshot(ctx, agent)
}
