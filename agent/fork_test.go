package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
)

// forkHosts opens two hosts in serving mode local on one store, with the
// model of each (nil: the default echo); it returns them with the store.
func forkHosts(t *testing.T, ma, mb model.Model) (a, b *agent.Runtime, store *kv.DB) {
	t.Helper()
	store = memkv.New()
	host := func(m model.Model) *agent.Runtime {
		rt := open(t, agent.Config{Agent: agent.Agent{Name: "forks", NoWorkspaceTools: true, Model: m}, Store: store})
		if g, ok := m.(interface{ open() }); ok {
			t.Cleanup(g.open)
		}
		return rt
	}
	return host(ma), host(mb), store
}

// messagesOf returns the user messages of a host's listing of a session:
// those of its turns, and, marked "forked:", those of the forked turns
// its turn.forked events hold.
func messagesOf(t *testing.T, rt *agent.Runtime, id string) (msgs []string, forks []agent.Event) {
	t.Helper()
	page, err := rt.Events(context.Background(), id, 0, agent.MaxPageSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range page.Events {
		switch ev.Type {
		case agent.EventTurnStarted:
			msgs = append(msgs, ev.Message)
		case agent.EventTurnForked:
			forks = append(forks, ev)
			for _, raw := range ev.Forked {
				var f agent.Event
				if json.Unmarshal(raw, &f) == nil && f.Type == agent.EventTurnStarted {
					msgs = append(msgs, "forked:"+f.Message)
				}
			}
		}
	}
	return msgs, forks
}

// TestAForkedTurnIsInTheHistoryOfEveryHost: host A runs a turn while host
// B commits another from the same point; A's turn loses the session head.
// A answers it completed (the default mode never fails a turn for the
// store), and the turn is not lost: it is a turn.forked event after B's
// turn, naming where it branched and the winner, which both hosts list,
// which a subscriber on B streams, and which the next turn's model sees.
func TestAForkedTurnIsInTheHistoryOfEveryHost(t *testing.T) {
	ctx := context.Background()
	ga := newGate(t)
	rec := &recorder{}
	a, b, _ := forkHosts(t, ga, rec)
	first := start(t, a, "one")

	// B knows the session, and streams it.
	if _, err := b.GetSession(ctx, first.SessionID); err != nil {
		t.Fatal(err)
	}
	stream, stop := b.Subscribe(first.SessionID)
	defer stop()

	ga.blocking.Store(true)
	answered := make(chan agent.TurnResult, 1)
	go func() {
		res, err := a.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "on A"})
		if err != nil {
			t.Errorf("A's turn: %v", err)
		}
		answered <- res
	}()
	<-ga.entered // A's turn is in its model call
	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "on B"}); err != nil {
		t.Fatal(err)
	}
	ga.open()
	res := <-answered
	if res.Turn.Status != agent.StatusCompleted || res.Turn.Result != "re: on A" {
		t.Fatalf("A's turn answered %+v; want it completed", res.Turn)
	}

	// B's subscriber sees the fork arrive, though B did not record it
	// (nothing else reads the session on B before this).
	deadline := time.After(20 * time.Second)
	for seen := false; !seen; {
		select {
		case ev, ok := <-stream:
			if !ok {
				t.Fatal("B's stream ended")
			}
			seen = ev.Type == agent.EventTurnForked
		case <-deadline:
			t.Fatal("B's subscriber did not see the fork within 20 s")
		}
	}
	for name, rt := range map[string]*agent.Runtime{"A": a, "B": b} {
		msgs, forks := messagesOf(t, rt, first.SessionID)
		if strings.Join(msgs, "|") != "one|on B|forked:on A" {
			t.Errorf("host %s lists %q; want one, on B, then A's turn as a fork", name, msgs)
		}
		if len(forks) != 1 || forks[0].ForkedAfter != first.LastSeq || forks[0].Message != "on A" || forks[0].Result != "re: on A" || forks[0].LostTo == "" {
			t.Errorf("host %s: the fork %+v; want it branched after event %d, naming the winner, with A's message and answer", name, forks, first.LastSeq)
		}
	}
	// The next turn, on B, has the forked turn in its conversation.
	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "after"}); err != nil {
		t.Fatal(err)
	}
	reqs := rec.requests()
	var users []string
	for _, m := range reqs[len(reqs)-1].Messages {
		if m.Role == "user" {
			users = append(users, m.Content)
		}
	}
	if strings.Join(users, "|") != "one|on B|on A|after" {
		t.Errorf("the next turn's model saw the user messages %q; want the forked turn's among them", users)
	}
}

