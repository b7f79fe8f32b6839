package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/model"
)

// storedSeqs returns the sequence numbers of the events the store holds
// for a session, batch by batch.
func storedSeqs(t *testing.T, store interface {
	Get(context.Context, string) ([]byte, error)
}, keys []string) [][]int64 {
	t.Helper()
	var out [][]int64
	for _, k := range keys {
		b, err := store.Get(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		var batch struct{ Events []agent.Event }
		if err := json.Unmarshal(b, &batch); err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for _, e := range batch.Events {
			seqs = append(seqs, e.Seq)
		}
		out = append(out, seqs)
	}
	return out
}

// TestDebounceWaitsForQuietThenFlushesAtTurnEnd pins the debounce: no
// batch is written before Debounce has passed since the last event, each
// event restarts the wait, and the turn's end writes at once.
//
// The turn (in fake time from its start): turn.started at 0; the model
// answers after 6s with a tool call (model.call, tool.call, tool.result at
// 6s), again after 6s more (at 12s), then with its text after 30s (at
// 42s). Recorded events wait for the model's answer up to a few
// milliseconds before they are written on their own (the runtime's
// publishDelay, 20ms), and the debounce counts from that write. With a 10s
// debounce the first batch is due at 22s and a few milliseconds (10s after
// the events of 12s are on disk) and holds events 1 to 7; the rest is
// written at 42s.
func TestDebounceWaitsForQuietThenFlushesAtTurnEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		m := echoModel(t,
			model.EchoStep{Tool: "list_files", Delay: "6s"},
			model.EchoStep{Tool: "list_files", Delay: "6s"},
			model.EchoStep{Text: "done", Delay: "30s"},
		)
		rt, err := agent.Open(context.Background(), agent.Config{
			Agent: agent.Agent{Name: "deb", Model: m}, StateRoot: t.TempDir(), Store: store,
			Policy: agent.Policy{Debounce: 10 * time.Second}, Logger: discard, Memory: agent.Memory{Off: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		ids := make(chan string, 1)
		done := make(chan agent.TurnResult, 1)
		t0 := time.Now()
		go func() {
			var once bool
			res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: "go", OnEvent: func(e agent.Event) {
				if !once {
					once = true
					ids <- e.SessionID
				}
			}})
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		id := <-ids
		batches := func() [][]int64 {
			return storedSeqs(t, store, keysWith(t, store, "agentkit/v1/deb/sessions/"+id+"/events/"))
		}
		at := func(d time.Duration) {
			time.Sleep(time.Until(t0.Add(d)))
			synctest.Wait()
		}

		at(22*time.Second - time.Millisecond)
		if b := batches(); len(b) != 0 {
			t.Fatalf("at 21.999s (less than 10s after the events of 12s): batches %v; want none", b)
		}
		at(22*time.Second + 100*time.Millisecond)
		if b := batches(); fmt.Sprint(b) != "[[1 2 3 4 5 6 7]]" {
			t.Fatalf("at 22.1s: batches %v; want one with events 1 to 7", b)
		}
		at(42*time.Second - time.Millisecond)
		if b := batches(); len(b) != 1 {
			t.Fatalf("before the turn's end: batches %v", b)
		}
		at(42 * time.Second)
		res := <-done
		if res.Turn.Result != "done" {
			t.Errorf("turn %+v", res.Turn)
		}
		if b := batches(); fmt.Sprint(b) != "[[1 2 3 4 5 6 7] [8 9]]" {
			t.Errorf("at the turn's end: batches %v; want the rest written at once", b)
		}
		// Nothing more is written later: the timer was stopped.
		time.Sleep(time.Hour)
		synctest.Wait()
		if b := batches(); len(b) != 2 {
			t.Errorf("an hour later: batches %v", b)
		}
	})
}
