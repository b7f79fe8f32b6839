package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"agentkit/kv/memkv"
	"agentkit/ledger"
)

// A host opens the ledger over the shared store with the function that
// runs a turn, delivers an event, and waits for the turn that consumed it.
// Every host of the agent does the same over the same store.
func Example() {
	ctx := context.Background()
	l, err := ledger.Open(ledger.Options{
		Store: memkv.New(), // in production: the agent's shared store
		Agent: "support",
		// The memory store is for tests: it cannot coordinate hosts.
		AllowProcessLocal: true,
		Handler: func(ctx context.Context, t *ledger.Turn) error {
			var in struct{ Message string }
			if err := json.Unmarshal(t.Event.Payload, &in); err != nil {
				return err
			}
			// Before a side effect: t.Check(), and t.IdempotencyKey(n).
			reply, _ := json.Marshal(map[string]string{"reply": "you said " + in.Message})
			_, err := t.Commit(ctx, []json.RawMessage{reply})
			return err
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close(ctx)
	go l.Run(ctx) // the janitor

	d, err := l.Deliver(ctx, "session-1", ledger.Event{ID: "msg-1", Payload: json.RawMessage(`{"message":"hello"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acknowledged; this host runs it:", d.Local)

	turn, err := l.Await(ctx, "session-1", "msg-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("turn %d consumed %v: %s\n", turn.Seq, turn.EventIDs, turn.Output[0])

	// A retry of the same event is a duplicate, not a second message.
	d, _ = l.Deliver(ctx, "session-1", ledger.Event{ID: "msg-1", Payload: json.RawMessage(`{"message":"hello"}`)})
	fmt.Println("duplicate:", d.Duplicate, d.State, "in turn", d.CommitSeq)
	// Output:
	// acknowledged; this host runs it: true
	// turn 1 consumed [msg-1]: {"reply":"you said hello"}
	// duplicate: true committed in turn 1
}

// A Handler that meets an event no retry can help (here: a payload that is
// not JSON) wraps its error with Permanent: the event goes to the
// dead-letter store after that one attempt, and the session goes on.
func ExamplePermanent() {
	ctx := context.Background()
	l, err := ledger.Open(ledger.Options{
		Store: memkv.New(), AllowProcessLocal: true, Agent: "support",
		Handler: func(ctx context.Context, t *ledger.Turn) error {
			var in struct{ Message string }
			if json.Unmarshal(t.Event.Payload, &in) != nil {
				return ledger.Permanent(fmt.Errorf("event %s is not a message", t.Event.ID))
			}
			_, err := t.Commit(ctx, []json.RawMessage{t.Event.Payload})
			return err
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close(ctx)

	if _, err := l.Deliver(ctx, "session-1", ledger.Event{ID: "msg-1", Payload: json.RawMessage(`"not an object"`)}); err != nil {
		fmt.Println(err)
		return
	}
	_, err = l.Await(ctx, "session-1", "msg-1")
	fmt.Println("dead-lettered:", errors.Is(err, ledger.ErrDeadLettered))
	for d, err := range l.DeadLetters(ctx, "session-1") {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s after %d attempt: %s\n", d.EventID, d.Attempts, d.LastError)
	}
	// Output:
	// dead-lettered: true
	// msg-1 after 1 attempt: event msg-1 is not a message
}
