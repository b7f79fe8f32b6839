package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/tool"
)

// Every session is an actor: a tool changes the session's state with a
// merge patch through tool.Env.Actor, and the program reads it after the
// turn.
func ExampleRuntime_SessionActor() {
	ctx := context.Background()
	root, _ := os.MkdirTemp("", "agentkit-example-")
	defer os.RemoveAll(root)

	setStatus := tool.Tool{
		Spec: model.ToolSpec{Name: "set_status", Description: "Record the task's status.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"status":{"type":"string"}}}`)},
		Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
			st, err := env.Actor.PatchState(ctx, args) // {"status":"..."} merged into the state
			return string(st), err
		},
	}
	m, _ := model.NewEcho(&model.EchoConfig{Script: []model.EchoStep{
		{Tool: "set_status", Args: map[string]any{"status": "{{.UserMessage}}"}},
		{Text: "noted"},
	}})
	rt, err := agent.Open(ctx, agent.Config{
		Agent:     agent.Agent{Name: "tracker", Model: m, Tools: []tool.Tool{setStatus}},
		StateRoot: root,
		Store:     memkv.New(),
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()

	res, _ := rt.StartSession(ctx, agent.StartRequest{Message: "shipped"})
	a, _ := rt.SessionActor(ctx, res.SessionID)
	st, _ := a.State(ctx)
	fmt.Println(string(st))
	msgs, _ := a.Messages(ctx, 0, 0)
	fmt.Println(len(msgs), "messages, the first from the", msgs[0].Type)
	// Output:
	// {"status":"shipped"}
	// 4 messages, the first from the user
}
