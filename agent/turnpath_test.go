package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/abtest"
	"agentkit/agent"
	"agentkit/model"
	"agentkit/tool"
)

// testEffectsFollowTheCommit: when a turn's AfterTurn hook runs, the turn
// is committed: its turn.finished event is what a read of the session
// ends with, on every path.
func testEffectsFollowTheCommit(t *testing.T, open opener) {
	ctx := context.Background()
	type seen struct {
		turn int64
		last agent.Event
		err  error
	}
	hooked := make(chan seen, 2)
	var rt *agent.Runtime
	rt = open(t, agent.Config{Agent: agent.Agent{Hooks: agent.Hooks{
		AfterTurn: func(ctx context.Context, ti agent.TurnInfo) error {
			evs, err := rt.LastEvents(ctx, ti.SessionID, 1)
			s := seen{turn: ti.Turn, err: err}
			if len(evs) == 1 {
				s.last = evs[0]
			}
			hooked <- s
			return nil
		},
	}}})
	res := start(t, rt, "one")
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	for want := int64(1); want <= 2; want++ {
		s := <-hooked
		if s.err != nil || s.turn != want || s.last.Type != agent.EventTurnFinished || s.last.Turn != want {
			t.Errorf("AfterTurn of turn %d (want %d) read the session ending with %s of turn %d (err %v); want its own turn.finished",
				s.turn, want, s.last.Type, s.last.Turn, s.err)
		}
	}
}

// countingObserver counts finished turns.
type countingObserver struct {
	agent.NopObserver
	turns atomic.Int64
}

func (o *countingObserver) TurnFinished(agent.TurnStatus, time.Duration) { o.turns.Add(1) }

// TestARefusedCommitRunsNoEffect: when the commit path refuses a turn's
// commit, the turn fails with its error and none of its effects run: no
// AfterTurn hook, no memory record, no A/B sample, no TurnFinished.
func TestARefusedCommitRunsNoEffect(t *testing.T) {
	ctx := context.Background()
	mem := &recordingMemory{}
	obs := &countingObserver{}
	var hooks atomic.Int64
	exp := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "plain"}, {Name: "warm", Instructions: "Be warm."}}}
	rt := open(t, agent.WithCommitPathDouble(agent.Config{
		Agent: agent.Agent{
			Experiments: []abtest.Experiment{exp},
			Hooks:       agent.Hooks{AfterTurn: func(context.Context, agent.TurnInfo) error { hooks.Add(1); return nil }},
		},
		Memory:   agent.Memory{Backend: mem},
		Observer: obs,
	}))
	refused := errors.New("the commit is refused")
	agent.FenceDouble(rt, 0, refused)
	if _, err := rt.StartSession(ctx, agent.StartRequest{Message: "one"}); !errors.Is(err, refused) {
		t.Fatalf("StartSession: %v; want the commit's error", err)
	}
	if n := hooks.Load(); n != 0 {
		t.Errorf("the AfterTurn hook ran %d times for a turn whose commit was refused", n)
	}
	if n := mem.count(); n != 0 {
		t.Errorf("the memory journal got %d records for a turn whose commit was refused", n)
	}
	if n := obs.turns.Load(); n != 0 {
		t.Errorf("TurnFinished was called %d times for a turn whose commit was refused", n)
	}
	for _, e := range rt.ABReport(ctx).Experiments {
		for _, v := range e.Variants {
			if v.Sessions != 0 {
				t.Errorf("an A/B sample was recorded for a turn whose commit was refused: %+v", v)
			}
		}
	}
	// The same runtime commits once the path accepts again.
	agent.FenceDouble(rt, 0, nil)
	res := start(t, rt, "two")
	if n := agent.DoubleCommits(rt, res.SessionID); n != 1 || hooks.Load() != 1 || mem.count() != 1 || obs.turns.Load() != 1 {
		t.Errorf("after the path accepts: %d commits, %d hooks, %d memory records, %d TurnFinished; want 1 each", n, hooks.Load(), mem.count(), obs.turns.Load())
	}
}

// TestTheTurnChecksItsPathBeforeEveryCall: the turn asks its commit path
// before every model call and every tool call; once the path fences it,
// no further call starts and nothing of the turn is committed.
func TestTheTurnChecksItsPathBeforeEveryCall(t *testing.T) {
	// The script: a tool call, another, then an answer: checks 1 (model),
	// 2 (tool), 3 (model), 4 (tool), 5 (model).
	script := []model.EchoStep{
		{Tool: "count", Args: map[string]any{}},
		{Tool: "count", Args: map[string]any{}},
		{Text: "done"},
	}
	for _, tc := range []struct {
		fenceAt           int
		modelCalls, tools int64
	}{
		{fenceAt: 1, modelCalls: 0, tools: 0},
		{fenceAt: 2, modelCalls: 1, tools: 0},
		{fenceAt: 3, modelCalls: 1, tools: 1},
		{fenceAt: 4, modelCalls: 2, tools: 1},
		{fenceAt: 5, modelCalls: 2, tools: 2},
	} {
		var tools atomic.Int64
		counter := tool.Tool{
			Spec: model.ToolSpec{Name: "count", Parameters: json.RawMessage(`{"type":"object"}`)},
			Run: func(context.Context, *tool.Env, json.RawMessage) (string, error) {
				tools.Add(1)
				return "counted", nil
			},
		}
		m := &countingModel{Model: echoModel(t, script...)}
		rt := open(t, agent.WithCommitPathDouble(agent.Config{Agent: agent.Agent{Model: m, Tools: []tool.Tool{counter}, NoWorkspaceTools: true}}))
		agent.FenceDouble(rt, tc.fenceAt, nil)
		_, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "go"})
		if !errors.Is(err, agent.ErrDoubleFenced) {
			t.Errorf("fenced at check %d: StartSession answered %v; want the fence", tc.fenceAt, err)
		}
		if got := m.calls.Load(); got != tc.modelCalls {
			t.Errorf("fenced at check %d: %d model calls, want %d", tc.fenceAt, got, tc.modelCalls)
		}
		if got := tools.Load(); got != tc.tools {
			t.Errorf("fenced at check %d: %d tool runs, want %d", tc.fenceAt, got, tc.tools)
		}
		if n := agent.DoubleCommits(rt, ""); n != 0 {
			t.Errorf("fenced at check %d: %d turns committed, want none", tc.fenceAt, n)
		}
	}
}

// countingModel counts its calls.
type countingModel struct {
	model.Model
	calls atomic.Int64
}

func (m *countingModel) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	m.calls.Add(1)
	return m.Model.Generate(ctx, req)
}
