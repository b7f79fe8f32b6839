package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/model"
	"agentkit/tool"
)

// stuckTool is a tool that ignores its context and blocks until release
// is called: the worst a custom tool can do. Tests defer release after
// opening the runtime, so it runs before the runtime's Close.
func stuckTool(entered chan<- struct{}) (tool.Tool, func()) {
	release := make(chan struct{})
	return tool.Tool{
		Spec: model.ToolSpec{Name: "stuck", Description: "never returns", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(context.Context, *tool.Env, json.RawMessage) (string, error) {
			if entered != nil {
				entered <- struct{}{}
			}
			<-release
			return "released", nil
		},
	}, func() { close(release) }
}

// within fails the test when f has not returned in a generous bound, so a
// wedged turn fails the test instead of hanging it.
func within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not return within 30s", what)
	}
	var zero T
	return zero
}

type turnOutcome struct {
	res agent.TurnResult
	err error
}

func lastEvent(t *testing.T, rt *agent.Runtime, sessionID string) agent.Event {
	t.Helper()
	evs, err := rt.LastEvents(context.Background(), sessionID, 1)
	if err != nil || len(evs) != 1 {
		t.Fatalf("LastEvents: %v, %v", evs, err)
	}
	return evs[0]
}

// TestToolTimeoutStopsAToolThatIgnoresCancellation: the tool call ends at
// the tool timeout with an error the model sees, and the turn goes on.
func TestToolTimeoutStopsAToolThatIgnoresCancellation(t *testing.T) {
	m := echoModel(t, model.EchoStep{Tool: "stuck"}, model.EchoStep{Text: "after: {{.LastToolResult}}"})
	stuck, release := stuckTool(nil)
	rt := open(t, agent.Config{
		Agent:    agent.Agent{Model: m, Tools: []tool.Tool{stuck}},
		Timeouts: agent.Timeouts{Tool: 100 * time.Millisecond},
	})
	t.Cleanup(release)
	out := within(t, "a turn with a stuck tool", func() turnOutcome {
		res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "go"})
		return turnOutcome{res, err}
	})
	if out.err != nil || out.res.Turn.Status != agent.StatusCompleted || !strings.Contains(out.res.Turn.Result, "did not finish within 100ms") {
		t.Fatalf("the turn: %+v, %v; want it completed with the tool's timeout error", out.res, out.err)
	}
	evs, _ := rt.Events(context.Background(), out.res.SessionID, 0, 0)
	found := false
	for _, ev := range evs.Events {
		if ev.Type == agent.EventToolResult && ev.Tool == "stuck" && ev.IsError && strings.Contains(ev.Output, "timeout") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no tool.result error for the stuck tool among %+v", evs.Events)
	}
}

// TestTurnTimeoutEndsTheTurnFailed: a model call that never returns (and
// ignores its context) ends at the turn timeout; the turn is recorded as
// failed and the session takes the next turn.
func TestTurnTimeoutEndsTheTurnFailed(t *testing.T) {
	var calls atomic.Int64
	block := make(chan struct{})
	m := &recorder{answer: func(req model.Request) (model.Response, error) {
		if calls.Add(1) == 1 {
			<-block
		}
		return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "answered"}}, nil
	}}
	rt := open(t, agent.Config{Agent: agent.Agent{Model: m}, Timeouts: agent.Timeouts{Turn: 200 * time.Millisecond}})
	t.Cleanup(func() { close(block) })
	out := within(t, "a turn whose model never answers", func() turnOutcome {
		res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "go"})
		return turnOutcome{res, err}
	})
	if out.err != nil || out.res.Turn.Status != agent.StatusFailed || !strings.Contains(out.res.Turn.Result, "did not finish within its 200ms limit") {
		t.Fatalf("the turn: %+v, %v; want it failed on the turn timeout", out.res, out.err)
	}
	if ev := lastEvent(t, rt, out.res.SessionID); ev.Type != agent.EventTurnFinished || ev.Status != agent.StatusFailed {
		t.Fatalf("the last event is %+v; want turn.finished failed", ev)
	}
	res, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: out.res.ContinuationToken, Message: "again"})
	if err != nil || res.Turn.Result != "answered" {
		t.Fatalf("the next turn: %+v, %v", res, err)
	}
}

// TestCanceledTurnEndsWithItsFailedEvent cancels a turn's context while a
// tool that ignores it runs: the turn ends at once, failed, and says so in
// its turn.finished event.
func TestCanceledTurnEndsWithItsFailedEvent(t *testing.T) {
	entered := make(chan struct{}, 1)
	m := echoModel(t, model.EchoStep{Tool: "stuck"}, model.EchoStep{Text: "unreachable"})
	stuck, release := stuckTool(entered)
	rt := open(t, agent.Config{Agent: agent.Agent{Model: m, Tools: []tool.Tool{stuck}}})
	t.Cleanup(release)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-entered
		cancel(errors.New("the operator pulled the plug"))
	}()
	out := within(t, "a canceled turn", func() turnOutcome {
		res, err := rt.StartSession(ctx, agent.StartRequest{Message: "go"})
		return turnOutcome{res, err}
	})
	if out.err != nil || out.res.Turn.Status != agent.StatusFailed || !strings.Contains(out.res.Turn.Result, "the operator pulled the plug") {
		t.Fatalf("the canceled turn: %+v, %v; want it failed, naming the cause", out.res, out.err)
	}
	ev := lastEvent(t, rt, out.res.SessionID)
	if ev.Type != agent.EventTurnFinished || ev.Status != agent.StatusFailed || ev.Result != out.res.Turn.Result {
		t.Fatalf("the last event is %+v; want turn.finished failed with the result", ev)
	}
}

func TestNegativeTimeoutsAreRefused(t *testing.T) {
	for _, to := range []agent.Timeouts{{Turn: -time.Second}, {Tool: -1}} {
		_, err := agent.Open(context.Background(), agent.Config{Agent: agent.Agent{Name: "x", Model: echoModel(t)}, StateRoot: t.TempDir(), Timeouts: to})
		if err == nil || !strings.Contains(err.Error(), "Timeouts") {
			t.Errorf("Open with %+v: %v; want an error naming Timeouts", to, err)
		}
	}
}
