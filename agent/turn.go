package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"agentkit/abtest"
	"agentkit/agent/sessiondb"
	"agentkit/memory"
	"agentkit/model"
	"agentkit/tool"
	"agentkit/workspace"
)

// turnRequest is a turn request as the commit path gets it (submit): a
// new session's first message, a client's follow-up, or a reminder's.
type turnRequest struct {
	// start is set for a new session: its channel, title and the rest.
	start *StartRequest
	// sessionID and token name the session of a follow-up.
	sessionID string
	token     string
	message   string
	files     map[string]string
	source    string // SourceAPI or SourceReminder
	// reminder is the id of the reminder firing (source SourceReminder).
	reminder string
	// key and hash are the request's Idempotency-Key and request hash
	// (idempotency.go), or empty.
	key, hash string
	onEvent   func(Event)
	noWait    bool  // a busy session is ErrBusy at once
	ifLastSeq int64 // the follow-up's precondition (ContinueRequest.IfLastSeq)
}

// route is the Idempotency-Key route of the request.
func (req turnRequest) route() string {
	if req.start != nil {
		return keyRouteStart
	}
	return keyRouteContinue
}

// turnInput is what runTurn needs of a turn beyond its commit path: the
// message and how it came.
type turnInput struct {
	message string
	files   map[string]string
	source  string
	onEvent func(Event)
	// idem is the request's Idempotency-Key, recorded with turn.started
	// (serving mode local); eventID the consumed ledger event's id
	// (serving mode ledger).
	idem    *Idempotency
	eventID string
}

// turn is a running turn.
type turn struct {
	r       *Runtime
	tc      turnCommit      // the turn's commit path
	meta    sessiondb.Meta  // the session's row, with the turn's events so far
	number  int64           // the turn's number: the session's turns before it, plus one
	onEvent func(Event)     // the caller's, for events as they are published
	ctx     context.Context // for local writes: not canceled with the caller
	model   model.Model     // the agent's, or the session's A/B variant's
	failure error           // the model error that failed the turn, if one did
	conv    *conversation   // the session's conversation, with the turn's events
	system  string          // the system prompt

	// pending are the events recorded and not yet written or published,
	// and recs their stored form (what the commit path writes).
	pending []Event
	recs    []sessiondb.Record
	// toolCalls counts the turn's tool calls, for their idempotency keys.
	toolCalls int
}

// publishDelay is how long recorded events wait for the model's answer
// before they are written and published on their own: a slow model call
// does not hold back the events before it, and a fast one lets them share
// one write with the answer.
const publishDelay = 20 * time.Millisecond

