package agent_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/agent"
	"agentkit/internal/testenv/pgtest"
	"agentkit/kv"
	"agentkit/kv/memkv"
	_ "agentkit/kv/pgkv"
	"agentkit/model"
	"agentkit/storage"
	"agentkit/tool"
)

// reminderTurns counts the turns started by reminders, per session.
type reminderTurns struct {
	mu    sync.Mutex
	turns map[string]int
	all   int
}

func (c *reminderTurns) hook(ctx context.Context, ti agent.TurnInfo) error {
	if ti.Source != agent.SourceReminder {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.turns == nil {
		c.turns = map[string]int{}
	}
	c.turns[ti.SessionID]++
	c.all++
	return nil
}

func (c *reminderTurns) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.all
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestReminderFiresAsAFollowUpTurn(t *testing.T) {
	ctx := context.Background()
	rt := open(t, agent.Config{})
	res := start(t, rt, "first")
	ch, cancel := rt.Subscribe(res.SessionID)
	defer cancel()
	rem, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, Delay: 50 * time.Millisecond, Message: "ping"})
	if err != nil {
		t.Fatal(err)
	}
	if rem.ID == "" || rem.State != "pending" || rem.Message != "ping" {
		t.Errorf("created %+v", rem)
	}
	var finished agent.Event
	timeout := time.After(10 * time.Second)
	for finished.Type != agent.EventTurnFinished {
		select {
		case e := <-ch:
			if e.Type == agent.EventTurnStarted && (e.Source != agent.SourceReminder || e.Message != "ping" || e.Turn != 2) {
				t.Errorf("reminder turn started as %+v", e)
			}
			finished = e
		case <-timeout:
			t.Fatal("the reminder did not fire")
		}
	}
	if finished.Result != "echo: ping" {
		t.Errorf("reminder turn result %q", finished.Result)
	}
	waitFor(t, 5*time.Second, "the reminder to be marked fired", func() bool {
		rems, _ := rt.ListReminders(ctx, res.SessionID)
		return len(rems) == 1 && rems[0].State == "fired"
	})
}

func TestToolSchedulesAReminder(t *testing.T) {
	var fired reminderTurns
	schedule := tool.Tool{
		Spec: model.ToolSpec{Name: "remind_me"},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			var in struct{ Msg string }
			json.Unmarshal(args, &in)
			if in.Msg != "start" {
				return "nothing to do", nil
			}
			id, err := env.Reminders.Schedule(ctx, time.Now().Add(30*time.Millisecond), "follow up")
			return "scheduled " + id, err
		},
	}
	m := echoModel(t, model.EchoStep{Tool: "remind_me", Args: map[string]any{"msg": "{{.UserMessage}}"}}, model.EchoStep{Text: "{{.LastToolResult}}"})
	rt := open(t, agent.Config{Agent: agent.Agent{Model: m, Tools: []tool.Tool{schedule}, Hooks: agent.Hooks{AfterTurn: fired.hook}}})
	res := start(t, rt, "start")
	if !strings.HasPrefix(res.Turn.Result, "scheduled rem_") {
		t.Fatalf("result %q", res.Turn.Result)
	}
	waitFor(t, 10*time.Second, "the reminder turn", func() bool { return fired.count() == 1 })
	ev, _ := rt.LastEvents(context.Background(), res.SessionID, 1)
	if ev[0].Result != "nothing to do" {
		t.Errorf("reminder turn ended %+v", ev[0])
	}
}

func TestReminderFiresLateAfterRestart(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	store := sharedStore(t)
	cfg := agent.Config{Agent: agent.Agent{Name: "late", Model: echoModel(t)}, StateRoot: root, Store: store, Logger: discard}
	rt, err := agent.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := start(t, rt, "first")
	if _, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, At: time.Now().Add(300 * time.Millisecond), Message: "while you were out"}); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	time.Sleep(400 * time.Millisecond) // the host is down when the reminder is due
	var fired reminderTurns
	cfg.Agent.Hooks.AfterTurn = fired.hook
	rt, err = agent.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	waitFor(t, 10*time.Second, "the late reminder", func() bool { return fired.count() == 1 })
	ev, _ := rt.LastEvents(ctx, res.SessionID, 1)
	if ev[0].Result != "echo: while you were out" {
		t.Errorf("late turn %+v", ev[0])
	}
}

