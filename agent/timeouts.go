package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentkit/model"
	"agentkit/tool"
)

// Defaults of Timeouts.
const (
	// DefaultTurnTimeout bounds a turn when Timeouts.Turn is zero.
	DefaultTurnTimeout = 10 * time.Minute
	// DefaultToolTimeout bounds a tool call when Timeouts.Tool is zero.
	DefaultToolTimeout = 2 * time.Minute
)

// Timeouts bound how long a turn runs. A turn that reaches its bound is
// stopped and recorded as failed; a tool call that reaches its bound
// returns an error to the model and the turn goes on. The zero value means
// the defaults.
type Timeouts struct {
	// Turn bounds a whole turn, from the moment it holds its session to its
	// final answer: model calls, tool calls and all. Zero means
	// DefaultTurnTimeout.
	Turn time.Duration
	// Tool bounds one tool call. Zero means DefaultToolTimeout.
	Tool time.Duration
}

func (t Timeouts) check() error {
	if t.Turn < 0 || t.Tool < 0 {
		return fmt.Errorf("agent: Config.Timeouts %+v has a negative duration; use positive durations, or zero for the defaults (turn %v, tool %v)", t, DefaultTurnTimeout, DefaultToolTimeout)
	}
	return nil
}

// withDefaults fills zero fields with the defaults.
func (t Timeouts) withDefaults() Timeouts {
	if t.Turn == 0 {
		t.Turn = DefaultTurnTimeout
	}
	if t.Tool == 0 {
		t.Tool = DefaultToolTimeout
	}
	return t
}

// timeoutError is the cause of a context that reached a Timeouts bound.
type timeoutError struct {
	what  string // "turn" or "tool"
	limit time.Duration
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("the %s timeout of %v passed", e.what, e.limit)
}

// turnContext bounds a turn by the turn timeout.
func (r *Runtime) turnContext(ctx context.Context) (context.Context, context.CancelFunc) {
	limit := r.cfg.Timeouts.withDefaults().Turn
	return context.WithTimeoutCause(ctx, limit, &timeoutError{what: "turn", limit: limit})
}

// stopMessage says why a turn's context ended: the failure message of a
// turn that was stopped.
func stopMessage(ctx context.Context) string {
	cause := context.Cause(ctx)
	var te *timeoutError
	switch {
	case errors.As(cause, &te) && te.what == "turn":
		return fmt.Sprintf("the turn did not finish within its %v limit and was stopped; raise the turn timeout (timeouts.turn in agentkit.yaml, --turn-timeout) or ask for less in one turn", te.limit)
	case errors.Is(cause, context.DeadlineExceeded):
		return "the turn's deadline passed before it finished"
	case errors.Is(cause, context.Canceled):
		return "the turn was canceled before it finished"
	case cause == nil:
		return "the turn was stopped"
	}
	return "the turn was stopped: " + cause.Error()
}

// callTool runs one tool call bounded by the tool timeout and by ctx. A
// tool that does not return when its context ends is left behind: the
// turn goes on without it, with an error in its place (and the workspace
// it holds is closed when the turn ends).
func (t *turn) callTool(ctx context.Context, env *tool.Env, name string, run func(context.Context, *tool.Env, json.RawMessage) (string, error), args json.RawMessage) (string, bool) {
	limit := t.r.cfg.Timeouts.withDefaults().Tool
	tctx, cancel := context.WithTimeoutCause(ctx, limit, &timeoutError{what: "tool", limit: limit})
	defer cancel()
	type result struct {
		out      string
		err      error
		panicked bool
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				t.r.logger(env.SessionID).Error("agent: tool panicked", "tool", name, "panic", p)
				done <- result{panicked: true}
			}
		}()
		out, err := run(tctx, env, args)
		done <- result{out: out, err: err}
	}()
	var res result
	select {
	case res = <-done:
	case <-tctx.Done():
		select {
		case res = <-done:
		default:
			t.r.logger(env.SessionID).Warn("agent: a tool did not return when its context ended; the turn goes on without it",
				"tool", name, "cause", context.Cause(tctx))
			return toolStopped(name, tctx), true
		}
	}
	switch {
	case res.panicked:
		return fmt.Sprintf("error: the tool %s failed unexpectedly", name), true
	case res.err != nil && tctx.Err() != nil:
		return toolStopped(name, tctx), true
	case res.err != nil:
		return "error: " + res.err.Error(), true
	}
	return res.out, false
}

// toolStopped is the result the model sees for a tool call whose context
// ended.
func toolStopped(name string, ctx context.Context) string {
	var te *timeoutError
	if errors.As(context.Cause(ctx), &te) && te.what == "tool" {
		return fmt.Sprintf("error: the tool %s did not finish within %v (the tool timeout) and was stopped; try a smaller task", name, te.limit)
	}
	return fmt.Sprintf("error: the tool %s was stopped: %s", name, stopMessage(ctx))
}

// generate calls the model, turning a panic into an error. A model that
// does not return when ctx ends is left behind, and ctx's cause returned.
func generate(ctx context.Context, m model.Model, req model.Request) (model.Response, error) {
	type result struct {
		resp model.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{err: fmt.Errorf("the model panicked: %v", p)}
			}
		}()
		resp, err := m.Generate(ctx, req)
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		return r.resp, r.err
	case <-ctx.Done():
		select {
		case r := <-done:
			return r.resp, r.err
		default:
			return model.Response{}, context.Cause(ctx)
		}
	}
}
