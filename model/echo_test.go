package model

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"
)

func mustEcho(t *testing.T, cfg *EchoConfig) *Echo {
	t.Helper()
	e, err := NewEcho(cfg)
	if err != nil {
		t.Fatalf("NewEcho: %v", err)
	}
	return e
}

func TestEchoPlain(t *testing.T) {
	e := mustEcho(t, nil)
	if e.Name() != "echo" {
		t.Errorf("Name() = %q, want echo", e.Name())
	}
	msgs := []Message{
		{Role: RoleSystem, Content: "be kind!"},       // 8 bytes: 2 tokens
		{Role: RoleUser, Content: "first"},            // 5 bytes: 2 tokens
		{Role: RoleAssistant, Content: "echo: first"}, // 11 bytes: 3 tokens
		{Role: RoleUser, Content: "hello world"},      // 11 bytes: 3 tokens
	}
	resp, err := e.Generate(context.Background(), Request{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Role != RoleAssistant || resp.Message.Content != "echo: hello world" || len(resp.Message.ToolCalls) != 0 {
		t.Fatalf("answer = %+v, want assistant text %q", resp.Message, "echo: hello world")
	}
	want := Usage{InputTokens: 10, OutputTokens: 5, CacheReadTokens: 7, CacheWriteTokens: 3}
	if resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}
	// Deterministic: the same request gives the same answer.
	again, _ := e.Generate(context.Background(), Request{Messages: msgs})
	if again.Message.Content != resp.Message.Content || again.Usage != resp.Usage {
		t.Errorf("second answer differs: %+v vs %+v", again, resp)
	}
	// Longer messages cost more.
	long, _ := e.Generate(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: strings.Repeat("x", 400)}}})
	if long.Usage.InputTokens != 100 || long.Usage.OutputTokens != 102 {
		t.Errorf("usage of a 400-byte message = %+v, want 100 in and 102 out", long.Usage)
	}
}

// runTurn drives e like the runtime's turn loop: tools are answered by
// results, until a text answer.
func runTurn(t *testing.T, m Model, msgs []Message, results func(ToolCall) string) ([]Message, []ToolCall) {
	t.Helper()
	var calls []ToolCall
	for range 10 {
		resp, err := m.Generate(context.Background(), Request{Messages: msgs})
		if err != nil {
			t.Fatalf("Generate: %v", err)
		}
		msgs = append(msgs, resp.Message)
		if len(resp.Message.ToolCalls) == 0 {
			return msgs, calls
		}
		for _, c := range resp.Message.ToolCalls {
			calls = append(calls, c)
			msgs = append(msgs, Message{Role: RoleTool, ToolCallID: c.ID, Name: c.Name, Content: results(c)})
		}
	}
	t.Fatal("the turn did not end in 10 steps")
	return nil, nil
}

func TestEchoScriptReadsMemoryEachTurn(t *testing.T) {
	e := mustEcho(t, &EchoConfig{Script: []EchoStep{
		{Tool: "read_file", Args: map[string]any{"path": "memory/journal.jsonl"}},
		{Text: "{{.LastToolResult}}"},
	}})
	journal := []string{`{"n":1}`, `{"n":2}`}
	var msgs []Message
	for turn, want := range journal {
		msgs = append(msgs, Message{Role: RoleUser, Content: "what happened before?"})
		var calls []ToolCall
		msgs, calls = runTurn(t, e, msgs, func(c ToolCall) string { return journal[turn] })
		if len(calls) != 1 || calls[0].Name != "read_file" {
			t.Fatalf("turn %d: calls = %+v, want one read_file", turn+1, calls)
		}
		var args map[string]any
		if err := json.Unmarshal(calls[0].Arguments, &args); err != nil || args["path"] != "memory/journal.jsonl" || len(args) != 1 {
			t.Fatalf("turn %d: arguments = %s (%v)", turn+1, calls[0].Arguments, err)
		}
		if got := msgs[len(msgs)-1].Content; got != want {
			t.Errorf("turn %d: answer = %q, want the tool's result %q", turn+1, got, want)
		}
	}
	if msgs[1].ToolCalls[0].ID == msgs[5].ToolCalls[0].ID {
		t.Errorf("tool call ids repeat across turns: %q", msgs[1].ToolCalls[0].ID)
	}
}

func TestEchoTemplates(t *testing.T) {
	e := mustEcho(t, &EchoConfig{
		Script: []EchoStep{
			{Tool: "write_file", Args: map[string]any{
				"path":    "notes/{{.UserMessage}}.txt",
				"content": "turn {{.Turn}}",
				"n":       3,
				"list":    []any{"{{.Step}}", true},
			}},
			{Tool: "read_file", Args: map[string]any{"path": "x"}},
		},
		Reply: "results={{len .ToolResults}} first={{index .ToolResults 0}} quoted={{json .UserMessage}}",
	})
	msgs, calls := runTurn(t, e, []Message{{Role: RoleUser, Content: `a"b`}}, func(c ToolCall) string { return "r-" + c.Name })
	if len(calls) != 2 {
		t.Fatalf("calls = %d, want 2", len(calls))
	}
	var args map[string]any
	if err := json.Unmarshal(calls[0].Arguments, &args); err != nil {
		t.Fatalf("arguments %s are not JSON: %v", calls[0].Arguments, err)
	}
	if args["path"] != `notes/a"b.txt` || args["content"] != "turn 1" || args["n"] != float64(3) {
		t.Errorf("arguments = %v", args)
	}
	if l, _ := args["list"].([]any); len(l) != 2 || l[0] != "0" || l[1] != true {
		t.Errorf("list argument = %v", args["list"])
	}
	if got, want := msgs[len(msgs)-1].Content, `results=2 first=r-write_file quoted="a\"b"`; got != want {
		t.Errorf("reply = %q, want %q", got, want)
	}
}

