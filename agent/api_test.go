package agent_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
)

func TestListSessionsPaging(t *testing.T) {
	clk := newClock(epoch)
	rt := open(t, agent.Config{Now: clk.Now})
	ctx := context.Background()
	var want []string // newest first
	var oldest agent.TurnResult
	for i := range 7 {
		res := start(t, rt, fmt.Sprint(i))
		if i == 0 {
			oldest = res
		}
		want = append([]string{res.SessionID}, want...)
	}
	// Continuing the oldest makes it the newest.
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: oldest.ContinuationToken, Message: "bump"}); err != nil {
		t.Fatal(err)
	}
	want = append([]string{oldest.SessionID}, want[:len(want)-1]...)
	var got []string
	cur := ""
	pages := 0
	for {
		p, err := rt.ListSessions(ctx, 3, cur)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, s := range p.Sessions {
			got = append(got, s.ID)
		}
		if p.NextCursor == "" {
			break
		}
		cur = p.NextCursor
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || pages != 3 {
		t.Errorf("listed in %d pages %v\nwant %v", pages, got, want)
	}
}

func TestEventsPaging(t *testing.T) {
	rt := open(t, agent.Config{})
	ctx := context.Background()
	res := start(t, rt, "0")
	for i := 1; i < 10; i++ {
		if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	other := start(t, rt, "other")
	var all []agent.Event
	after := int64(0)
	for {
		p, err := rt.Events(ctx, res.SessionID, after, 7)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, p.Events...)
		if !p.More {
			if len(p.Events) > 0 && p.Next != p.Events[len(p.Events)-1].Seq {
				t.Errorf("Next %d", p.Next)
			}
			break
		}
		after = p.Next
	}
	if len(all) != 30 {
		t.Fatalf("%d events, want 30", len(all))
	}
	for i, e := range all {
		if e.Seq != int64(i+1) || e.SessionID != res.SessionID || e.Turn != int64(i/3+1) {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	last, err := rt.LastEvents(ctx, res.SessionID, 4)
	if err != nil || len(last) != 4 || last[0].Seq != 27 || last[3].Type != agent.EventTurnFinished || last[3].Result != "echo: 9" {
		t.Errorf("LastEvents %+v %v", last, err)
	}
	if _, err := rt.Events(ctx, "missing", 0, 10); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("missing session: %v", err)
	}
	if p, _ := rt.Events(ctx, other.SessionID, 0, 100); len(p.Events) != 3 {
		t.Errorf("other session: %d events", len(p.Events))
	}
	s, err := rt.GetSession(ctx, res.SessionID)
	if err != nil || s.Turns != 10 || s.LastSeq != 30 || s.LastStatus != agent.StatusCompleted || s.ChannelID != "http" || !s.UpdatedAt.After(s.CreatedAt) {
		t.Errorf("session %+v %v", s, err)
	}
}

func TestInfo(t *testing.T) {
	rt := open(t, agent.Config{
		Agent:     agent.Agent{Name: "info", MaxSteps: 4},
		StoreName: "primary",
		Policy:    agent.Policy{Debounce: time.Second, Restore: agent.RestorePolicy{MaxSessions: 7}},
	})
	info := rt.Info()
	if info.Agent != "info" || info.Model != "echo" || info.Serving != "local" || info.MaxSteps != 4 ||
		info.Storage.Name != "primary" || !info.Storage.CAS || info.Storage.DebounceMs != 1000 ||
		info.Storage.Restore.MaxSessions != 7 || info.Storage.Restore.MaxTotalBytes != 1<<30 || !info.Memory || info.DefaultStore {
		t.Errorf("info %+v", info)
	}
}

func TestObserverSeesEveryStoreOperation(t *testing.T) {
	obs := &observer{}
	backend := &opCounts{store: memkv.NewStore()}
	rt := open(t, agent.Config{Observer: obs, Store: backend.funcs()})
	res := start(t, rt, "x")
	if _, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "y"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Store().Get(context.Background(), "agentkit/v1/none"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get through the observed store: %v", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	// Every operation that reached the backend was observed once, with its
	// op name; nothing else was.
	got := backend.snapshot()
	if len(got) < 5 || fmt.Sprint(got) != fmt.Sprint(obs.ops) {
		t.Errorf("observed %v; the backend saw %v", obs.ops, got)
	}
	// The store handle reaches the driver value.
	if _, ok := rt.Store().Backend().(kv.Funcs); !ok {
		t.Errorf("Store().Backend() is %T, want the kv.Funcs given", rt.Store().Backend())
	}
}

// opCounts is a store over memkv that counts the operations reaching it.
type opCounts struct {
	store *memkv.Store
	mu    sync.Mutex
	ops   map[string]int
}

func (c *opCounts) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ops == nil {
		c.ops = map[string]int{}
	}
	c.ops[op]++
}

func (c *opCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.ops)
}