func TestReminderErrors(t *testing.T) {
	ctx := context.Background()
	rt := open(t, agent.Config{})
	res := start(t, rt, "x")
	var ie *agent.InvalidError
	if _, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: "nope", Delay: time.Second, Message: "m"}); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("unknown session: %v", err)
	}
	if _, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, Delay: time.Second}); !errors.As(err, &ie) || ie.Field != "message" {
		t.Errorf("no message: %v", err)
	}
	if _, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, At: time.Now(), Delay: time.Second, Message: "m"}); !errors.As(err, &ie) || ie.Field != "at" {
		t.Errorf("at and delay: %v", err)
	}
	if err := rt.DeleteReminder(ctx, "rem_0000"); !errors.Is(err, agent.ErrReminderNotFound) {
		t.Errorf("unknown reminder: %v", err)
	}
}

// TestDeletedReminderNeverFires runs in fake time: an hour past the due
// time of a deleted reminder, its session has had no reminder turn.
func TestDeletedReminderNeverFires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		var fired reminderTurns
		rt, err := agent.Open(ctx, agent.Config{
			Agent:     agent.Agent{Name: "del-rem", Model: echoModel(t), Hooks: agent.Hooks{AfterTurn: fired.hook}},
			StateRoot: t.TempDir(), Store: memkv.New(), Logger: discard, Memory: agent.Memory{Off: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		res := start(t, rt, "x")
		keep, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, Delay: 2 * time.Minute, Message: "kept"})
		if err != nil {
			t.Fatal(err)
		}
		rem, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, Delay: time.Minute, Message: "deleted"})
		if err != nil {
			t.Fatal(err)
		}
		if err := rt.DeleteReminder(ctx, rem.ID); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := fired.count(); n != 1 {
			t.Errorf("%d reminder turns an hour later; want 1 (the kept reminder, %s)", n, keep.ID)
		}
		ev, _ := rt.LastEvents(ctx, res.SessionID, 10)
		for _, e := range ev {
			if e.Type == agent.EventTurnStarted && e.Message == "deleted" {
				t.Error("the deleted reminder fired")
			}
		}
	})
}

// fireOnce runs two runtimes on one store and checks that each of several
// reminders fires exactly once across them.
func fireOnce(t *testing.T, openStore func() *kv.DB) {
	ctx := context.Background()
	const n = 6
	var fired reminderTurns
	mk := func(host string) *agent.Runtime {
		return open(t, agent.Config{
			Agent:     agent.Agent{Name: "pair", Hooks: agent.Hooks{AfterTurn: fired.hook}},
			Store:     openStore(),
			Reminders: agent.ReminderOptions{HostID: host, SyncInterval: 100 * time.Millisecond},
		})
	}
	a := mk("host-a")
	var ids []string
	for range n {
		ids = append(ids, start(t, a, "hello").SessionID)
	}
	at := time.Now().Add(500 * time.Millisecond)
	for _, id := range ids {
		if _, err := a.CreateReminder(ctx, agent.ReminderRequest{SessionID: id, At: at, Message: "due"}); err != nil {
			t.Fatal(err)
		}
	}
	b := mk("host-b")
	// Wait until every stored record is final: from then on no host can
	// claim a reminder again, so no further turn can start (a claim must
	// win a compare-and-set on a pending or expired record, and a record
	// is final only after its turn ran).
	recs := reminderRecords(t, openStore(), "pair")
	waitFor(t, 30*time.Second, "every stored reminder to be final", func() bool {
		final := 0
		for r, err := range recs.List(ctx) {
			if err == nil && r.State.Final() {
				final++
			}
		}
		return final == n
	})
	fired.mu.Lock()
	defer fired.mu.Unlock()
	if fired.all != n {
		t.Errorf("%d reminder turns for %d reminders", fired.all, n)
	}
	for _, id := range ids {
		if fired.turns[id] != 1 {
			t.Errorf("session %s: %d reminder turns", id, fired.turns[id])
		}
	}
	_ = b
}

func TestTwoRuntimesFireEachReminderOnceMem(t *testing.T) {
	name := "mem://pair-" + randHex()
	fireOnce(t, func() *kv.DB {
		db, err := kv.Open(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		return db
	})
}

func TestTwoRuntimesFireEachReminderOncePostgres(t *testing.T) {
	u := pgtest.TableURL(t)
	fireOnce(t, func() *kv.DB {
		db, err := kv.Open(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	})
}

// reminderRecords returns an agent's reminder records in a store.
func reminderRecords(t *testing.T, db *kv.DB, agentName string) *storage.Reminders {
	t.Helper()
	b, err := storage.Define(storage.Config{Backend: db, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Agent(agentName)
	if err != nil {
		t.Fatal(err)
	}
	return a.Reminders()
}

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