func TestEchoScriptedFailure(t *testing.T) {
	e := mustEcho(t, &EchoConfig{Script: []EchoStep{{Error: "model down for {{.UserMessage}}"}}})
	_, err := e.Generate(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "x"}}})
	if !errors.Is(err, ErrScripted) || !strings.Contains(err.Error(), "model down for x") {
		t.Fatalf("err = %v, want ErrScripted with the message", err)
	}
}

func TestEchoDelayHonoursContext(t *testing.T) {
	e := mustEcho(t, &EchoConfig{Script: []EchoStep{{Text: "late", Delay: "1h"}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.Generate(ctx, Request{Messages: []Message{{Role: RoleUser, Content: "x"}}})
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestEchoBadConfig(t *testing.T) {
	for name, cfg := range map[string]EchoConfig{
		"empty step":     {Script: []EchoStep{{}}},
		"two kinds":      {Script: []EchoStep{{Tool: "a", Text: "b"}}},
		"args no tool":   {Script: []EchoStep{{Text: "a", Args: map[string]any{"x": 1}}}},
		"bad template":   {Script: []EchoStep{{Text: "{{.Nope"}}},
		"bad args tmpl":  {Script: []EchoStep{{Tool: "t", Args: map[string]any{"p": "{{"}}}},
		"bad delay":      {Script: []EchoStep{{Text: "a", Delay: "soon"}}},
		"negative delay": {Script: []EchoStep{{Text: "a", Delay: "-1s"}}},
		"bad reply":      {Reply: "{{end}}"},
	} {
		if _, err := NewEcho(&cfg); err == nil {
			t.Errorf("%s: NewEcho accepted %+v", name, cfg)
		} else if name != "bad reply" && !strings.Contains(err.Error(), "step 1") {
			t.Errorf("%s: error %q does not name the step", name, err)
		}
	}
	// A field the data does not have fails at run time, clearly.
	e := mustEcho(t, &EchoConfig{Script: []EchoStep{{Text: "{{.Nope}}"}}})
	if _, err := e.Generate(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "x"}}}); err == nil || !strings.Contains(err.Error(), "Nope") {
		t.Errorf("err = %v, want one naming the missing field", err)
	}
}

func TestEchoConcurrent(t *testing.T) {
	e := mustEcho(t, &EchoConfig{Script: []EchoStep{{Tool: "t"}, {Text: "done {{.UserMessage}}"}}})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			msg := strings.Repeat("m", i+1)
			msgs, _ := runTurn(t, e, []Message{{Role: RoleUser, Content: msg}}, func(ToolCall) string { return "" })
			if got := msgs[len(msgs)-1].Content; got != "done "+msg {
				t.Errorf("answer = %q", got)
			}
		})
	}
	wg.Wait()
}

func TestConfigYAML(t *testing.T) {
	src := `
provider: echo
echo:
  script:
    - tool: read_file
      args: {path: memory/journal.jsonl}
    - text: "journal: {{.LastToolResult}}"
`
	var cfg Config
	if err := yaml.Unmarshal([]byte(src), &cfg); err != nil {
		t.Fatal(err)
	}
	m, err := FromConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	msgs, calls := runTurn(t, m, []Message{{Role: RoleUser, Content: "hi"}}, func(ToolCall) string { return "R" })
	if len(calls) != 1 || string(calls[0].Arguments) != `{"path":"memory/journal.jsonl"}` {
		t.Fatalf("calls = %+v", calls)
	}
	if got := msgs[len(msgs)-1].Content; got != "journal: R" {
		t.Errorf("answer = %q", got)
	}

	// The same in JSON.
	var jcfg Config
	if err := json.Unmarshal([]byte(`{"provider":"echo","echo":{"script":[{"error":"boom"}]}}`), &jcfg); err != nil {
		t.Fatal(err)
	}
	m, err = FromConfig(&jcfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Generate(context.Background(), Request{Messages: []Message{{Role: RoleUser, Content: "x"}}}); !errors.Is(err, ErrScripted) {
		t.Errorf("err = %v, want ErrScripted", err)
	}
}

func TestFromConfig(t *testing.T) {
	m, err := FromConfig(nil)
	if err != nil || m.Name() != "echo" {
		t.Fatalf("FromConfig(nil) = %v, %v; want echo", m, err)
	}
	t.Setenv("AGENTKIT_TEST_KEY", "sk-secret")
	m, err = FromConfig(&Config{Provider: "openai", OpenAI: &OpenAIConfig{
		BaseURL: "http://127.0.0.1:1/v1", Model: "m", APIKeyEnv: "AGENTKIT_TEST_KEY", Timeout: "5s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	if o := m.(*OpenAI); m.Name() != "openai:m" || o.opts.Timeout.Seconds() != 5 {
		t.Errorf("openai model = %s, timeout %v", m.Name(), o.opts.Timeout)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Provider: "claude"}, "model.provider"},
		{Config{Provider: "openai"}, "model.openai"},
		{Config{OpenAI: &OpenAIConfig{}}, "model.provider"},
		{Config{Provider: "openai", OpenAI: &OpenAIConfig{BaseURL: "http://x/v1", Model: "m", Timeout: "soon"}}, "model.openai.timeout"},
		{Config{Provider: "openai", OpenAI: &OpenAIConfig{Model: "m"}}, "base URL"},
		{Config{Provider: "openai", Echo: &EchoConfig{}, OpenAI: &OpenAIConfig{BaseURL: "http://x/v1", Model: "m"}}, "model.echo"},
		{Config{Echo: &EchoConfig{Script: []EchoStep{{}}}}, "model.echo"},
	} {
		_, err := FromConfig(&c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("FromConfig(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}
