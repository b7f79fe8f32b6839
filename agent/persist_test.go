package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/agent/stateroot"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
)

// TestDefaultStoreSurvivesRestart runs a real runtime on the embedded
// default store, closes it and reopens it on the same folder.
func TestDefaultStoreSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	cfg := agent.Config{Agent: agent.Agent{Name: "persist", Model: echoModel(t)}, StateRoot: root}
	rt, err := agent.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := start(t, rt, "hello")
	if err := rt.HostKV().Put(ctx, "counter", []byte(`1`)); err != nil {
		t.Fatal(err)
	}
	info := rt.Info()
	if !info.DefaultStore || info.Storage.Name == "" || !info.Storage.Get || !info.Storage.CAS {
		t.Errorf("info %+v", info)
	}
	// A read-only user of the default store works beside the server.
	ro, err := kv.Open(ctx, stateroot.DefaultStoreURL(root))
	if err != nil {
		t.Fatalf("opening kv/kv.db beside the runtime: %v", err)
	}
	ks := keysWith(t, ro, "agentkit/v1/persist/")
	if !contains(ks, "/sessions/"+res.SessionID+"/meta") || !contains(ks, "/kv/counter") {
		t.Errorf("kv ls beside the runtime: %q", ks)
	}
	ro.Close()
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}

	rt3, err := agent.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt3.Close()
	res2, err := rt3.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"})
	if err != nil || res2.SessionID != res.SessionID || res2.Turn.Result != "echo: again" {
		t.Fatalf("continue after restart: %+v %v", res2, err)
	}
	page, err := rt3.Events(ctx, res.SessionID, 0, 100)
	if err != nil || len(page.Events) != 6 || page.Events[5].Turn != 2 {
		t.Errorf("events after restart: %d %v", len(page.Events), err)
	}
	v, err := rt3.HostKV().Get(ctx, "counter")
	if err != nil || string(v) != "1" {
		t.Errorf("host KV after restart: %q %v", v, err)
	}
}

func TestSecondRuntimeOnTheSameRootFails(t *testing.T) {
	root := t.TempDir()
	open(t, agent.Config{StateRoot: root})
	_, err := agent.Open(context.Background(), agent.Config{Agent: agent.Agent{Name: "x", Model: echoModel(t)}, StateRoot: root, Store: memkv.New()})
	if !errors.Is(err, stateroot.ErrLocked) {
		t.Fatalf("got %v", err)
	}
	abs, _ := filepath.Abs(root)
	if !strings.Contains(err.Error(), abs) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("error %q does not name the folder and the holder's PID", err)
	}
}

func TestNewerStateRootIsRefused(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, stateroot.FormatFile), []byte(`{"format":99}`), 0o644)
	_, err := agent.Open(context.Background(), agent.Config{Agent: agent.Agent{Name: "x", Model: echoModel(t)}, StateRoot: root, Store: memkv.New()})
	if !errors.Is(err, stateroot.ErrNewerFormat) || !strings.Contains(err.Error(), "upgrade agentkit") {
		t.Fatalf("got %v", err)
	}
	// The failed Open released the lock.
	os.WriteFile(filepath.Join(root, stateroot.FormatFile), []byte(`{"format":1}`), 0o644)
	open(t, agent.Config{StateRoot: root})
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	m := echoModel(t)
	cases := []struct {
		cfg  agent.Config
		want string
	}{
		{agent.Config{Agent: agent.Agent{Model: m}, StateRoot: t.TempDir()}, "Agent.Name is empty"},
		{agent.Config{Agent: agent.Agent{Name: "a"}, StateRoot: t.TempDir()}, "no Model"},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m}}, "StateRoot is empty"},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m, MaxSteps: -1}, StateRoot: t.TempDir()}, "MaxSteps"},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m}, StateRoot: t.TempDir(), Serving: "cluster"}, `"cluster"`},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m}, StateRoot: t.TempDir(), Store: kv.Funcs{Get: func(context.Context, string) ([]byte, error) { return nil, nil }}}, "Put"},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m}, StateRoot: t.TempDir(), Store: memkv.New(), Policy: agent.Policy{Debounce: -time.Second}}, "Debounce"},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m}, StateRoot: t.TempDir(), Store: kv.Funcs{Put: func(context.Context, string, []byte) error { return nil }}, Serving: agent.ServingLedger}, "CAS"},
		{agent.Config{Agent: agent.Agent{Name: "a", Model: m, Tools: append(agentToolsNamed("x"), agentToolsNamed("x")...)}, StateRoot: t.TempDir(), Store: memkv.New()}, `two tools are named "x"`},
	}
	for _, c := range cases {
		rt, err := agent.Open(ctx, c.cfg)
		if err == nil {
			rt.Close()
			t.Errorf("Open succeeded; want an error containing %q", c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open: %v; want it to contain %q", err, c.want)
		}
	}
}