func (c *opCounts) funcs() kv.Funcs {
	s := c.store
	return kv.Funcs{
		Put:    func(ctx context.Context, k string, v []byte) error { c.count("put"); return s.Put(ctx, k, v) },
		Get:    func(ctx context.Context, k string) ([]byte, error) { c.count("get"); return s.Get(ctx, k) },
		Delete: func(ctx context.Context, k string) error { c.count("delete"); return s.Delete(ctx, k) },
		List:   func(ctx context.Context, p string) iter.Seq2[kv.Entry, error] { c.count("list"); return s.List(ctx, p) },
		CAS: kv.CASFuncs{
			GetWithVersion: func(ctx context.Context, k string) ([]byte, kv.Version, error) {
				c.count("get_with_version")
				return s.GetWithVersion(ctx, k)
			},
			PutIfAbsent: func(ctx context.Context, k string, v []byte) (kv.Version, error) {
				c.count("put_if_absent")
				return s.PutIfAbsent(ctx, k, v)
			},
			PutIfVersion: func(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
				c.count("put_if_version")
				return s.PutIfVersion(ctx, k, v, e)
			},
			ListKeys: func(ctx context.Context, p string) iter.Seq2[string, error] {
				c.count("list_keys")
				return s.ListKeys(ctx, p)
			},
		},
	}
}

func TestTurnsOfOneSessionRunOneAtATime(t *testing.T) {
	release := make(chan struct{})
	rec := &recorder{answer: func(req model.Request) (model.Response, error) {
		last := req.Messages[len(req.Messages)-1].Content
		if last == "long" {
			<-release // holds the turn until the test releases it
		}
		return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ok: " + last}}, nil
	}}
	rt := open(t, agent.Config{Agent: agent.Agent{Model: rec}})
	ctx := context.Background()
	res := start(t, rt, "x")
	// While one turn runs, a follow-up with a short deadline gives up.
	events, cancelSub := rt.Subscribe(res.SessionID)
	defer cancelSub()
	longDone := make(chan error, 1)
	go func() {
		_, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "long"})
		longDone <- err
	}()
	for e := range events {
		if e.Type == agent.EventTurnStarted && e.Message == "long" {
			break // the long turn holds the session
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := rt.Continue(short, agent.ContinueRequest{Token: res.ContinuationToken, Message: "hurry"}); !errors.Is(err, agent.ErrBusy) {
		t.Errorf("busy session: %v", err)
	}
	// Parallel follow-ups queue and all run; sequence numbers stay dense.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: fmt.Sprint(i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	// And other sessions run meanwhile, while the long turn still holds
	// its own.
	for range 2 {
		start(t, rt, "other")
	}
	if s, _ := rt.GetSession(ctx, res.SessionID); s.Turns != 2 {
		t.Errorf("turns of the held session while it is held: %d, want 2", s.Turns)
	}
	close(release)
	if err := <-longDone; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s, _ := rt.GetSession(ctx, res.SessionID)
	if s.Turns != 6 || s.LastSeq != 18 {
		t.Errorf("session after concurrent turns: %+v", s)
	}
}

func TestClosedRuntime(t *testing.T) {
	ctx := context.Background()
	rt, err := agent.Open(ctx, agent.Config{Agent: agent.Agent{Name: "c", Model: echoModel(t)}, StateRoot: t.TempDir(), Store: memkv.New(), Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	res := start(t, rt, "x")
	ch, _ := rt.Subscribe(res.SessionID)
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, ok := <-ch; ok {
		t.Error("subscription still open after Close")
	}
	if _, err := rt.StartSession(ctx, agent.StartRequest{Message: "x"}); !errors.Is(err, agent.ErrClosed) {
		t.Errorf("StartSession after Close: %v", err)
	}
	if _, err := rt.GetSession(ctx, res.SessionID); !errors.Is(err, agent.ErrClosed) {
		t.Errorf("GetSession after Close: %v", err)
	}
}
