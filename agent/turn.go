package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"agentkit/abtest"
	"agentkit/agent/sessiondb"
	"agentkit/model"
	"agentkit/tool"
	"agentkit/workspace"
)

// turnRequest is one turn to run.
type turnRequest struct {
	sessionID string
	message   string
	files     map[string]string
	source    string
	note      string // the first-prompt note (first turn only)
	onEvent   func(Event)
	enrolled  map[string]string // A/B variants (first turn only)
	idem      *Idempotency      // the request's Idempotency-Key, recorded with turn.started
	noWait    bool              // a busy session is ErrBusy at once
}

// turn is a running turn.
type turn struct {
	r       *Runtime
	st      *sessionState
	meta    sessiondb.Meta
	number  int64
	onEvent func(Event)
	ctx     context.Context // for local writes: not canceled with the caller
	model   model.Model     // the agent's, or the session's A/B variant's
	failure error           // the model error that failed the turn, if one did
}

// runTurn runs one turn of a session: it waits for the session's previous
// turn, brings the local copy up to the store's (the mirror's beforeTurn),
// records turn.started, runs the model/tool loop, records turn.finished,
// flushes the mirror and runs the AfterTurn hooks.
func (r *Runtime) runTurn(ctx context.Context, req turnRequest) (TurnResult, error) {
	lockCtx := ctx
	if req.noWait {
		lockCtx = noWaitContext(ctx)
	}
	st, release, err := r.lockSession(lockCtx, req.sessionID)
	if err != nil {
		return TurnResult{}, err
	}
	defer release()
	wctx := context.WithoutCancel(ctx)
	if err := r.mirror.beforeTurn(wctx, st, req.sessionID); err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
		return TurnResult{}, err
	}
	ctx, cancel := r.turnContext(ctx)
	defer cancel()
	m, err := r.db.Get(wctx, req.sessionID)
	if errors.Is(err, sessiondb.ErrNotFound) {
		return TurnResult{}, fmt.Errorf("%w: %s (deleted while the turn waited)", ErrSessionNotFound, req.sessionID)
	}
	if err != nil {
		return TurnResult{}, err
	}
	history, note, err := r.history(wctx, m.ID)
	if err != nil {
		return TurnResult{}, err
	}
	if m.Turns == 0 {
		note = req.note
	}
	vs, err := r.setupFor(wctx, m.ID, m.Turns == 0, req.enrolled)
	if err != nil {
		return TurnResult{}, err
	}
	dir := r.workspaceDir(m.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return TurnResult{}, fmt.Errorf("agent: the session workspace: %w", err)
	}
	ws, err := os.OpenRoot(dir)
	if err != nil {
		return TurnResult{}, fmt.Errorf("agent: the session workspace: %w", err)
	}
	defer ws.Close()
	if m.Turns == 0 && len(r.agent.WorkspaceSeed) > 0 {
		if err := workspace.Seed(ws, r.agent.WorkspaceSeed); err != nil {
			return TurnResult{}, fmt.Errorf("agent: seeding the workspace: %w", err)
		}
	}
	if len(req.files) > 0 {
		if err := workspace.Seed(ws, req.files); err != nil {
			return TurnResult{}, workspaceFilesError(err)
		}
	}

	started := r.now()
	t := &turn{r: r, st: st, meta: m, number: m.Turns + 1, onEvent: req.onEvent, ctx: wctx, model: vs.model}
	t.meta.Turns = t.number
	startEv := Event{Type: EventTurnStarted, Source: req.source, Message: req.message, Note: note, Idempotency: req.idem}
	if m.Turns == 0 {
		startEv.Experiments = vs.enrolled
	}
	if err := t.record(startEv); err != nil {
		return TurnResult{}, err
	}

	var msgs []model.Message
	if sys := systemPrompt(vs.instructions, note); sys != "" {
		msgs = append(msgs, model.Message{Role: model.RoleSystem, Content: sys})
	}
	msgs = append(msgs, history...)
	msgs = append(msgs, model.Message{Role: model.RoleUser, Content: req.message})
	env := &tool.Env{
		SessionID: m.ID,
		ChannelID: m.ChannelID,
		Workspace: ws,
		KV:        r.hostKV,
		Files:     r.files,
		Reminders: r.reminders.forSession(m.ID),
		Actor:     r.toolActor(m.ID),
		Logger:    r.logger(m.ID),
	}
	status, result, usage, loopErr := t.loop(abtest.WithOptions(ctx, vs.options), env, msgs)
	if loopErr != nil {
		return TurnResult{}, loopErr
	}

	finished := r.now()
	dur := finished.Sub(started)
	t.meta.LastStatus = string(status)
	u := usage
	if err := t.record(Event{Type: EventTurnFinished, Status: status, Result: result, Usage: &u, DurationMS: dur.Milliseconds()}); err != nil {
		return TurnResult{}, err
	}
	r.mirror.afterTurn(wctx, st, m.ID)
	r.afterTurn(wctx, TurnInfo{
		AgentName: r.agent.Name, StateRoot: r.root.Dir(),
		SessionID: m.ID, ChannelID: m.ChannelID, Title: m.Title,
		Turn: t.number, Source: req.source, UserMessage: req.message,
		Status: status, Result: result, Usage: usage,
		StartedAt: started, FinishedAt: finished,
	})
	r.recordABs(wctx, vs, m.ID, t.number, turnOf(status, &usage, dur, finished))
	r.obs.TurnFinished(status, dur)
	return TurnResult{
		SessionID:         m.ID,
		ContinuationToken: m.Token,
		Turn:              Turn{Status: status, Result: result, Usage: usage, Retryable: temporary(t.failure)},
	}, nil
}

