package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/ledger"
	"agentkit/model"
	"agentkit/tool"
)

// addTool adds its two arguments; it fails on negative numbers.
var addTool = tool.Tool{
	Spec: model.ToolSpec{Name: "add", Description: "add a and b", Parameters: json.RawMessage(`{"type":"object"}`)},
	Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
		var in struct{ A, B int }
		if err := json.Unmarshal(args, &in); err != nil {
			return "", err
		}
		if in.A < 0 || in.B < 0 {
			return "", errors.New("negative numbers are not supported")
		}
		return jsonInt(in.A + in.B), nil
	},
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

// opener opens a runtime for one test of the turn suite, on one commit
// path.
type opener func(testing.TB, agent.Config) *agent.Runtime

// turnSuite is the turn's behaviour, run on every commit path by
// TestTurnSuite: each test takes the opener of its path.
var turnSuite = []struct {
	name string
	run  func(*testing.T, opener)
	// local is set for a test that reads a turn's effects (its hooks,
	// its journal record) as soon as the turn answers: in serving mode
	// ledger the answer comes with the commit and the effects follow it
	// on the holder, so the test runs on the paths that answer after them.
	local bool
}{
	{name: "TurnRunsToolsAndSumsUsage", run: testTurnRunsToolsAndSumsUsage},
	{name: "StepLimitFailsTheTurn", run: testStepLimitFailsTheTurn},
	{name: "ModelErrorFailsTheTurn", run: testModelErrorFailsTheTurn},
	{name: "UnknownToolAndBadArguments", run: testUnknownToolAndBadArguments},
	{name: "HistoryHooksAndFirstPrompt", run: testHistoryHooksAndFirstPrompt, local: true},
	{name: "EffectsFollowTheCommit", run: testEffectsFollowTheCommit},
	{name: "MemoryOff", run: testMemoryOff},
	{name: "MemoryOffKeepsEarlierRecords", run: testMemoryOffKeepsEarlierRecords},
	{name: "Subscribe", run: testSubscribe},
	{name: "InvalidRequests", run: testInvalidRequests},
	{name: "WorkspaceFilesAndMemoryView", run: testWorkspaceFilesAndMemoryView},
	{name: "HostKVAndFilesFromATool", run: testHostKVAndFilesFromATool},
	{name: "WorkspaceSeedCopiedIntoNewSessions", run: testWorkspaceSeedCopiedIntoNewSessions},
	{name: "AnEventIsOnDiskBeforeAnyoneSeesIt", run: testAnEventIsOnDiskBeforeAnyoneSeesIt},
}

// TestTurnSuite runs the turn suite on serving mode local (the store
// mirror), on serving mode ledger (over the memory driver) and on a test
// double of the commit path (agent.WithCommitPathDouble): the turn is one
// function whatever path commits it.
func TestTurnSuite(t *testing.T) {
	paths := []struct {
		name string
		open opener
	}{
		{"local", open},
		{"double", func(t testing.TB, cfg agent.Config) *agent.Runtime { return open(t, agent.WithCommitPathDouble(cfg)) }},
		{"ledger", func(t testing.TB, cfg agent.Config) *agent.Runtime {
			cfg.Serving = agent.ServingLedger
			cfg.Ledger = agent.LedgerOptions{Tuning: ledger.Tuning{FollowInterval: 20 * time.Millisecond, JanitorInterval: 50 * time.Millisecond}, AllowProcessLocal: true}
			return open(t, cfg)
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			for _, tc := range turnSuite {
				if tc.local && p.name == "ledger" {
					continue
				}
				t.Run(tc.name, func(t *testing.T) { tc.run(t, p.open) })
			}
		})
	}
}