// TestConcurrentTurnsOnTwoHostsAreAllKept is the trial's case: two hosts
// in the default mode continue one session at the same time, and every
// turn answered completed is in the session's history afterwards, on both
// hosts, once: as a turn or inside a fork.
func TestConcurrentTurnsOnTwoHostsAreAllKept(t *testing.T) {
	ctx := context.Background()
	a, b, _ := forkHosts(t, nil, nil)
	first := start(t, a, "one")
	var mu sync.Mutex
	var completed []string
	var wg sync.WaitGroup
	for round := range 6 {
		for name, rt := range map[string]*agent.Runtime{"A": a, "B": b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := fmt.Sprintf("%s%d", name, round)
				res, err := rt.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: msg})
				if err == nil && res.Turn.Status == agent.StatusCompleted {
					mu.Lock()
					completed = append(completed, msg)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	if len(completed) != 12 {
		t.Fatalf("%d of 12 turns completed: %q", len(completed), completed)
	}
	// Each host takes what the other committed when it reads the session.
	for name, rt := range map[string]*agent.Runtime{"A": a, "B": b} {
		msgs, _ := messagesOf(t, rt, first.SessionID)
		var kept []string
		for _, m := range msgs {
			kept = append(kept, strings.TrimPrefix(m, "forked:"))
		}
		for _, m := range completed {
			if n := count(kept, m); n != 1 {
				t.Errorf("host %s lists %q %d times; every completed turn once (listing %q)", name, m, n, msgs)
			}
		}
	}
}

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestIfLastSeqRunsOnlyWhereTheClientSawTheSession: a follow-up that names
// the last event it saw runs only if the session still ends there (412
// otherwise, nothing run), and a turn that runs and is then forked is
// answered ErrTurnForked naming where the session is; the fork is in the
// history all the same.
func TestIfLastSeqRunsOnlyWhereTheClientSawTheSession(t *testing.T) {
	ctx := context.Background()
	ga := newGate(t)
	a, b, _ := forkHosts(t, ga, nil)
	first := start(t, a, "one")
	second, err := b.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "two", IfLastSeq: first.LastSeq})
	if err != nil || second.LastSeq <= first.LastSeq {
		t.Fatalf("a follow-up where the client saw the session: %+v %v", second, err)
	}
	// A client that saw only the first turn is told the session moved on.
	_, err = a.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "stale", IfLastSeq: first.LastSeq})
	var pe *agent.PositionError
	if !errors.Is(err, agent.ErrPreconditionFailed) || !errors.As(err, &pe) || pe.LastSeq != second.LastSeq {
		t.Fatalf("a follow-up after event %d of a session at %d: %v; want ErrPreconditionFailed naming %d", first.LastSeq, second.LastSeq, err, second.LastSeq)
	}
	if msgs, _ := messagesOf(t, a, first.SessionID); slices.Contains(msgs, "stale") {
		t.Fatalf("the refused follow-up ran: %q", msgs)
	}

	// A's turn runs from event second.LastSeq while B commits another.
	ga.blocking.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := a.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "on A", IfLastSeq: second.LastSeq})
		done <- err
	}()
	<-ga.entered
	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "on B"}); err != nil {
		t.Fatal(err)
	}
	ga.open()
	err = <-done
	if !errors.Is(err, agent.ErrTurnForked) || !errors.As(err, &pe) {
		t.Fatalf("A's forked turn answered %v; want ErrTurnForked", err)
	}
	s, _ := a.GetSession(ctx, first.SessionID)
	if pe.LastSeq != s.LastSeq || !strings.Contains(err.Error(), fmt.Sprint(s.LastSeq)) {
		t.Errorf("the forked turn's error names event %d (%v); the session is at %d", pe.LastSeq, err, s.LastSeq)
	}
	if msgs, _ := messagesOf(t, b, first.SessionID); !slices.Contains(msgs, "forked:on A") {
		t.Errorf("B lists %q; want A's turn as a fork", msgs)
	}
}

// TestIfLastSeqNeedsTheStore: with the store down, a follow-up with a
// precondition is refused (ErrStoreUnavailable: it cannot be checked),
// and one without runs from the local copy, as always.
func TestIfLastSeqNeedsTheStore(t *testing.T) {
	ctx := context.Background()
	c := newCounting(memkv.New())
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "down"}, Store: c.funcs()})
	first := start(t, rt, "one")
	c.failGet.Store(true)
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "checked", IfLastSeq: first.LastSeq}); !errors.Is(err, agent.ErrStoreUnavailable) {
		t.Fatalf("a precondition with the store down: %v; want ErrStoreUnavailable", err)
	}
	if res, err := rt.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "unchecked"}); err != nil || res.Turn.Status != agent.StatusCompleted {
		t.Fatalf("a follow-up without one: %+v %v; want it to run", res, err)
	}
}
