package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"agentkit/abtest"
	"agentkit/agent/sessiondb"
	"agentkit/ledger"
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
	created   *sessiondb.Meta   // a new session's row, stored with its first events
}

// turn is a running turn.
type turn struct {
	r       *Runtime
	st      *sessionState
	meta    sessiondb.Meta // the session's row, with the turn's events so far
	number  int64
	onEvent func(Event)
	ctx     context.Context // for local writes: not canceled with the caller
	model   model.Model     // the agent's, or the session's A/B variant's
	failure error           // the model error that failed the turn, if one did
	created *sessiondb.Meta // a new session's row, until its first flush
	conv    *conversation   // the session's conversation, with the turn's events
	system  string          // the system prompt

	// pending are the events recorded but not yet on disk, and recs their
	// stored form: flush writes them in one transaction, then publishes
	// them.
	pending []Event
	recs    []sessiondb.Record

	// led is the ledger's turn in serving mode ledger (nil in local): the
	// turn's events then go to out, committed with the turn, and nothing
	// is written to the session database before the commit (ledger.go).
	led *ledger.Turn
	out []json.RawMessage
	// toolCalls counts the turn's tool calls, for their idempotency keys.
	toolCalls int
}

// publishDelay is how long recorded events wait for the model's answer
// before they are written and published on their own: a slow model call
// does not hold back the events before it, and a fast one lets them share
// one write with the answer.
const publishDelay = 20 * time.Millisecond

// runTurn runs one turn of a session: it waits for the session's previous
// turn, brings the local copy up to the store's (the mirror's beforeTurn),
// records turn.started, runs the model/tool loop, records turn.finished,
// flushes the mirror and runs the AfterTurn hooks.
//
// Events are durable before anyone sees them: a recorded event waits in
// memory until flush writes it (with the others waiting and the session's
// row, in one transaction of the session database) and only then is
// published to subscribers and OnEvent. A turn flushes before a tool runs,
// when a model call outlasts publishDelay, and at its end, so a turn with
// a quick model answer writes its events once.
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
	var m sessiondb.Meta
	if req.created != nil {
		m = *req.created
		r.mirror.created(st, m.ID)
	} else {
		m, err = r.mirror.beforeTurn(wctx, st, req.sessionID)
		if errors.Is(err, sessiondb.ErrNotFound) {
			return TurnResult{}, fmt.Errorf("%w: %s (deleted while the turn waited)", ErrSessionNotFound, req.sessionID)
		}
		if err != nil {
			return TurnResult{}, err
		}
	}
	ctx, cancel := r.turnContext(ctx)
	defer cancel()
	conv, err := r.loadConversation(wctx, m.ID, r.convs.take(m.ID), m.LastSeq)
	if err != nil {
		r.convs.put(m.ID, nil, r.now())
		return TurnResult{}, err
	}
	t := &turn{r: r, st: st, meta: m, number: m.Turns + 1, onEvent: req.onEvent, ctx: wctx, conv: conv, created: req.created}
	defer func() { r.convs.put(m.ID, t.conv, r.now()) }()
	note := conv.note
	if m.Turns == 0 {
		note = req.note
	}
	vs, err := r.setupFor(wctx, m.ID, m.Turns == 0, req.enrolled)
	if err != nil {
		return TurnResult{}, err
	}
	t.model, t.system = vs.model, systemPrompt(vs.instructions, note)
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
	t.meta.Turns = t.number
	startEv := Event{Type: EventTurnStarted, Source: req.source, Message: req.message, Note: note, Idempotency: req.idem}
	if m.Turns == 0 {
		startEv.Experiments = vs.enrolled
	}
	if err := t.record(startEv); err != nil {
		return TurnResult{}, err
	}
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
	status, result, usage, loopErr := t.loop(abtest.WithOptions(ctx, vs.options), env)
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
	if err := r.mirror.endTurn(wctx, st, m.ID, turnEnd{meta: t.meta, recs: t.recs, write: t.flushWith}); err != nil {
		return TurnResult{}, err
	}
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
// turn with a status. Every request is the session's conversation with
// this turn's events folded in (t.conv), so what the model sees within a
// turn is what it sees of the turn later.
func (t *turn) loop(ctx context.Context, env *tool.Env) (TurnStatus, string, model.Usage, error) {
	r := t.r
	var usage model.Usage
	for step := 1; step <= r.maxSteps; step++ {
		if ctx.Err() != nil {
			return StatusFailed, stopMessage(ctx), usage, nil
		}
		if err := t.check(); err != nil {
			return "", "", usage, err
		}
		resp, err, ferr := t.generate(ctx, model.Request{Messages: t.conv.history(t.system), Tools: r.specs})
		if ferr != nil {
			return "", "", usage, ferr
		}
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
		logged := make([]model.ToolCall, len(calls))
		for i, c := range calls {
			if c.ID == "" {
				c.ID = fmt.Sprintf("call_%d_%d", step, i+1)
			}
			calls[i] = c
			logged[i] = c
			logged[i].Arguments = validJSON(c.Arguments)
		}
		if err := t.record(Event{Type: EventModelCall, Step: step, Text: resp.Message.Content, ToolCalls: logged, Usage: &u}); err != nil {
			return "", "", usage, err
		}
		if len(calls) == 0 {
			return StatusCompleted, resp.Message.Content, usage, nil
		}
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
			// A tool acts outside the runtime: its call is on disk before
			// it runs.
			if err := t.flush(); err != nil {
				return "", "", usage, err
			}
			if err := t.check(); err != nil {
				return "", "", usage, err
			}
			t.toolCalls++
			callEnv := *env
			callEnv.IdempotencyKey = t.idempotencyKey(t.toolCalls)
			out, isErr := t.runTool(ctx, &callEnv, call.Name, args)
			if err := t.record(Event{Type: EventToolResult, Step: step, ToolCallID: call.ID, Tool: call.Name, Output: out, IsError: isErr}); err != nil {
				return "", "", usage, err
			}
		}
	}
	return StatusFailed, fmt.Sprintf("the turn reached the step limit of %d model calls without a final answer; raise the agent's MaxSteps or ask for less in one turn", r.maxSteps), usage, nil
}