func testTurnRunsToolsAndSumsUsage(t *testing.T, open opener) {
	m := echoModel(t,
		model.EchoStep{Tool: "add", Args: map[string]any{"a": 2, "b": 3}},
		model.EchoStep{Tool: "add", Args: map[string]any{"a": -1, "b": 3}},
		model.EchoStep{Text: "results: {{index .ToolResults 0}} / {{index .ToolResults 1}}"},
	)
	rt := open(t, agent.Config{Agent: agent.Agent{Model: m, Tools: []tool.Tool{addTool}}})
	var streamed []agent.Event
	res, err := rt.StartSession(context.Background(), agent.StartRequest{
		Message: "add things",
		OnEvent: func(e agent.Event) { streamed = append(streamed, e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Turn.Status != agent.StatusCompleted {
		t.Fatalf("status %s: %s", res.Turn.Status, res.Turn.Result)
	}
	// The tool error went back to the model as the tool's result.
	if want := "results: 5 / error: negative numbers are not supported"; res.Turn.Result != want {
		t.Errorf("result %q, want %q", res.Turn.Result, want)
	}
	page, err := rt.Events(context.Background(), res.SessionID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var sum model.Usage
	for i, e := range page.Events {
		types = append(types, e.Type)
		if e.Seq != int64(i+1) || e.SessionID != res.SessionID || e.Turn != 1 {
			t.Errorf("event %d: seq %d session %s turn %d", i, e.Seq, e.SessionID, e.Turn)
		}
		if e.Type == agent.EventModelCall {
			sum = sum.Add(*e.Usage)
		}
	}
	want := "turn.started model.call tool.call tool.result model.call tool.call tool.result model.call turn.finished"
	if strings.Join(types, " ") != want {
		t.Errorf("events %s\nwant   %s", strings.Join(types, " "), want)
	}
	last := page.Events[len(page.Events)-1]
	if last.Status != agent.StatusCompleted || *last.Usage != res.Turn.Usage || last.Result != res.Turn.Result {
		t.Errorf("turn.finished %+v", last)
	}
	if sum != res.Turn.Usage || sum.InputTokens == 0 || sum.OutputTokens == 0 || sum.CacheReadTokens == 0 {
		t.Errorf("usage %+v, sum of model calls %+v", res.Turn.Usage, sum)
	}
	if tr := page.Events[6]; !tr.IsError || !strings.Contains(tr.Output, "negative") || page.Events[3].IsError {
		t.Errorf("tool results: %+v / %+v", page.Events[3], tr)
	}
	if len(streamed) != len(page.Events) {
		t.Fatalf("OnEvent saw %d events, the log has %d", len(streamed), len(page.Events))
	}
	for i := range streamed {
		if streamed[i].Seq != page.Events[i].Seq || streamed[i].Type != page.Events[i].Type {
			t.Errorf("streamed %d: %+v vs %+v", i, streamed[i], page.Events[i])
		}
	}
}

func testStepLimitFailsTheTurn(t *testing.T, open opener) {
	loop := make([]model.EchoStep, 10)
	for i := range loop {
		loop[i] = model.EchoStep{Tool: "add", Args: map[string]any{"a": 1, "b": 1}}
	}
	rt := open(t, agent.Config{Agent: agent.Agent{Model: echoModel(t, loop...), Tools: []tool.Tool{addTool}, MaxSteps: 3}})
	res := start(t, rt, "loop")
	if res.Turn.Status != agent.StatusFailed || !strings.Contains(res.Turn.Result, "step limit of 3 model calls") {
		t.Errorf("got %s %q", res.Turn.Status, res.Turn.Result)
	}
	page, _ := rt.Events(context.Background(), res.SessionID, 0, 100)
	calls := 0
	for _, e := range page.Events {
		if e.Type == agent.EventModelCall {
			calls++
		}
	}
	if calls != 3 {
		t.Errorf("%d model calls, want 3", calls)
	}
	if res.Turn.Usage.InputTokens == 0 {
		t.Error("a failed turn still reports the usage of its model calls")
	}
}

func testModelErrorFailsTheTurn(t *testing.T, open opener) {
	rt := open(t, agent.Config{Agent: agent.Agent{Model: echoModel(t, model.EchoStep{Error: "quota exceeded"})}})
	res := start(t, rt, "hi")
	if res.Turn.Status != agent.StatusFailed || !strings.Contains(res.Turn.Result, "model error") || !strings.Contains(res.Turn.Result, "quota exceeded") {
		t.Errorf("got %s %q", res.Turn.Status, res.Turn.Result)
	}
	s, err := rt.GetSession(context.Background(), res.SessionID)
	if err != nil || s.LastStatus != agent.StatusFailed || s.Turns != 1 {
		t.Errorf("session %+v %v", s, err)
	}
	// The session goes on after a failed turn.
	res2, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"})
	if err != nil || res2.SessionID != res.SessionID {
		t.Fatalf("continue: %+v %v", res2, err)
	}
}

func testUnknownToolAndBadArguments(t *testing.T, open opener) {
	calls := 0
	rec := &recorder{}
	rec.answer = func(req model.Request) (model.Response, error) {
		calls++
		switch calls {
		case 1:
			return model.Response{Message: model.Message{Role: "assistant", ToolCalls: []model.ToolCall{
				{ID: "a", Name: "nope", Arguments: json.RawMessage(`{}`)},
				{ID: "b", Name: "add", Arguments: json.RawMessage(`{not json`)},
				{ID: "c", Name: "boom", Arguments: json.RawMessage(`{}`)},
			}}}, nil
		default:
			var outs []string
			for _, m := range req.Messages {
				if m.Role == model.RoleTool {
					outs = append(outs, m.ToolCallID+"="+m.Content)
				}
			}
			return model.Response{Message: model.Message{Role: "assistant", Content: strings.Join(outs, "\n")}}, nil
		}
	}
	boom := tool.Tool{Spec: model.ToolSpec{Name: "boom"}, Run: func(context.Context, *tool.Env, json.RawMessage) (string, error) { panic("kaboom") }}
	rt := open(t, agent.Config{Agent: agent.Agent{Model: rec, Tools: []tool.Tool{addTool, boom}, NoWorkspaceTools: true}})
	res := start(t, rt, "go")
	if res.Turn.Status != agent.StatusCompleted {
		t.Fatalf("%s %s", res.Turn.Status, res.Turn.Result)
	}
	for _, want := range []string{`a=error: there is no tool named "nope"; the tools are add, boom`, "b=error: the arguments of add are not valid JSON", "c=error: the tool boom failed unexpectedly"} {
		if !strings.Contains(res.Turn.Result, want) {
			t.Errorf("result %q lacks %q", res.Turn.Result, want)
		}
	}
}

func testHistoryHooksAndFirstPrompt(t *testing.T, open opener) {
	rec := &recorder{}
	var started []agent.SessionInfo
	var after []agent.TurnInfo
	root := t.TempDir()
	rt := open(t, agent.Config{
		StateRoot: root,
		Agent: agent.Agent{
			Model:        rec,
			Instructions: "Be brief.",
			Hooks: agent.Hooks{
				OnSessionStart: func(ctx context.Context, s agent.SessionInfo) error {
					started = append(started, s)
					return errors.New("ignored")
				},
				FirstPrompt: func(ctx context.Context, s agent.SessionInfo) (string, error) {
					return "Channel is " + s.ChannelID + ".", nil
				},
				AfterTurn: func(ctx context.Context, ti agent.TurnInfo) error {
					after = append(after, ti)
					return nil
				},
			},
		},
	})
	res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "one", ChannelID: "slack", Title: "T"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	reqs := rec.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls", len(reqs))
	}
	journal := filepath.Join(rt.StateRoot(), "memory", "journal.jsonl")
	for i, req := range reqs {
		sys := req.Messages[0]
		if sys.Role != model.RoleSystem || !strings.HasPrefix(sys.Content, "Be brief.\n\nChannel is slack.") || !strings.Contains(sys.Content, "memory/journal.jsonl") || strings.Contains(sys.Content, rt.StateRoot()) {
			t.Errorf("call %d system prompt %q", i, sys.Content)
		}
	}
	// The second call sees the first turn's exchange.
	var got []string
	for _, m := range reqs[1].Messages[1:] {
		got = append(got, m.Role+":"+m.Content)
	}
	if want := "user:one assistant:ok: one user:two"; strings.Join(got, " ") != want {
		t.Errorf("history %q, want %q", strings.Join(got, " "), want)
	}
	if len(started) != 1 || started[0].SessionID != res.SessionID || started[0].ChannelID != "slack" || started[0].Title != "T" || started[0].JournalPath != journal {
		t.Errorf("OnSessionStart %+v", started)
	}
	if len(after) != 2 || after[1].Turn != 2 || after[1].UserMessage != "two" || after[1].Status != agent.StatusCompleted ||
		after[1].Result != "ok: two" || after[1].Usage.OutputTokens != 2 || after[0].Source != agent.SourceAPI {
		t.Errorf("AfterTurn %+v", after)
	}
	// The memory journal recorded both turns.
	b, err := os.ReadFile(journal)
	if err != nil || strings.Count(string(b), "\n") != 2 || !strings.Contains(string(b), `"userMessage":"two"`) {
		t.Errorf("journal %q %v", b, err)
	}
}

func testMemoryOff(t *testing.T, open opener) {
	rec := &recorder{}
	rt := open(t, agent.Config{Agent: agent.Agent{Model: rec}, Memory: agent.Memory{Off: true}})
	start(t, rt, "x")
	if sys := rec.requests()[0].Messages[0]; sys.Role == model.RoleSystem {
		t.Errorf("with no instructions and memory off there is no system prompt, got %q", sys.Content)
	}
	if _, err := os.Stat(filepath.Join(rt.StateRoot(), "memory", "journal.jsonl")); !os.IsNotExist(err) {
		t.Errorf("journal written with memory off: %v", err)
	}
	if info := rt.Info(); info.Memory || info.JournalPath != "" {
		t.Errorf("info %+v", info)
	}
}

// TestMemoryOffKeepsEarlierRecords: turning memory off stops new journal
// records and leaves the ones already written.
func testMemoryOffKeepsEarlierRecords(t *testing.T, open opener) {
	root := t.TempDir()
	store := memkv.New()
	journal := filepath.Join(root, "memory", "journal.jsonl")
	on := open(t, agent.Config{StateRoot: root, Store: store})
	start(t, on, "remember this")
	if err := on.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(journal)
	if err != nil || !strings.Contains(string(before), "remember this") {
		t.Fatalf("journal with memory on: %q %v", before, err)
	}
	off := open(t, agent.Config{StateRoot: root, Store: store, Memory: agent.Memory{Off: true}})
	start(t, off, "forget this")
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(journal)
	if err != nil || string(after) != string(before) {
		t.Errorf("journal after a turn with memory off: %q %v; want the earlier records, unchanged", after, err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "memory"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "journal") && e.Name() != "journal.jsonl" {
			t.Errorf("memory off rotated or copied the journal: %s", e.Name())
		}
	}
}

func testSubscribe(t *testing.T, open opener) {
	rt := open(t, agent.Config{Agent: agent.Agent{Model: echoModel(t, model.EchoStep{Tool: "list_files"}, model.EchoStep{Text: "done"})}})
	res := start(t, rt, "first")
	ch, cancel := rt.Subscribe(res.SessionID)
	other, cancelOther := rt.Subscribe("another-session")
	defer cancelOther()
	if _, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "second"}); err != nil {
		t.Fatal(err)
	}
	var types []string
	for len(types) < 6 {
		e := <-ch
		if e.Turn != 2 || e.SessionID != res.SessionID {
			t.Errorf("event %+v", e)
		}
		types = append(types, e.Type)
	}
	if want := "turn.started model.call tool.call tool.result model.call turn.finished"; strings.Join(types, " ") != want {
		t.Errorf("live %q", strings.Join(types, " "))
	}
	cancel()
	if _, ok := <-ch; ok {
		t.Error("channel still open after cancel")
	}
	cancel() // idempotent
	select {
	case e := <-other:
		t.Errorf("another session's subscriber got %+v", e)
	default:
	}
}

func testInvalidRequests(t *testing.T, open opener) {
	rt := open(t, agent.Config{})
	ctx := context.Background()
	check := func(err error, field string) {
		t.Helper()
		var ie *agent.InvalidError
		if !errors.As(err, &ie) || ie.Field != field || !errors.Is(err, agent.ErrInvalid) {
			t.Errorf("got %v, want an InvalidError for %s", err, field)
		}
	}
	_, err := rt.StartSession(ctx, agent.StartRequest{Message: "  "})
	check(err, "message")
	_, err = rt.StartSession(ctx, agent.StartRequest{Message: "x", Title: strings.Repeat("t", 2000)})
	check(err, "title")
	_, err = rt.StartSession(ctx, agent.StartRequest{Message: "x", WorkspaceFiles: map[string]string{"memory/notes.md": "x"}})
	check(err, "workspaceFiles")
	if !errors.Is(err, agent.ErrReservedPath) || !strings.Contains(err.Error(), `"memory/notes.md"`) {
		t.Errorf("reserved path error %v", err)
	}
	_, err = rt.StartSession(ctx, agent.StartRequest{Message: "x", WorkspaceFiles: map[string]string{"../escape": "x"}})
	check(err, "workspaceFiles")
	_, err = rt.Continue(ctx, agent.ContinueRequest{Message: "x"})
	check(err, "continuationToken")
	_, err = rt.ListSessions(ctx, 0, "garbage")
	check(err, "cursor")
	_, err = rt.ListSessions(ctx, 5000, "")
	check(err, "limit")
	page, _ := rt.ListSessions(ctx, 10, "")
	if len(page.Sessions) != 0 {
		t.Errorf("rejected requests created sessions: %+v", page.Sessions)
	}
}

func testWorkspaceFilesAndMemoryView(t *testing.T, open opener) {
	m := echoModel(t,
		model.EchoStep{Tool: "read_file", Args: map[string]any{"path": "notes/todo.md"}},
		model.EchoStep{Tool: "read_file", Args: map[string]any{"path": "memory/journal.jsonl"}},
		model.EchoStep{Tool: "write_file", Args: map[string]any{"path": "memory/x.md", "content": "no"}},
		model.EchoStep{Text: "{{index .ToolResults 0}}|{{index .ToolResults 1}}|{{index .ToolResults 2}}"},
	)
	rt := open(t, agent.Config{Agent: agent.Agent{Model: m}})
	os.WriteFile(filepath.Join(rt.StateRoot(), "memory", "journal.jsonl"), []byte(`{"old":"record"}`+"\n"), 0o644)
	res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "read", WorkspaceFiles: map[string]string{"notes/todo.md": "buy milk"}})
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(res.Turn.Result, "|")
	if len(parts) != 3 || !strings.Contains(parts[0], "buy milk") || !strings.Contains(parts[1], `{"old":"record"}`) || !strings.HasPrefix(parts[2], "error:") {
		t.Errorf("result %q", res.Turn.Result)
	}
	if _, err := os.Stat(filepath.Join(rt.StateRoot(), "memory", "x.md")); !os.IsNotExist(err) {
		t.Error("write_file wrote into memory/")
	}
	b, err := os.ReadFile(filepath.Join(rt.StateRoot(), "workspaces", res.SessionID, "notes", "todo.md"))
	if err != nil || string(b) != "buy milk" {
		t.Errorf("workspace file %q %v", b, err)
	}
}