// runTurn runs one turn of a session on its commit path, in every serving
// mode: tc.begin brings the local copy up to the store's; a session's
// first turn runs the OnSessionStart and FirstPrompt hooks and enrols it
// in the A/B experiments; turn.started is recorded, the model/tool loop
// runs (tc.check before every model and tool call, tc.flush before a tool
// runs and when a model call outlasts publishDelay), turn.finished is
// recorded and tc.commit commits the turn. Only after the commit do its
// effects run: the AfterTurn hooks, the memory journal's record, the A/B
// sample and the Observer's TurnFinished. The caller holds the session
// (its turn lock, or the ledger's lease).
//
// Events are durable before anyone sees them: the commit path writes (or
// commits) a recorded event before it publishes it.
func (r *Runtime) runTurn(ctx context.Context, tc turnCommit, in turnInput) (TurnResult, error) {
	wctx := context.WithoutCancel(ctx)
	m, err := tc.begin(wctx)
	if err != nil {
		return TurnResult{}, err
	}
	first := m.Turns == 0
	var note string
	var enrolled map[string]string
	if first {
		if err := os.MkdirAll(r.workspaceDir(m.ID), 0o700); err != nil {
			return TurnResult{}, fmt.Errorf("agent: creating the session workspace: %w", err)
		}
		info := r.sessionInfo(m)
		r.sessionStarted(ctx, info)
		note = r.firstPromptNote(ctx, info)
		enrolled = r.enroll(m.ID, m.ChannelID)
	}
	conv, err := r.loadConversation(wctx, m.ID, r.convs.take(m.ID), m.LastSeq)
	if err != nil {
		r.convs.put(m.ID, nil, r.now())
		return TurnResult{}, err
	}
	t := &turn{r: r, tc: tc, meta: m, number: m.Turns + 1, onEvent: in.onEvent, ctx: wctx, conv: conv}
	committed := false
	defer func() {
		if committed {
			r.convs.put(m.ID, t.conv, r.now())
		} else {
			r.convs.put(m.ID, nil, r.now()) // it may hold events that did not count
		}
	}()
	if !first {
		note = conv.note
	}
	vs, err := r.setupFor(wctx, m.ID, first, enrolled)
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
	if first && len(r.agent.WorkspaceSeed) > 0 {
		if err := workspace.Seed(ws, r.agent.WorkspaceSeed); err != nil {
			return TurnResult{}, fmt.Errorf("agent: seeding the workspace: %w", err)
		}
	}
	if len(in.files) > 0 {
		if err := workspace.Seed(ws, in.files); err != nil {
			return TurnResult{}, workspaceFilesError(err)
		}
	}
	tctx, cancel := r.turnContext(ctx)
	defer cancel()

	started := r.now()
	t.meta.Turns = t.number
	startEv := Event{Type: EventTurnStarted, Source: in.source, Message: in.message, Note: note, Idempotency: in.idem, EventID: in.eventID}
	if first {
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
	status, result, usage, err := t.loop(abtest.WithOptions(tctx, vs.options), env)
	if err != nil {
		return TurnResult{}, err
	}

	finished := r.now()
	dur := finished.Sub(started)
	t.meta.LastStatus = string(status)
	u := usage
	if err := t.record(Event{Type: EventTurnFinished, Status: status, Result: result, Usage: &u, DurationMS: dur.Milliseconds()}); err != nil {
		return TurnResult{}, err
	}
	lastSeq := t.meta.LastSeq
	if err := tc.commit(ctx, t); err != nil {
		return TurnResult{}, err
	}
	committed = true
	// Only now does the turn count: its effects follow the commit.
	r.afterTurn(wctx, TurnInfo{
		AgentName: r.agent.Name, StateRoot: r.root.Dir(),
		SessionID: m.ID, ChannelID: m.ChannelID, Title: m.Title,
		Turn: t.number, Source: in.source, UserMessage: in.message,
		Status: status, Result: result, Usage: usage,
		StartedAt: started, FinishedAt: finished,
	})
	r.recordABs(wctx, vs, m.ID, t.number, turnOf(status, &usage, dur, finished))
	r.obs.TurnFinished(status, dur)
	// The continuation token is the submitting path's to give: only its
	// digest is stored.
	return TurnResult{
		SessionID: m.ID,
		Turn:      Turn{Status: status, Result: result, Usage: usage, Retryable: temporary(t.failure)},
		LastSeq:   lastSeq,
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

// check is the commit path's fence before a side effect (a model call, a
// tool call): in serving mode ledger it fails once this host may no
// longer hold the session (ledger.Turn.Check).
func (t *turn) check() error { return t.tc.check() }

// flush hands the events recorded so far to the commit path, which writes
// and publishes them (serving mode local) or keeps them for the commit
// (serving mode ledger).
func (t *turn) flush() error { return t.tc.flush(t) }

// idempotencyKey is the key of the turn's n-th tool call:
// {sessionId}/{turn}/{n}. In serving mode ledger the turn number is the
// commit sequence the turn commits as, so every attempt of a turn gives
// the same call the same key.
func (t *turn) idempotencyKey(n int) string {
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
// conversation and kept in memory until the commit path writes it.
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
	t.pending = append(t.pending, ev)
	t.recs = append(t.recs, sessiondb.Record{SessionID: ev.SessionID, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data})
	return nil
}

// writeLocal writes the pending events and the session's row in one
// transaction of the local database (with created, a new session's row,
// first, and extra, when set, last, in the same transaction), then
// publishes them, in order, to subscribers and the turn's OnEvent. An
// event is never published before it is on disk. A failed write fails
// the turn: its pending events were never published, and the
// conversation is dropped so that the next turn rebuilds it from what is
// on disk. It is how the store mirror records a turn's events.
func (t *turn) writeLocal(created *sessiondb.Meta, extra func(tx *sessiondb.Tx) error) error {
	if len(t.pending) == 0 && extra == nil && created == nil {
		return nil
	}
	r := t.r
	err := r.db.Write(t.ctx, func(tx *sessiondb.Tx) error {
		if created != nil {
			if err := tx.Put(*created); err != nil {
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
	t.pending, t.recs = t.pending[:0], t.recs[:0]
	return nil
}

// events returns the stored form of every event the turn recorded and
// has not written: all of them on a path that keeps events for the
// commit.
func (t *turn) events() []json.RawMessage {
	out := make([]json.RawMessage, len(t.recs))
	for i, rec := range t.recs {
		out[i] = rec.Data
	}
	return out
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

// memoryTurn converts a finished turn for the memory journal.
func memoryTurn(t TurnInfo) memory.TurnInfo {
	mt := memory.TurnInfo{
		SessionID: t.SessionID, ChannelID: t.ChannelID, Title: t.Title,
		UserMessage: t.UserMessage, Result: t.Result, Usage: t.Usage,
		FinishedAt: t.FinishedAt,
	}
	if t.Status == StatusFailed {
		mt.Err = failure(t.Result)
	}
	return mt
}

// failure is a turn's failure message as an error.
type failure string

func (f failure) Error() string { return string(f) }
