package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"agentkit/actor"
	"agentkit/actor/mergepatch"
	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/model"
	"agentkit/tool"
)

// SessionClass is the actor class of sessions: every session is the actor
// of this class whose id is the session's id (package actor,
// docs/actor.md). Its state is a JSON object (SessionState), {} until
// something is stored; its messages and events are views of the session's
// own events.
const SessionClass = "session"

// ErrActorStateLocal means actor state was asked for in serving mode
// ledger. Actor databases live on the host that wrote them and do not
// follow a session to another host yet, so in that mode the runtime refuses
// every actor write, and the session actor's state, rather than serve an
// initial state after a takeover. The HTTP API answers 409.
var ErrActorStateLocal = errors.New("agent: actor state does not follow a session across hosts yet")

// errActorStateLocal is ErrActorStateLocal with what it means for the
// caller.
var errActorStateLocal = fmt.Errorf("%w: actor databases stay on the host that wrote them, and in serving mode ledger a session moves to whichever host holds it, so actor state is refused in that mode rather than served empty after a takeover; use serving: local to keep actor state (docs/actor.md)", ErrActorStateLocal)

// Errors and types of actor state, for a server answering them (matched
// with errors.Is and errors.As); package actor defines them.
var (
	// ErrInvalidState means a state the session's actor cannot hold
	// (actor.ErrInvalidState).
	ErrInvalidState = actor.ErrInvalidState
	// ErrActorNewerFormat means the actor's database was written by a
	// newer agentkit (actor.ErrNewerFormat).
	ErrActorNewerFormat = actor.ErrNewerFormat
)

// ActorMigratedError means the actor was migrated from the key-value
// layout into the actor database of another host (actor.MigratedError).
type ActorMigratedError = actor.MigratedError

// JSONError is a patch or state that is not one valid JSON text, naming
// the document, the line and the column (mergepatch.SyntaxError).
type JSONError = mergepatch.SyntaxError

// CheckJSON reports whether doc is one valid JSON text as the state
// routes take it: a *JSONError naming which ("patch" or "state"), the line
// and the column otherwise.
func CheckJSON(doc []byte, which string) error { return mergepatch.Validate(doc, which) }

// CompactJSON returns doc without whitespace between tokens, after
// checking it as CheckJSON does; numbers and strings keep their bytes.
func CompactJSON(doc []byte, which string) ([]byte, error) { return mergepatch.Compact(doc, which) }

// actorErr marks the actor host's closing as the runtime's (ErrClosed).
func actorErr(err error) error {
	if errors.Is(err, actor.ErrClosed) && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// SessionState is the state of a session's actor: a JSON object, {} at
// first. Its values are kept as the JSON they were given (numbers keep
// their digits).
type SessionState map[string]json.RawMessage

// UnmarshalJSON refuses anything but a JSON object: a merge patch can then
// always change one key without restating the others.
func (s *SessionState) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if b = bytes.TrimSpace(b); len(b) == 0 || b[0] != '{' {
		kind := "that value"
		if len(b) > 0 {
			switch b[0] {
			case '[':
				kind = "an array"
			case 'n':
				kind = "null"
			case '"':
				kind = "a string"
			case 't', 'f':
				kind = "a boolean"
			default:
				kind = "a number"
			}
		}
		return fmt.Errorf("a session's state is a JSON object, not %s; send an object such as {\"status\":\"idle\"}", kind)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*s = m
	return nil
}

// DefineSessionClass defines the session class on h, whose state is a
// SessionState. The runtime defines it on its own host; a program that
// opens a state root's actors without a runtime (agentkit actor does)
// calls it so the class is the same.
func DefineSessionClass(h *actor.Host) (*actor.Class[SessionState], error) {
	return actor.Define(h, SessionClass, func() SessionState { return SessionState{} })
}

// openActors opens the actor host over the state root's actors/ folder,
// with the store's key-value actor layout to migrate from when the store
// can read, list and delete, and defines the session class.
func (r *Runtime) openActors() error {
	opts := actor.Options{
		Dir:        r.root.Path(stateroot.ActorsDir),
		Agent:      r.agent.Name,
		HostID:     r.hostID,
		History:    sessionHistory{r},
		WriteCheck: r.actorWriteCheck,
		Logger:     r.log,
	}
	if r.caps.Get && r.caps.List && r.caps.Delete {
		opts.Store = r.binding.DB()
	}
	h, err := actor.Open(opts)
	if err != nil {
		return fmt.Errorf("agent: opening the actors: %w", err)
	}
	r.actors = h
	if _, err := DefineSessionClass(h); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if def := r.agent.DefineActors; def != nil {
		if err := def(h); err != nil {
			return fmt.Errorf("agent: Agent.DefineActors: %w", err)
		}
	}
	return nil
}

// startActors lists the key-value layout's scheduled tasks (so that Open
// returns with them known) and starts running due tasks until Close.
func (r *Runtime) startActors(ctx context.Context) {
	if err := r.actors.ScanLegacyTasks(ctx); err != nil {
		r.log.Warn("agent: listing the actors' scheduled tasks in the store failed; the actor scheduler retries when it starts", "error", err)
	}
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		if err := r.actors.Run(r.bg); err != nil {
			r.log.Error("agent: the actor scheduler stopped", "error", err)
		}
	}()
}

