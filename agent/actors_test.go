package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/actor"
	"agentkit/agent"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/server"
	"agentkit/tool"
)

// actorFiles lists the files under the state root's actors/ folder.
func actorFiles(t *testing.T, rt *agent.Runtime) []string {
	t.Helper()
	var out []string
	root := filepath.Join(rt.StateRoot(), "actors")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A Go tool reaches its session's actor through tool.Env.Actor: it reads
// the session's messages and patches the state during the turn, and the
// patch is there when the turn is over.
func TestToolPatchesTheSessionActorDuringATurn(t *testing.T) {
	ctx := context.Background()
	var seen []tool.Record
	remember := tool.Tool{
		Spec: model.ToolSpec{Name: "remember", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			msgs, err := env.Actor.Messages(ctx, 0, 0)
			if err != nil {
				return "", err
			}
			seen = msgs
			st, err := env.Actor.PatchState(ctx, json.RawMessage(`{"note":`+string(args)+`,"big":12345678901234567890,"nested":{"keep":1}}`))
			if err != nil {
				return "", err
			}
			return string(st), nil
		},
	}
	rt := open(t, agent.Config{Agent: agent.Agent{
		Tools: []tool.Tool{remember},
		Model: echoModel(t, model.EchoStep{Tool: "remember", Args: map[string]any{"text": "{{.UserMessage}}"}}, model.EchoStep{Text: "{{.LastToolResult}}"}),
	}})
	res := start(t, rt, "buy milk")
	const want = `{"note":{"text":"buy milk"},"big":12345678901234567890,"nested":{"keep":1}}`
	if res.Turn.Status != agent.StatusCompleted || res.Turn.Result != want {
		t.Fatalf("turn %s %q; want the tool's patched state %s", res.Turn.Status, res.Turn.Result, want)
	}
	if len(seen) == 0 || seen[0].Type != "user" || !strings.Contains(string(seen[0].Data), "buy milk") {
		t.Errorf("the tool saw the messages %+v; want the turn's user message first", seen)
	}
	a, err := rt.SessionActor(ctx, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.State(ctx)
	if err != nil || string(st) != want {
		t.Fatalf("state after the turn: %s, %v; want %s", st, err, want)
	}
	// The typed view of the same state, through the Go API.
	ref, err := rt.Actors().Ref(agent.SessionClass, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := ref.PatchStateJSON(ctx, []byte(`{"nested":{"keep":null,"new":true}}`)); err != nil || string(b) != `{"note":{"text":"buy milk"},"big":12345678901234567890,"nested":{"new":true}}` {
		t.Fatalf("Go patch: %s, %v", b, err)
	}
}

// A session that never writes its actor costs no file: turns, reads of the
// state, the messages and the events create nothing under actors/; the
// first write creates the actor's database.
func TestIdleSessionsHaveNoActorFile(t *testing.T) {
	ctx := context.Background()
	rt := open(t, agent.Config{})
	res := start(t, rt, "hello")
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"}); err != nil {
		t.Fatal(err)
	}
	a, err := rt.SessionActor(ctx, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := a.State(ctx); err != nil || string(st) != `{}` {
		t.Fatalf("an idle session's state: %s, %v; want {}", st, err)
	}
	if msgs, err := a.Messages(ctx, 0, 0); err != nil || len(msgs) != 4 {
		t.Fatalf("messages %v, %v; want 4 (two turns)", msgs, err)
	}
	if evs, err := a.Events(ctx, 0, 0); err != nil || len(evs) == 0 {
		t.Fatalf("events %v, %v", evs, err)
	}
	if files := actorFiles(t, rt); len(files) != 0 {
		t.Fatalf("an idle session left files under actors/: %q", files)
	}
	if err := a.ReplaceState(ctx, json.RawMessage(`{"status":"idle"}`)); err != nil {
		t.Fatal(err)
	}
	files := actorFiles(t, rt)
	if !slices.Contains(files, filepath.Join("session", res.SessionID, "system.db")) {
		t.Fatalf("after the first write, actors/ holds %q; want session/%s/system.db", files, res.SessionID)
	}
}

// A session actor's messages and events are views of the session's own
// events, numbered like them, paged and read from the end; they cannot be
// appended to.
func TestSessionActorLogsAreViewsOfTheSessionEvents(t *testing.T) {
	ctx := context.Background()
	rt := open(t, agent.Config{Agent: agent.Agent{Model: echoModel(t,
		model.EchoStep{Tool: "list_files"}, model.EchoStep{Text: "done: {{.UserMessage}}"})}})
	res := start(t, rt, "look around")
	ref, err := rt.Actors().Ref(agent.SessionClass, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	page, err := rt.Events(ctx, res.SessionID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := ref.Events().After(ctx, 0, 0)
	if err != nil || len(evs) != len(page.Events) {
		t.Fatalf("actor events %d, %v; the session has %d", len(evs), err, len(page.Events))
	}
	for i, ev := range page.Events {
		var got agent.Event
		if err := json.Unmarshal(evs[i].Data, &got); err != nil || evs[i].Seq != ev.Seq || evs[i].Type != ev.Type || got.Seq != ev.Seq || got.Type != ev.Type {
			t.Fatalf("actor event %d is %+v; the session's is %+v", i, evs[i], ev)
		}
	}
	msgs, err := ref.Messages().After(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range msgs {
		roles = append(roles, m.Type)
	}
	if !slices.Equal(roles, []string{"user", "assistant", "tool", "assistant"}) {
		t.Fatalf("message roles %q; want user, assistant (the tool call), tool, assistant", roles)
	}
	var first, last model.Message
	json.Unmarshal(msgs[0].Data, &first)
	json.Unmarshal(msgs[3].Data, &last)
	if first.Content != "look around" || last.Content != "done: look around" || msgs[1].Seq <= msgs[0].Seq {
		t.Fatalf("messages %+v", msgs)
	}
	for _, m := range msgs {
		if i := slices.IndexFunc(page.Events, func(e agent.Event) bool { return e.Seq == m.Seq }); i < 0 || m.At.IsZero() {
			t.Fatalf("message seq %d is not the seq of one of the session's events", m.Seq)
		}
	}
	// Paged: one at a time, after a cursor.
	var cursor int64
	var paged []actor.Record
	for {
		p, err := ref.Messages().After(ctx, cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(p) == 0 {
			break
		}
		paged = append(paged, p...)
		cursor = p[0].Seq
	}
	if len(paged) != 4 || paged[3].Seq != msgs[3].Seq {
		t.Fatalf("paging one at a time gave %+v", paged)
	}
	// From the end.
	lastTwo, err := ref.Messages().Last(ctx, 2)
	if err != nil || len(lastTwo) != 2 || lastTwo[0].Seq != msgs[2].Seq || lastTwo[1].Seq != msgs[3].Seq {
		t.Fatalf("Last(2) = %+v, %v; want the tool and the final assistant message", lastTwo, err)
	}
	lastEv, err := ref.Events().Last(ctx, 1)
	if err != nil || len(lastEv) != 1 || lastEv[0].Type != agent.EventTurnFinished {
		t.Fatalf("Events().Last(1) = %+v, %v", lastEv, err)
	}
	// Read-only.
	for _, l := range []actor.Log{ref.Messages(), ref.Events()} {
		if _, err := l.Append(ctx, "user", json.RawMessage(`"hi"`)); !errors.Is(err, actor.ErrReadOnly) || !strings.Contains(err.Error(), "only its turns write") {
			t.Fatalf("Append on a session view: %v; want actor.ErrReadOnly saying why", err)
		}
	}
	if files := actorFiles(t, rt); len(files) != 0 {
		t.Fatalf("reading and refused appends left %q under actors/", files)
	}
	// An unknown session.
	other, _ := rt.Actors().Ref(agent.SessionClass, "no-such-session")
	if _, err := other.Messages().After(ctx, 0, 0); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Fatalf("messages of an unknown session: %v", err)
	}
	if _, err := rt.SessionActor(ctx, "no-such-session"); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Fatalf("SessionActor of an unknown session: %v", err)
	}
}

// Deleting a session removes its actor: its folder, its scheduled tasks
// and the schedule index entry.
func TestDeleteSessionRemovesItsActor(t *testing.T) {
	ctx := context.Background()
	rt := open(t, agent.Config{Agent: agent.Agent{DefineActors: func(h *actor.Host) error {
		h.Handle("later", func(context.Context, *actor.Ref, actor.Task) error { return nil })
		return nil
	}}})
	res := start(t, rt, "hello")
	keep := start(t, rt, "another")
	for _, id := range []string{res.SessionID, keep.SessionID} {
		a, err := rt.SessionActor(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.PatchState(ctx, json.RawMessage(`{"secret":"`+id+`"}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Schedule(ctx, tool.When{After: time.Hour}, "later", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.DeleteSession(ctx, res.SessionID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rt.StateRoot(), "actors", "schedules.db")); err != nil || !bytes.Contains(b, []byte(keep.SessionID)) {
		t.Fatalf("the schedule index does not name the kept session (%v): the search below would find nothing anyway", err)
	}
	for _, f := range actorFiles(t, rt) {
		if strings.Contains(f, res.SessionID) {
			t.Fatalf("after the delete, actors/ still holds %s", f)
		}
		// Nor does any file name it (the schedule index, its log).
		if b, err := os.ReadFile(filepath.Join(rt.StateRoot(), "actors", f)); err == nil && bytes.Contains(b, []byte(res.SessionID)) {
			t.Fatalf("after the delete, actors/%s holds the session id", f)
		}
	}
	ref, _ := rt.Actors().Ref(agent.SessionClass, res.SessionID)
	if ref.HasDatabase() {
		t.Fatal("the deleted session's actor database is still there")
	}
	if ts, err := ref.Schedules(ctx); err != nil || len(ts) != 0 {
		t.Fatalf("the deleted session's tasks: %v, %v", ts, err)
	}
	other, _ := rt.Actors().Ref(agent.SessionClass, keep.SessionID)
	if st, err := other.StateJSON(ctx); err != nil || !strings.Contains(string(st), keep.SessionID) {
		t.Fatalf("the other session's actor: %s, %v", st, err)
	}
}

// Go authors define their own classes and handlers with
// Agent.DefineActors; the runtime runs due tasks and closes the host with
// itself.
func TestRuntimeRunsActorTasksAndClosesTheHost(t *testing.T) {
	ctx := context.Background()
	type counter struct {
		N int `json:"n"`
	}
	fired := make(chan actor.Task, 4)
	var counters *actor.Class[counter]
	rt, err := agent.Open(ctx, agent.Config{
		Agent: agent.Agent{Name: "a", Model: echoModel(t), DefineActors: func(h *actor.Host) error {
			var err error
			counters, err = actor.Define(h, "counter", func() counter { return counter{N: 1} })
			h.Handle("bump", func(ctx context.Context, r *actor.Ref, task actor.Task) error {
				if _, err := r.PatchStateJSON(ctx, task.Payload); err != nil {
					return err
				}
				fired <- task
				return nil
			})
			return err
		}},
		StateRoot: t.TempDir(), Store: memkv.New(), Logger: discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := counters.Actor("c1")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := c.State(ctx); st.N != 1 {
		t.Fatalf("initial state %+v", st)
	}
	if _, err := c.Schedule(ctx, actor.After(0), "bump", json.RawMessage(`{"n":7}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case task := <-fired:
		if task.Actor != "c1" {
			t.Fatalf("fired %+v", task)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the runtime did not run the due task")
	}
	if st, _ := c.State(ctx); st.N != 7 {
		t.Fatalf("state after the task %+v", st)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.State(ctx); !errors.Is(err, actor.ErrClosed) {
		t.Fatalf("State after the runtime closed: %v; want actor.ErrClosed", err)
	}
}

// The runtime's actor host reads and migrates the key-value layout of
// earlier builds from the agent's store, and names this state root's host
// id in the migration marker.
func TestRuntimeMigratesKeyValueActors(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	db, err := kv.New("mem", store)
	if err != nil {
		t.Fatal(err)
	}
	scope, _ := keys.Agent("legacy-agent")
	prefix, _ := scope.Actor("old-1")
	if err := db.Put(ctx, prefix+"state", []byte(`{"status":"from kv"}`)); err != nil {
		t.Fatal(err)
	}
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "legacy-agent"}, Store: store})
	ref, _ := rt.Actors().Ref(agent.SessionClass, "old-1")
	if st, err := ref.StateJSON(ctx); err != nil || string(st) != `{"status":"from kv"}` {
		t.Fatalf("read of a key-value actor: %s, %v", st, err)
	}
	if ref.HasDatabase() {
		t.Fatal("a read migrated the actor")
	}
	if st, err := ref.PatchStateJSON(ctx, []byte(`{"n":1}`)); err != nil || string(st) != `{"status":"from kv","n":1}` {
		t.Fatalf("first write: %s, %v", st, err)
	}
	if _, err := db.Get(ctx, prefix+"state"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the key-value state is still there after the migration: %v", err)
	}
	marker, err := db.Get(ctx, prefix+"migrated")
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Host string }
	json.Unmarshal(marker, &m)
	if m.Host == "" || m.Host != rt.HostID() {
		t.Fatalf("the marker names host %q; want the state root's host id %q", m.Host, rt.HostID())
	}
}

// In serving mode ledger, actor state does not follow a session to another
// host, so the runtime refuses actor writes (any class), the session
// actor's state over Go and over HTTP (409), and keeps the messages, views
// of the session's events, readable.
func TestLedgerModeRefusesActorState(t *testing.T) {
	ctx := context.Background()
	var counters *actor.Class[map[string]any]
	rt := open(t, agent.Config{Agent: agent.Agent{DefineActors: func(h *actor.Host) error {
		var err error
		counters, err = actor.Define[map[string]any](h, "counter", nil)
		return err
	}}})
	res := start(t, rt, "hello")
	a, err := rt.SessionActor(ctx, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.PatchState(ctx, json.RawMessage(`{"written":"locally"}`)); err != nil {
		t.Fatal(err)
	}
	agent.SetServingForTest(rt, agent.ServingLedger)

	const says = "does not follow a session across hosts"
	ref, _ := rt.Actors().Ref(agent.SessionClass, res.SessionID)
	c, _ := counters.Actor("c1")
	for name, err := range map[string]error{
		"Ref.PatchStateJSON":   func() error { _, err := ref.PatchStateJSON(ctx, []byte(`{"a":1}`)); return err }(),
		"Ref.Schedule":         func() error { _, err := ref.Schedule(ctx, actor.After(time.Hour), "x", nil); return err }(),
		"own class SetState":   func() error { _, err := c.SetState(ctx, []byte(`{"a":1}`)); return err }(),
		"SessionActor.State":   func() error { _, err := a.State(ctx); return err }(),
		"SessionActor.Patch":   func() error { _, err := a.PatchState(ctx, json.RawMessage(`{}`)); return err }(),
		"SessionActor.Replace": a.ReplaceState(ctx, json.RawMessage(`{}`)),
	} {
		if !errors.Is(err, agent.ErrActorStateLocal) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s in ledger mode: %v; want ErrActorStateLocal", name, err)
		}
	}
	if msgs, err := a.Messages(ctx, 0, 0); err != nil || len(msgs) != 2 {
		t.Errorf("messages in ledger mode: %v, %v; want the two of the turn", msgs, err)
	}

	srv, err := server.New(rt, server.Options{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	for _, c := range []struct{ method, ctype, body string }{
		{"GET", "", ""},
		{"PATCH", "application/merge-patch+json", `{"a":1}`},
		{"PUT", "application/json", `{"a":1}`},
	} {
		req, _ := http.NewRequest(c.method, hs.URL+"/v1/sessions/"+res.SessionID+"/state", strings.NewReader(c.body))
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), `"actor_state_local"`) || !strings.Contains(string(body), says) {
			t.Errorf("%s state in ledger mode: %d %s; want 409 actor_state_local saying it %s", c.method, resp.StatusCode, body, says)
		}
	}
	resp, err := http.Get(hs.URL + "/v1/sessions/" + res.SessionID + "/messages")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("messages in ledger mode: %d; want 200", resp.StatusCode)
	}
	// Nothing was written: back in local mode the state is what it was.
	agent.SetServingForTest(rt, agent.ServingLocal)
	if st, err := a.State(ctx); err != nil || string(st) != `{"written":"locally"}` {
		t.Fatalf("state after the refusals: %s, %v", st, err)
	}
}

// A write through a session actor obtained before the session was deleted
// finds no session and leaves no file; writes racing a delete never leave
// the deleted session's actor behind.
func TestWritesAfterADeleteLeaveNothing(t *testing.T) {
	ctx := context.Background()
	rt := open(t, agent.Config{})
	res := start(t, rt, "hello")
	a, err := rt.SessionActor(ctx, res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.DeleteSession(ctx, res.SessionID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PatchState(ctx, json.RawMessage(`{"late":true}`)); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Fatalf("a patch after the delete: %v; want ErrSessionNotFound", err)
	}
	if err := a.ReplaceState(ctx, json.RawMessage(`{}`)); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Fatalf("a replace after the delete: %v; want ErrSessionNotFound", err)
	}
	if files := actorFiles(t, rt); len(files) != 0 {
		t.Fatalf("writes after the delete left %q", files)
	}

	for round := 0; round < 5; round++ {
		res := start(t, rt, "hello")
		a, err := rt.SessionActor(ctx, res.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		for i := 0; i < 8; i++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for j := 0; j < 5; j++ {
					if _, err := a.PatchState(ctx, json.RawMessage(`{"n":1}`)); err != nil && !errors.Is(err, agent.ErrSessionNotFound) {
						t.Errorf("patch: %v", err)
					}
				}
			}()
		}
		if err := rt.DeleteSession(ctx, res.SessionID); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 8; i++ {
			<-done
		}
		for _, f := range actorFiles(t, rt) {
			if strings.Contains(f, res.SessionID) {
				t.Fatalf("round %d: writes racing the delete left %s", round, f)
			}
		}
	}
}

// A tool schedules a task on its session's actor; the handler registered
// in Agent.DefineActors runs it with the session's actor. A When that
// names two times is refused.
func TestSessionActorTaskRunsItsHandler(t *testing.T) {
	ctx := context.Background()
	fired := make(chan string, 1)
	var ids []string
	later := tool.Tool{
		Spec: model.ToolSpec{Name: "later", Parameters: json.RawMessage(`{"type":"object"}`)},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			if _, err := env.Actor.Schedule(ctx, tool.When{At: time.Now(), Cron: "@hourly"}, "follow-up", nil); err == nil || !strings.Contains(err.Error(), "more than one") {
				return "", errors.New("a When with two times was accepted")
			}
			cron, err := env.Actor.Schedule(ctx, tool.When{Cron: "@daily"}, "follow-up", json.RawMessage(`{"n":2}`))
			if err != nil {
				return "", err
			}
			ids = append(ids, cron)
			id, err := env.Actor.Schedule(ctx, tool.When{}, "follow-up", args)
			return id, err
		},
	}
	rt := open(t, agent.Config{Agent: agent.Agent{
		Tools: []tool.Tool{later},
		Model: echoModel(t, model.EchoStep{Tool: "later", Args: map[string]any{"followedUp": true}}, model.EchoStep{Text: "{{.LastToolResult}}"}),
		DefineActors: func(h *actor.Host) error {
			h.Handle("follow-up", func(ctx context.Context, r *actor.Ref, task actor.Task) error {
				if _, err := r.PatchStateJSON(ctx, task.Payload); err != nil {
					return err
				}
				fired <- r.Class() + "/" + r.ID()
				return nil
			})
			return nil
		},
	}})
	res := start(t, rt, "remind me")
	if res.Turn.Status != agent.StatusCompleted || !strings.HasPrefix(res.Turn.Result, "task_") {
		t.Fatalf("turn %s %q; want the task's id", res.Turn.Status, res.Turn.Result)
	}
	select {
	case who := <-fired:
		if who != agent.SessionClass+"/"+res.SessionID {
			t.Fatalf("the handler ran for %s", who)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the session actor's task did not run")
	}
	a, _ := rt.SessionActor(ctx, res.SessionID)
	if st, err := a.State(ctx); err != nil || string(st) != `{"followedUp":true}` {
		t.Fatalf("state after the task: %s, %v", st, err)
	}
	// The handler signals before the scheduler removes the task it ran,
	// so wait for the removal: the cron task must then be the only one.
	ref, _ := rt.Actors().Ref(agent.SessionClass, res.SessionID)
	var ts []actor.Task
	var err error
	waitFor(t, 30*time.Second, "the run task to leave the schedule", func() bool {
		ts, err = ref.Schedules(ctx)
		return err != nil || len(ts) <= 1
	})
	if err != nil || len(ts) != 1 || ts[0].ID != ids[0] || ts[0].Kind != actor.KindCron {
		t.Fatalf("tasks after the run: %+v, %v; want the cron task only", ts, err)
	}
	if err := a.CancelSchedule(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := a.CancelSchedule(ctx, ids[0]); !errors.Is(err, actor.ErrNotFound) {
		t.Fatalf("cancelling twice: %v", err)
	}
}