func testHostKVAndFilesFromATool(t *testing.T, open opener) {
	kvTool := tool.Tool{
		Spec: model.ToolSpec{Name: "remember"},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			if err := env.KV.Put(ctx, "alert-memory/abc", []byte(`{"seen":true}`)); err != nil {
				return "", err
			}
			v, err := env.KV.Get(ctx, "alert-memory/abc")
			if err != nil {
				return "", err
			}
			if err := env.Files.WriteFile("blob.bin", []byte("blob"), 0o644); err != nil {
				return "", err
			}
			if env.Logger == nil || env.SessionID == "" || env.ChannelID != "http" || env.Workspace == nil {
				return "", errors.New("incomplete env")
			}
			return string(v), nil
		},
	}
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "kv agent", Model: echoModel(t, model.EchoStep{Tool: "remember"}, model.EchoStep{Text: "{{.LastToolResult}}"}), Tools: []tool.Tool{kvTool}}})
	res := start(t, rt, "go")
	if res.Turn.Result != `{"seen":true}` {
		t.Fatalf("result %q", res.Turn.Result)
	}
	// Stored under agentkit/v1/{agent}/kv/{encoded key}.
	ks := keysWith(t, rt.Store(), "agentkit/v1/kv%20agent/kv/")
	if len(ks) != 1 || ks[0] != "agentkit/v1/kv%20agent/kv/alert-memory%2Fabc" {
		t.Errorf("host KV keys %q", ks)
	}
	if b, err := os.ReadFile(filepath.Join(rt.StateRoot(), "files", "blob.bin")); err != nil || string(b) != "blob" {
		t.Errorf("host file %q %v", b, err)
	}
	// Host KV is reachable outside turns too, and its errors are returned.
	if err := rt.HostKV().Put(context.Background(), "k", []byte("not json")); err == nil {
		t.Error("a non-JSON host KV value was accepted")
	}
}