// Actors returns the runtime's actor host (package actor): define classes
// of your own on it with actor.Define, register scheduled-task handlers
// with Handle (handlers of the session actor's tasks too) and address any
// actor with Ref. The session class, SessionClass, is defined already.
// Reads through it are not checked against the session list; writes are
// refused in serving mode ledger (ErrActorStateLocal). The host closes with
// the runtime.
func (r *Runtime) Actors() *actor.Host { return r.actors }

// actorWriteCheck is the actor host's WriteCheck: actor writes are refused
// in serving mode ledger.
func (r *Runtime) actorWriteCheck(ctx context.Context, class, id string) error {
	return r.actorStateAllowed()
}

// actorStateAllowed refuses actor state where Open said so (serving mode
// ledger).
func (r *Runtime) actorStateAllowed() error { return r.actorsRefused }

// SessionActor returns the actor of session id, as a tool sees it in
// tool.Env.Actor: ErrSessionNotFound when no session has the id (here, or
// in the store when it can be loaded). Each call on it is an operation of
// the runtime (ErrClosed once Close has begun). In serving mode ledger its
// state calls and writes fail with ErrActorStateLocal; its messages and
// events, views of the session's events, stay readable.
func (r *Runtime) SessionActor(ctx context.Context, id string) (tool.Actor, error) {
	exit, err := r.enter()
	if err != nil {
		return nil, err
	}
	defer exit()
	if _, err := r.localOrStore(ctx, id); err != nil {
		return nil, err
	}
	return &sessionActor{r: r, id: id, enter: true}, nil
}

// toolActor is the tool.Actor of a turn's session. Its calls run inside the
// turn's operation, so they do not enter the runtime again.
func (r *Runtime) toolActor(id string) tool.Actor {
	return &sessionActor{r: r, id: id}
}

// sessionActor is a session's actor as tool.Actor.
type sessionActor struct {
	r     *Runtime
	id    string
	enter bool // each call enters the runtime (outside a turn)
}

var _ tool.Actor = (*sessionActor)(nil)

// begin starts a call: the ledger check for state calls, and, outside a
// turn, entering the runtime and, for a write, holding off session deletes
// while checking that the session is still here (a delete waits for the
// write, or the write finds no session). It returns the actor's reference
// and the call's end.
func (a *sessionActor) begin(ctx context.Context, state, write bool) (*actor.Ref, func(), error) {
	if state {
		if err := a.r.actorStateAllowed(); err != nil {
			return nil, nil, err
		}
	}
	end := func() {}
	if a.enter {
		exit, err := a.r.enter()
		if err != nil {
			return nil, nil, err
		}
		end = exit
		if write {
			a.r.actorDel.RLock()
			end = func() { a.r.actorDel.RUnlock(); exit() }
			if _, err := a.r.db.Get(ctx, a.id); err != nil {
				end()
				if errors.Is(err, sessiondb.ErrNotFound) {
					return nil, nil, ErrSessionNotFound
				}
				return nil, nil, err
			}
		}
	}
	ref, err := a.r.actors.Ref(SessionClass, a.id)
	if err != nil {
		end()
		return nil, nil, err
	}
	return ref, end, nil
}