// generate calls the model. While it thinks, events already recorded wait
// for its answer at most publishDelay, then are flushed (ferr is that
// flush's error).
func (t *turn) generate(ctx context.Context, req model.Request) (resp model.Response, err, ferr error) {
	if len(t.pending) == 0 {
		resp, err = generate(ctx, t.model, req)
		return resp, err, nil
	}
	type answer struct {
		resp model.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := generate(ctx, t.model, req)
		done <- answer{resp, err}
	}()
	timer := time.NewTimer(publishDelay)
	defer timer.Stop()
	select {
	case a := <-done:
		return a.resp, a.err, nil
	case <-timer.C:
	}
	ferr = t.flush()
	a := <-done
	return a.resp, a.err, ferr
}

// check is the ledger's fence before a side effect (a model call, a tool
// call): in serving mode ledger it fails once this host may no longer hold
// the session (ledger.Turn.Check); in local mode it never fails.
func (t *turn) check() error {
	if t.led == nil {
		return nil
	}
	return t.led.Check()
}

// idempotencyKey is the key of the turn's n-th tool call:
// {sessionId}/{turn}/{n}. In serving mode ledger the turn number is the
// commit sequence the turn commits as, so every attempt of a turn gives
// the same call the same key.
func (t *turn) idempotencyKey(n int) string {
	if t.led != nil {
		return t.led.IdempotencyKey(n)
	}
	return fmt.Sprintf("%s/%d/%d", t.meta.ID, t.number, n)
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

// record adds one event to the turn: numbered, encoded, folded into the
// conversation and kept in memory until the next flush writes it.
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
	if err := t.conv.applyJSON(ev.SessionID, ev.Seq, data); err != nil {
		return err
	}
	t.meta.LastSeq = ev.Seq
	t.meta.UpdatedAt = ev.At
	if t.led != nil {
		t.out = append(t.out, data)
		return nil
	}
	t.pending = append(t.pending, ev)
	t.recs = append(t.recs, sessiondb.Record{SessionID: ev.SessionID, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data})
	return nil
}

// flush writes the pending events and the session's row in one transaction
// of the local database, then publishes them, in order, to subscribers and
// the turn's OnEvent, and tells the mirror (the debounce timer). An event
// is never published before it is on disk. A failed write fails the turn:
// its pending events were never published, and the conversation is
// dropped so that the next turn rebuilds it from what is on disk.
func (t *turn) flush() error { return t.flushWith(nil) }

// flushWith is flush, running extra (when set) in the same transaction
// after the events are written: the mirror's part of a turn's last write
// (sessionMirror.endTurn).
func (t *turn) flushWith(extra func(tx *sessiondb.Tx) error) error {
	if t.led != nil || len(t.pending) == 0 && extra == nil {
		return nil
	}
	r := t.r
	err := r.db.Write(t.ctx, func(tx *sessiondb.Tx) error {
		if t.created != nil {
			if err := tx.Put(*t.created); err != nil {
				return err
			}
		}
		if err := tx.Record(t.meta, t.recs...); err != nil {
			return err
		}
		if extra != nil {
			return extra(tx)
		}
		return nil
	})
	if err != nil {
		r.convs.drop(t.meta.ID)
		t.conv = nil
		what := "the state"
		if len(t.pending) > 0 {
			what = "the " + t.pending[0].Type + " event"
		}
		return fmt.Errorf("agent: recording %s of session %s: %w", what, t.meta.ID, err)
	}
	for _, ev := range t.pending {
		r.publish(ev)
		if t.onEvent != nil {
			t.onEvent(ev)
		}
	}
	t.pending, t.recs, t.created = t.pending[:0], t.recs[:0], nil
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
