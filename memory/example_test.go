package memory_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"agentkit/memory"
	"agentkit/model"
)

func ExampleNewRecord() {
	rec := memory.NewRecord(memory.TurnInfo{
		SessionID:   "5f0c2a9e",
		ChannelID:   "http",
		Title:       "Checkout flaky test",
		UserMessage: "Why does the checkout test fail on main?",
		Result:      "The cart test races the price service mock.",
		Usage:       model.Usage{InputTokens: 18234, OutputTokens: 912, CacheReadTokens: 15002},
		FinishedAt:  time.Date(2026, 10, 1, 16, 42, 9, 118_000_000, time.UTC),
	}, 0)
	line, _ := rec.Line()
	fmt.Print(string(line))

	failed := memory.NewRecord(memory.TurnInfo{
		SessionID:   "5f0c2a9e",
		ChannelID:   "http",
		UserMessage: "And on the release branch?",
		Err:         errors.New("model: request timed out"),
		FinishedAt:  time.Date(2026, 10, 1, 16, 43, 0, 0, time.UTC),
	}, 0)
	line, _ = failed.Line()
	fmt.Print(string(line))
	// Output:
	// {"at":"2026-10-01T16:42:09.118Z","sessionId":"5f0c2a9e","channelId":"http","status":"completed","title":"Checkout flaky test","userMessage":"Why does the checkout test fail on main?","result":"The cart test races the price service mock.","usage":{"inputTokens":18234,"outputTokens":912,"cacheReadTokens":15002,"cacheWriteTokens":0}}
	// {"at":"2026-10-01T16:43:00.000Z","sessionId":"5f0c2a9e","channelId":"http","status":"failed","userMessage":"And on the release branch?","result":"model: request timed out"}
}

func ExampleHook() {
	stateRoot, _ := os.MkdirTemp("", "state")
	defer os.RemoveAll(stateRoot)

	// nil options: memory on, the default journal under the state root.
	hook, err := memory.NewHook(memory.Info{StateRoot: stateRoot, AgentName: "support"}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer hook.Close()

	ctx := context.Background()
	hook.PrepareSession(ctx, "s1")
	hook.AfterTurn(ctx, memory.TurnInfo{SessionID: "s1", ChannelID: "http", UserMessage: "hi", Result: "hello"})

	files, _ := memory.Files(memory.Dir(stateRoot))
	for _, f := range files {
		fmt.Println(filepath.Base(f))
	}
	fmt.Printf("%+v\n", hook.Stats())
	// Output:
	// journal.jsonl
	// {Appended:1 Failed:0 PrepareFailed:0}
}

func ExampleIsReservedPath() {
	for _, p := range []string{"memory/notes.md", "./memory", "memoryx/y", "docs/memory/a"} {
		fmt.Println(p, memory.IsReservedPath(p))
	}
	// Output:
	// memory/notes.md true
	// ./memory true
	// memoryx/y false
	// docs/memory/a false
}