func (a *sessionActor) State(ctx context.Context) (json.RawMessage, error) {
	ref, exit, err := a.begin(ctx, true, false)
	if err != nil {
		return nil, err
	}
	defer exit()
	st, err := ref.StateJSON(ctx)
	return st, actorErr(err)
}

func (a *sessionActor) PatchState(ctx context.Context, patch json.RawMessage) (json.RawMessage, error) {
	ref, exit, err := a.begin(ctx, true, true)
	if err != nil {
		return nil, err
	}
	defer exit()
	st, err := ref.PatchStateJSON(ctx, patch)
	return st, actorErr(err)
}

func (a *sessionActor) ReplaceState(ctx context.Context, state json.RawMessage) error {
	ref, exit, err := a.begin(ctx, true, true)
	if err != nil {
		return err
	}
	defer exit()
	return actorErr(ref.ReplaceStateJSON(ctx, state))
}

func (a *sessionActor) Messages(ctx context.Context, after int64, limit int) ([]tool.Record, error) {
	ref, exit, err := a.begin(ctx, false, false)
	if err != nil {
		return nil, err
	}
	defer exit()
	return toolRecords(ref.Messages().After(ctx, after, limit))
}

func (a *sessionActor) Events(ctx context.Context, after int64, limit int) ([]tool.Record, error) {
	ref, exit, err := a.begin(ctx, false, false)
	if err != nil {
		return nil, err
	}
	defer exit()
	return toolRecords(ref.Events().After(ctx, after, limit))
}

func (a *sessionActor) Schedule(ctx context.Context, when tool.When, handler string, payload json.RawMessage) (string, error) {
	w, err := actorWhen(when)
	if err != nil {
		return "", err
	}
	ref, exit, err := a.begin(ctx, true, true)
	if err != nil {
		return "", err
	}
	defer exit()
	t, err := ref.Schedule(ctx, w, handler, payload)
	return t.ID, err
}

func (a *sessionActor) CancelSchedule(ctx context.Context, id string) error {
	ref, exit, err := a.begin(ctx, true, true)
	if err != nil {
		return err
	}
	defer exit()
	return ref.CancelSchedule(ctx, id)
}

// actorWhen turns a tool.When into an actor.When.
func actorWhen(w tool.When) (actor.When, error) {
	switch {
	case w.Cron != "" && (!w.At.IsZero() || w.After != 0), !w.At.IsZero() && w.After != 0:
		return actor.When{}, errors.New("agent: a scheduled task's When sets more than one of At, After and Cron; set one")
	case w.Cron != "":
		return actor.Cron(w.Cron), nil
	case !w.At.IsZero():
		return actor.At(w.At), nil
	}
	return actor.After(w.After), nil
}

func toolRecords(recs []actor.Record, err error) ([]tool.Record, error) {
	if err != nil {
		return nil, err
	}
	out := make([]tool.Record, len(recs))
	for i, rec := range recs {
		out[i] = tool.Record{Seq: rec.Seq, At: rec.At, Type: rec.Type, Data: rec.Data}
	}
	return out, nil
}

// holdActorWrites keeps writes to session actors from outside a turn
// waiting while a session is removed, so none lands between the removal of
// its actor and of its rows (a write after it finds no session). It
// returns the release.
func (r *Runtime) holdActorWrites() func() {
	r.actorDel.Lock()
	return r.actorDel.Unlock
}

// deleteSessionActor removes a deleted session's actor from this host.
func (r *Runtime) deleteSessionActor(ctx context.Context, id string) error {
	ref, err := r.actors.Ref(SessionClass, id)
	if err != nil {
		return err
	}
	return ref.Delete(ctx)
}

// sessionHistory is the actor.HistorySource of the session class: a
// session actor's messages and events are views of the session's own
// events, not a second copy.
//
// Appending to them is refused (actor.ErrReadOnly). The session's events
// are its transcript: numbered by its turns, mirrored to the store with
// them and read back as the model's conversation. A record appended from
// outside a turn would race the running turn for its sequence numbers, and
// reach the store and the next prompt without a turn that made it.
type sessionHistory struct{ r *Runtime }