func testWorkspaceSeedCopiedIntoNewSessions(t *testing.T, open opener) {
	m := echoModel(t,
		model.EchoStep{Tool: "read_file", Args: map[string]any{"path": "notes/todo.md"}},
		model.EchoStep{Text: "{{.LastToolResult}}"},
	)
	rt := open(t, agent.Config{Agent: agent.Agent{Model: m, WorkspaceSeed: map[string]string{"notes/todo.md": "buy milk"}}})
	res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "read"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Turn.Result, "buy milk") {
		t.Fatalf("result %q; want the seeded file's content", res.Turn.Result)
	}
}

func TestWorkspaceSeedUnderMemoryIsRefused(t *testing.T) {
	_, err := agent.Open(context.Background(), agent.Config{
		Agent:     agent.Agent{Name: "a", Model: echoModel(t), WorkspaceSeed: map[string]string{"memory/journal.jsonl": "{}"}},
		StateRoot: t.TempDir(),
		Store:     memkv.New(),
	})
	if err == nil || !strings.Contains(err.Error(), "memory/journal.jsonl") {
		t.Fatalf("Open with a seed under memory/: %v; want a refusal naming the path", err)
	}
}

// TestAnEventIsOnDiskBeforeAnyoneSeesIt: when a turn's OnEvent or a
// subscriber gets an event, the session database already holds it (a
// client that saw event N finds it after any crash), for the events
// written before a tool runs, while a slow model thinks, and at the end.
func testAnEventIsOnDiskBeforeAnyoneSeesIt(t *testing.T, open opener) {
	ctx := context.Background()
	rt := open(t, agent.Config{Agent: agent.Agent{Model: echoModel(t,
		model.EchoStep{Tool: "list_files"},
		model.EchoStep{Text: "done", Delay: "100ms"},
	)}})
	var mu sync.Mutex
	var checked []int64
	onDisk := func(e agent.Event) {
		last, err := rt.LastEvents(ctx, e.SessionID, 1)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || len(last) == 0 || last[0].Seq < e.Seq {
			t.Errorf("event %d (%s) was published before it was on disk: the database's last event is %+v (%v)", e.Seq, e.Type, last, err)
		}
		checked = append(checked, e.Seq)
	}
	res, err := rt.StartSession(ctx, agent.StartRequest{Message: "go", OnEvent: onDisk})
	if err != nil || res.Turn.Status != agent.StatusCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	events, cancel := rt.Subscribe(res.SessionID)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range events {
			onDisk(e)
			if e.Type == agent.EventTurnFinished {
				return
			}
		}
	}()
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"}); err != nil {
		t.Fatal(err)
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(checked) != 2*6 {
		t.Errorf("checked %d events; want 6 from each turn (each calls a tool)", len(checked))
	}
}