// loop asks the model, runs the tools it calls and feeds the results back
// until it answers with text or the step limit is reached. Only a failure
// to record an event is returned as an error; everything else ends the
// turn with a status.
func (t *turn) loop(ctx context.Context, env *tool.Env, msgs []model.Message) (TurnStatus, string, model.Usage, error) {
	r := t.r
	var usage model.Usage
	for step := 1; step <= r.maxSteps; step++ {
		if ctx.Err() != nil {
			return StatusFailed, stopMessage(ctx), usage, nil
		}
		resp, err := generate(ctx, t.model, model.Request{Messages: msgs, Tools: r.specs})
		if err != nil {
			if ctx.Err() != nil {
				return StatusFailed, stopMessage(ctx), usage, nil
			}
			t.failure = err
			return StatusFailed, "model error: " + err.Error(), usage, nil
		}
		usage = usage.Add(resp.Usage)
		u := resp.Usage
		calls := resp.Message.ToolCalls
		for i := range calls {
			if calls[i].ID == "" {
				calls[i].ID = fmt.Sprintf("call_%d_%d", step, i+1)
			}
		}
		logged := make([]model.ToolCall, len(calls))
		for i, c := range calls {
			logged[i] = c
			logged[i].Arguments = validJSON(c.Arguments)
		}
		if err := t.record(Event{Type: EventModelCall, Step: step, Text: resp.Message.Content, ToolCalls: logged, Usage: &u}); err != nil {
			return "", "", usage, err
		}
		if len(calls) == 0 {
			return StatusCompleted, resp.Message.Content, usage, nil
		}
		msgs = append(msgs, model.Message{Role: model.RoleAssistant, Content: resp.Message.Content, ToolCalls: calls})
		for _, call := range calls {
			if ctx.Err() != nil {
				return StatusFailed, stopMessage(ctx), usage, nil
			}
			args := call.Arguments
			if len(args) == 0 {
				args = json.RawMessage("{}")
			}
			if err := t.record(Event{Type: EventToolCall, Step: step, ToolCallID: call.ID, Tool: call.Name, Arguments: validJSON(args)}); err != nil {
				return "", "", usage, err
			}
			out, isErr := t.runTool(ctx, env, call.Name, args)
			if err := t.record(Event{Type: EventToolResult, Step: step, ToolCallID: call.ID, Tool: call.Name, Output: out, IsError: isErr}); err != nil {
				return "", "", usage, err
			}
			msgs = append(msgs, model.Message{Role: model.RoleTool, ToolCallID: call.ID, Name: call.Name, Content: out})
		}
	}
	return StatusFailed, fmt.Sprintf("the turn reached the step limit of %d model calls without a final answer; raise the agent's MaxSteps or ask for less in one turn", r.maxSteps), usage, nil
}

// validJSON returns args, or args as a JSON string when they are not valid
// JSON, so the event stays valid JSON.
func validJSON(args json.RawMessage) json.RawMessage {
	if len(args) == 0 {
		return json.RawMessage("{}")
	}
	if json.Valid(args) {
		return args
	}
	b, _ := json.Marshal(string(args))
	return b
}