func (s sessionHistory) History(class, id string) (messages, events actor.Log, ok bool) {
	if class != SessionClass {
		return nil, nil, false
	}
	return &sessionLog{r: s.r, id: id, messages: true}, &sessionLog{r: s.r, id: id}, true
}

// sessionLog is a session's messages (the model messages its events
// record) or its events, as an actor.Log. Records keep their event's
// sequence number.
type sessionLog struct {
	r        *Runtime
	id       string
	messages bool
}

func (l *sessionLog) what() string {
	if l.messages {
		return "messages"
	}
	return "events"
}

func (l *sessionLog) Append(ctx context.Context, typ string, data json.RawMessage) (actor.Record, error) {
	return actor.Record{}, fmt.Errorf("%w: the %s of session %s are views of its events, which only its turns write; run a turn (Continue) to add to them, or keep records of your own in an actor class of your own", actor.ErrReadOnly, l.what(), l.id)
}

// record turns an event into a record of the log: every event for the
// events, and for the messages the events that carry one (turn.started,
// model.call, tool.result).
func (l *sessionLog) record(ev Event) (actor.Record, bool, error) {
	if !l.messages {
		b, err := json.Marshal(ev)
		return actor.Record{Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: b}, true, err
	}
	var m model.Message
	switch ev.Type {
	case EventTurnStarted:
		m = model.Message{Role: model.RoleUser, Content: ev.Message}
	case EventModelCall:
		m = model.Message{Role: model.RoleAssistant, Content: ev.Text, ToolCalls: ev.ToolCalls}
	case EventToolResult:
		m = model.Message{Role: model.RoleTool, Content: ev.Output, ToolCallID: ev.ToolCallID, Name: ev.Tool}
	default:
		return actor.Record{}, false, nil
	}
	b, err := json.Marshal(m)
	return actor.Record{Seq: ev.Seq, At: ev.At, Type: m.Role, Data: b}, true, err
}

// pageLimit clamps a Log page size as actor.Log documents.
func pageLimit(n int) int {
	if n <= 0 || n > actor.MaxPage {
		return actor.MaxPage
	}
	return n
}

func (l *sessionLog) After(ctx context.Context, after int64, limit int) ([]actor.Record, error) {
	limit = pageLimit(limit)
	if _, err := l.r.localOrStore(ctx, l.id); err != nil {
		return nil, err
	}
	out := []actor.Record{}
	for len(out) < limit {
		recs, err := l.r.db.After(ctx, l.id, after, MaxPageSize)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			ev, err := decodeEvent(rec)
			if err != nil {
				return nil, err
			}
			if r, ok, err := l.record(ev); err != nil {
				return nil, err
			} else if ok {
				out = append(out, r)
				if len(out) == limit {
					break
				}
			}
		}
		if len(recs) < MaxPageSize || len(out) == limit {
			break
		}
		after = recs[len(recs)-1].Seq
	}
	return out, nil
}

func (l *sessionLog) Last(ctx context.Context, n int) ([]actor.Record, error) {
	n = min(n, actor.MaxPage)
	if n <= 0 {
		return []actor.Record{}, nil
	}
	if _, err := l.r.localOrStore(ctx, l.id); err != nil {
		return nil, err
	}
	last, err := l.r.db.Last(ctx, l.id, 1)
	if err != nil || len(last) == 0 {
		return []actor.Record{}, err
	}
	// Walk back a page of events at a time until n records are found.
	var rev []actor.Record // newest first
	for to := last[0].Seq; to >= 1 && len(rev) < n; to -= MaxPageSize {
		recs, err := l.r.db.Range(ctx, l.id, max(1, to-MaxPageSize+1), to)
		if err != nil {
			return nil, err
		}
		for i := len(recs) - 1; i >= 0 && len(rev) < n; i-- {
			ev, err := decodeEvent(recs[i])
			if err != nil {
				return nil, err
			}
			if r, ok, err := l.record(ev); err != nil {
				return nil, err
			} else if ok {
				rev = append(rev, r)
			}
		}
	}
	out := make([]actor.Record, len(rev))
	for i, r := range rev {
		out[len(rev)-1-i] = r
	}
	return out, nil
}
