package evals_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"agentkit/agent"
	"agentkit/evals"
	"agentkit/internal/storetest"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/storage"
)

const agentName = "eval-agent"

// sessionsFunc runs turns with a function: a fake runtime for the tests
// that control turns exactly (grading, concurrency).
type sessionsFunc func(ctx context.Context, req agent.StartRequest) (agent.TurnResult, error)

func (f sessionsFunc) StartSession(ctx context.Context, req agent.StartRequest) (agent.TurnResult, error) {
	return f(ctx, req)
}

// fixedAnswer completes every turn with answer.
func fixedAnswer(answer string) evals.Sessions {
	return sessionsFunc(func(ctx context.Context, req agent.StartRequest) (agent.TurnResult, error) {
		return agent.TurnResult{SessionID: "s-" + req.Message, Turn: agent.Turn{Status: agent.StatusCompleted, Result: answer}}, nil
	})
}

// table binds the eval-run table of agentName over cfg.
func table(t *testing.T, cfg storage.Config) *storage.EvalRuns {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	b, err := storage.Define(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Agent(agentName)
	if err != nil {
		t.Fatal(err)
	}
	return a.Evals()
}

func memTable(t *testing.T) *storage.EvalRuns {
	return table(t, storage.Config{Backend: memkv.New()})
}

// runTables is one way of storing runs: open() returns a new host's handle
// on the same table.
type runTables struct {
	name string
	open func(t *testing.T) *storage.EvalRuns
}

func allTables(t *testing.T) []runTables {
	var out []runTables
	for _, s := range storetest.Stores(t) {
		out = append(out, runTables{s.Name, func(t *testing.T) *storage.EvalRuns {
			return table(t, storage.Config{Backend: storetest.Open(t, s.URL)})
		}})
	}
	n := storetest.NewNative()
	out = append(out, runTables{"native", func(t *testing.T) *storage.EvalRuns {
		return table(t, storage.Config{Backend: memkv.New(), Evals: n})
	}})
	return out
}

func manager(t *testing.T, opts evals.Options) *evals.Manager {
	t.Helper()
	if opts.Table == nil {
		opts.Table = memTable(t)
	}
	if opts.Host.ID == "" {
		opts.Host = evals.Host{ID: "test-host", Name: "test-machine", PID: 1}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := evals.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Stop()
		m.Wait(context.Background())
	})
	return m
}

// runCases runs cases to the end on a fresh manager.
func runCases(t *testing.T, cases []evals.Case, s evals.Sessions) evals.Run {
	t.Helper()
	run, err := manager(t, evals.Options{Sessions: s}).Run(context.Background(), cases, evals.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// runtime opens a runtime (memory store) answering with m.
func runtime(t *testing.T, m model.Model) *agent.Runtime {
	t.Helper()
	rt, err := agent.Open(context.Background(), agent.Config{
		Agent:     agent.Agent{Name: agentName, Model: m},
		StateRoot: t.TempDir(), Store: memkv.New(), Memory: agent.Memory{Off: true},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// stored returns the stored runs by id.
func stored(t *testing.T, tbl *storage.EvalRuns) map[string]evals.Run {
	t.Helper()
	out := map[string]evals.Run{}
	for r, err := range tbl.List(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		var run evals.Run
		if err := json.Unmarshal(r.Snapshot, &run); err != nil {
			t.Fatal(err)
		}
		out[r.ID] = run
	}
	return out
}

func ptr(s string) *string { return &s }
