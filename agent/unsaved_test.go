package agent_test

import (
	"context"
	"strings"
	"testing"

	"agentkit/agent"
	"agentkit/kv/memkv"
)

// TestACrashBeforeTheMirrorStateIsSavedLosesNothing: a turn's commit to
// the store is recorded on local disk as pending with its events, and what
// the store answered is kept in memory until the session's next write. A
// host that loses that memory (a crash) finds the pending commit at its
// next start, sees that it landed, and goes on: no fork, no batch written
// twice, every turn in the store once.
func TestACrashBeforeTheMirrorStateIsSavedLosesNothing(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	root := t.TempDir()
	cfg := agent.Config{Agent: agent.Agent{Name: "crash", Model: echoModel(t)}, StateRoot: root, Store: store, Logger: discard,
		Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}}
	rt, err := agent.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := start(t, rt, "one")
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	if n := agent.LoseUnsavedMirrorState(rt); n != 1 {
		t.Fatalf("%d mirror states in memory after the turns; want the session's", n)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	rt = open(t, cfg)
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "three"}); err != nil {
		t.Fatal(err)
	}
	if info := rt.Info(); info.MirrorForks != 0 || info.MirrorBacklog != 0 {
		t.Errorf("after the restart: %d forks, backlog %d", info.MirrorForks, info.MirrorBacklog)
	}
	var batches []string
	for k, err := range store.ListKeys(ctx, "agentkit/v1/crash/sessions/"+res.SessionID+"/events/") {
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, k)
	}
	if len(batches) != 3 {
		t.Errorf("the store holds %d batches: %q; want one per turn", len(batches), batches)
	}
	other := open(t, agent.Config{Agent: agent.Agent{Name: "crash", Model: echoModel(t)}, Store: store, Logger: discard})
	if _, err := other.GetSession(ctx, res.SessionID); err != nil {
		t.Fatal(err)
	}
	if got := userMessages(t, other, res.SessionID); strings.Join(got, "|") != "one|two|three" {
		t.Errorf("the store's session: %q", got)
	}
}