// runTool runs one tool call. Errors, unknown tools, bad arguments and
// panics become the result the model sees, marked as an error.
func (t *turn) runTool(ctx context.Context, env *tool.Env, name string, args json.RawMessage) (out string, isErr bool) {
	tl := t.r.toolIndex[name]
	if tl == nil {
		names := make([]string, 0, len(t.r.specs))
		for _, s := range t.r.specs {
			names = append(names, s.Name)
		}
		return fmt.Sprintf("error: there is no tool named %q; the tools are %s", name, strings.Join(names, ", ")), true
	}
	if !json.Valid(args) {
		return fmt.Sprintf("error: the arguments of %s are not valid JSON; send a JSON object matching its parameters", name), true
	}
	return t.callTool(ctx, env, name, tl.Run, args)
}

// record stores one event of the turn on local disk, with the session's
// new state, then publishes it to subscribers and the turn's OnEvent, and
// tells the mirror (the debounce timer).
func (t *turn) record(ev Event) error {
	r := t.r
	ev.SessionID = t.meta.ID
	ev.Turn = t.number
	ev.At = r.now().UTC()
	ev.Seq = t.meta.LastSeq + 1
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("agent: encoding event: %w", err)
	}
	next := t.meta
	next.LastSeq = ev.Seq
	next.UpdatedAt = ev.At
	if err := r.db.Record(t.ctx, next, sessiondb.Record{SessionID: ev.SessionID, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data}); err != nil {
		return fmt.Errorf("agent: recording the %s event of session %s: %w", ev.Type, ev.SessionID, err)
	}
	t.meta = next
	r.publish(ev)
	if t.onEvent != nil {
		t.onEvent(ev)
	}
	r.mirror.recorded(t.st, t.meta.ID)
	return nil
}

// afterTurn runs the agent's AfterTurn hook and the memory journal's.
func (r *Runtime) afterTurn(ctx context.Context, ti TurnInfo) {
	if h := r.agent.Hooks.AfterTurn; h != nil {
		if err := callHook(func() error { return h(ctx, ti) }); err != nil {
			r.logger(ti.SessionID).Warn("agent: AfterTurn hook failed", "error", err)
		}
	}
	mt := memoryTurn(ti)
	r.mem.AfterTurn(ctx, mt)
}

// systemPrompt joins the instructions and the first-prompt note.
func systemPrompt(instructions, note string) string {
	parts := slices.DeleteFunc([]string{strings.TrimSpace(instructions), note}, func(s string) bool { return s == "" })
	return strings.Join(parts, "\n\n")
}

// history rebuilds the conversation of a session from its events, and
// returns the first-prompt note recorded by its first turn.
func (r *Runtime) history(ctx context.Context, id string) ([]model.Message, string, error) {
	var msgs []model.Message
	var note string
	pending := map[string]string{} // tool call id -> name, awaiting a result
	closePending := func() {
		// A turn that ended between a tool call and its result (a crash)
		// leaves calls without results; models reject that, so answer them.
		ids := make([]string, 0, len(pending))
		for id := range pending {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			msgs = append(msgs, model.Message{Role: model.RoleTool, ToolCallID: id, Name: pending[id], Content: "error: the turn ended before this tool returned"})
		}
		clear(pending)
	}
	var after int64
	for {
		recs, err := r.db.After(ctx, id, after, MaxPageSize)
		if err != nil {
			return nil, "", err
		}
		for _, rec := range recs {
			ev, err := decodeEvent(rec)
			if err != nil {
				return nil, "", err
			}
			switch ev.Type {
			case EventTurnStarted:
				closePending()
				if ev.Turn == 1 && ev.Note != "" {
					note = ev.Note
				}
				msgs = append(msgs, model.Message{Role: model.RoleUser, Content: ev.Message})
			case EventModelCall:
				closePending()
				msgs = append(msgs, model.Message{Role: model.RoleAssistant, Content: ev.Text, ToolCalls: ev.ToolCalls})
				for _, c := range ev.ToolCalls {
					pending[c.ID] = c.Name
				}
			case EventToolResult:
				if _, ok := pending[ev.ToolCallID]; ok {
					delete(pending, ev.ToolCallID)
					msgs = append(msgs, model.Message{Role: model.RoleTool, ToolCallID: ev.ToolCallID, Name: ev.Tool, Content: ev.Output})
				}
			}
			after = rec.Seq
		}
		if len(recs) < MaxPageSize {
			break
		}
	}
	closePending()
	return msgs, note, nil
}
