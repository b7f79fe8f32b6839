package actor_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"agentkit/actor"
)

// A program defines a class of actors with typed state, patches one
// actor's state and reads it back.
func Example() {
	type Status struct {
		Status    string `json:"status"`
		LastReply string `json:"lastReply"`
	}
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "actors")
	defer os.RemoveAll(dir)

	host, err := actor.Open(actor.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer host.Close()
	agents, _ := actor.Define(host, "support", func() Status { return Status{Status: "idle"} })
	a, _ := agents.Actor("user-42")
	a.SetState(ctx, []byte(`{"status":"processing"}`))
	a.SetState(ctx, []byte(`{"status":"idle","lastReply":"Done."}`))
	st, _ := a.State(ctx)
	fmt.Println(st.Status, st.LastReply)
	// Output: idle Done.
}

// Messages and events are append-only logs, read from the end or paged
// after a cursor.
func ExampleLog() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "actors")
	defer os.RemoveAll(dir)
	host, _ := actor.Open(actor.Options{Dir: dir})
	defer host.Close()
	chats, _ := actor.Define[map[string]any](host, "chat", nil)
	a, _ := chats.Actor("room-1")

	for _, text := range []string{`"hello"`, `"how are you?"`, `"fine"`} {
		a.Messages().Append(ctx, "user", []byte(text))
	}
	last, _ := a.Messages().Last(ctx, 2)
	for _, m := range last {
		fmt.Println(m.Seq, m.Type, string(m.Data))
	}
	page, _ := a.Messages().After(ctx, 1, 10)
	fmt.Println(len(page), "after seq 1")
	// Output:
	// 2 user "how are you?"
	// 3 user "fine"
	// 2 after seq 1
}