func TestMirrorWritesTheSessionKeys(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "mirror"}, Store: store})
	res := start(t, rt, "one")
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	p := "agentkit/v1/mirror/"
	ks := keysWith(t, store, p)
	want := []string{
		p + "continuations/" + keys.TokenDigest(res.ContinuationToken), // never the token itself
		p + "sessions/" + res.SessionID + "/events/00000000000000000001",
		p + "sessions/" + res.SessionID + "/events/00000000000000000002",
		p + "sessions/" + res.SessionID + "/meta",
	}
	for _, w := range want {
		if !contains(ks, w) {
			t.Errorf("missing %s in %q", w, ks)
		}
	}
	// One index entry: the first turn's was replaced by the second's.
	idx := keysWith(t, store, p+"session-index/")
	if len(idx) != 1 || !strings.HasSuffix(idx[0], "/"+res.SessionID) {
		t.Errorf("index %q", idx)
	}
	var meta struct {
		V       int    `json:"v"`
		ID      string `json:"id"`
		Turns   int    `json:"turns"`
		LastSeq int    `json:"lastSeq"`
		Batches int    `json:"batches"`
	}
	b, _ := store.Get(ctx, p+"sessions/"+res.SessionID+"/meta")
	if err := json.Unmarshal(b, &meta); err != nil || meta.V != 2 || meta.ID != res.SessionID || meta.Turns != 2 || meta.LastSeq != 6 || meta.Batches != 2 {
		t.Errorf("meta %s", b)
	}
	var batch struct {
		V      int               `json:"v"`
		Events []json.RawMessage `json:"events"`
	}
	b, _ = store.Get(ctx, p+"sessions/"+res.SessionID+"/events/00000000000000000002")
	if err := json.Unmarshal(b, &batch); err != nil || batch.V != 1 || len(batch.Events) != 3 || !strings.Contains(string(batch.Events[0]), `"seq":4`) {
		t.Errorf("batch 2 %s", b)
	}
	b, _ = store.Get(ctx, p+"continuations/"+keys.TokenDigest(res.ContinuationToken))
	if string(b) != `{"v":1,"sessionId":"`+res.SessionID+`"}` {
		t.Errorf("continuation record %s", b)
	}
}

type observer struct {
	agent.NopObserver
	mu      sync.Mutex
	turns   []agent.TurnStatus
	dropped []string
	ops     map[string]int
	backlog []int
	forks   map[string]int
}

func (o *observer) TurnFinished(s agent.TurnStatus, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.turns = append(o.turns, s)
}

func (o *observer) MirrorDropped(key string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dropped = append(o.dropped, key+" "+err.Error())
}

func (o *observer) MirrorBacklog(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.backlog = append(o.backlog, n)
}

func (o *observer) MirrorForked(id string, events int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.forks == nil {
		o.forks = map[string]int{}
	}
	o.forks[id] += events
}

func (o *observer) StoreOp(op string, d time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ops == nil {
		o.ops = map[string]int{}
	}
	o.ops[op]++
}

func (o *observer) lastBacklog() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.backlog) == 0 {
		return 0
	}
	return o.backlog[len(o.backlog)-1]
}

