package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/tool"
)

// An agent with one Go tool, run for two turns of one session.
func Example() {
	ctx := context.Background()
	root, _ := os.MkdirTemp("", "agentkit-example-")
	defer os.RemoveAll(root)

	shout := tool.Tool{
		Spec: model.ToolSpec{
			Name:        "shout",
			Description: "Upper-case a text.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
		},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			var in struct{ Text string }
			if err := json.Unmarshal(args, &in); err != nil {
				return "", err
			}
			// Remember the last shout in host KV (awaited, errors returned).
			if err := env.KV.Put(ctx, "last-shout", args); err != nil {
				return "", err
			}
			return strings.ToUpper(in.Text), nil
		},
	}
	// A scripted echo model: call shout with the user's message, then
	// answer with what it returned.
	m, _ := model.NewEcho(&model.EchoConfig{Script: []model.EchoStep{
		{Tool: "shout", Args: map[string]any{"text": "{{.UserMessage}}"}},
		{Text: "{{.LastToolResult}}!"},
	}})
	rt, err := agent.Open(ctx, agent.Config{
		Agent:     agent.Agent{Name: "shouter", Model: m, Tools: []tool.Tool{shout}},
		StateRoot: root,
		Store:     memkv.New(), // nil would use the SQLite store in root/kv/kv.db
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()

	res, err := rt.StartSession(ctx, agent.StartRequest{Message: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Turn.Status, res.Turn.Result)
	res, err = rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Turn.Status, res.Turn.Result)
	last, _ := rt.HostKV().Get(ctx, "last-shout")
	fmt.Println(string(last))
	// Output:
	// completed HELLO!
	// completed AGAIN!
	// {"text":"again"}
}