// TestFailedMirrorWritesAreKeptAndRetried: a store that refuses writes
// never fails a turn, and what it refused reaches it at the next turn.
func TestFailedMirrorWritesAreKeptAndRetried(t *testing.T) {
	ctx := context.Background()
	inner := memkv.New()
	c := newCounting(inner)
	c.failPut.Store(true)
	obs := &observer{}
	var logs logBuffer
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "kept"}, Store: c.funcs(), Observer: obs, Logger: logs.logger()})
	res := start(t, rt, "hi")
	if res.Turn.Status != agent.StatusCompleted {
		t.Fatalf("turn %s %s", res.Turn.Status, res.Turn.Result)
	}
	p := "agentkit/v1/kept/"
	if info := rt.Info(); info.MirrorDropped < 1 || info.MirrorBacklog != 1 {
		t.Errorf("info after a refused turn: dropped %d backlog %d; want at least 1 and 1", info.MirrorDropped, info.MirrorBacklog)
	}
	if obs.lastBacklog() != 1 || len(obs.dropped) < 1 || len(obs.turns) != 1 {
		t.Errorf("observer: backlog %v dropped %q turns %v", obs.backlog, obs.dropped, obs.turns)
	}
	if out := logs.String(); !strings.Contains(out, "mirror write failed; kept and retried") || !strings.Contains(out, "/events/") {
		t.Errorf("logs lack the failed write:\n%s", out)
	}
	if ks := keysWith(t, inner, p+"sessions/"); len(ks) != 0 {
		t.Fatalf("the refusing store holds %q", ks)
	}

	// The store is back: the next turn carries the first turn's events.
	c.failPut.Store(false)
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"}); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, k := range keysWith(t, inner, p+"sessions/"+res.SessionID+"/events/") {
		b, _ := inner.Get(ctx, k)
		var batch struct{ Events []agent.Event }
		json.Unmarshal(b, &batch)
		for _, e := range batch.Events {
			seqs = append(seqs, e.Seq)
		}
	}
	if fmt.Sprint(seqs) != "[1 2 3 4 5 6]" {
		t.Errorf("stored events %v; want both turns", seqs)
	}
	if _, err := inner.Get(ctx, p+"continuations/"+keys.TokenDigest(res.ContinuationToken)); err != nil {
		t.Errorf("token after the retry: %v", err)
	}
	if info := rt.Info(); info.MirrorBacklog != 0 || obs.lastBacklog() != 0 {
		t.Errorf("backlog after the retry: info %d observer %v", info.MirrorBacklog, obs.backlog)
	}

	// A refused token write is logged with the token redacted.
	c.failPutsOf("/continuations/")
	res3 := start(t, rt, "third")
	out := logs.String()
	obs.mu.Lock()
	dropped := strings.Join(obs.dropped, "\n")
	obs.mu.Unlock()
	if strings.Contains(out, res3.ContinuationToken) || strings.Contains(dropped, res3.ContinuationToken) {
		t.Error("a continuation token reached the logs or the observer")
	}
	if !strings.Contains(out, "continuations/REDACTED") || !strings.Contains(dropped, "continuations/REDACTED") {
		t.Errorf("logs lack the redacted token key:\n%s", out)
	}
	if rt.Info().MirrorBacklog != 1 {
		t.Errorf("backlog %d with the token owed", rt.Info().MirrorBacklog)
	}
	c.failPutsOf("")
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res3.ContinuationToken, Message: "four"}); err != nil {
		t.Fatal(err)
	}
	if _, err := inner.Get(ctx, p+"continuations/"+keys.TokenDigest(res3.ContinuationToken)); err != nil || rt.Info().MirrorBacklog != 0 {
		t.Errorf("token after the retry: %v, backlog %d", err, rt.Info().MirrorBacklog)
	}
}

func agentToolsNamed(name string) []toolT {
	return []toolT{{Spec: model.ToolSpec{Name: name}, Run: noop}}
}
