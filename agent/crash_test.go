package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/model"
)

// childRoleEnv selects a child role of the test binary (TestMain).
const childRoleEnv = "AGENTKIT_AGENT_CHILD_ROLE"

func TestMain(m *testing.M) {
	testenv.RunChildRole(m, childRoleEnv, map[string]func() error{"mid-turn": midTurnChild})
}

// midTurnChild starts a session (its first turn answers at once), then
// runs a follow-up that calls a tool and then waits an hour for the
// model, printing "ready SESSION TOKEN" once the tool's result is
// recorded: the parent kills it there. (The token comes from the first
// turn's answer, as a client's does: only its digest is stored.)
func midTurnChild() error {
	ctx := context.Background()
	store, err := kv.Open(ctx, os.Getenv("STORE"))
	if err != nil {
		return err
	}
	// The echo model's script is per turn: the first turn runs on a
	// runtime that answers, the follow-up on one that calls a tool and
	// then thinks for an hour.
	open := func(steps ...model.EchoStep) (*agent.Runtime, error) {
		m, err := model.NewEcho(&model.EchoConfig{Script: steps})
		if err != nil {
			return nil, err
		}
		return agent.Open(ctx, agent.Config{
			Agent: agent.Agent{Name: "crash", Model: m}, StateRoot: os.Getenv("STATE_ROOT"), Store: store,
			Memory: agent.Memory{Off: true},
		})
	}
	rt, err := open(model.EchoStep{Text: "hello"})
	if err != nil {
		return err
	}
	first, err := rt.StartSession(ctx, agent.StartRequest{Message: "start"})
	if err != nil {
		return err
	}
	if err := rt.Close(); err != nil {
		return err
	}
	if rt, err = open(model.EchoStep{Tool: "list_files"}, model.EchoStep{Text: "never", Delay: "1h"}); err != nil {
		return err
	}
	_, err = rt.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "go", OnEvent: func(e agent.Event) {
		if e.Type == agent.EventToolResult {
			fmt.Printf("ready %s %s\n", e.SessionID, first.ContinuationToken)
			os.Stdout.Sync()
		}
	}})
	return err
}

// TestSIGKILLMidTurn kills a host in the middle of a turn (after a tool
// result, while the model thinks): the turn is not replayed, the events
// it recorded reach the store at the next start, and the next follow-up
// continues from them.
func TestSIGKILLMidTurn(t *testing.T) {
	root := t.TempDir()
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "store.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"=mid-turn", "STATE_ROOT="+root, "STORE="+storeURL)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready ") {
				lines <- strings.TrimPrefix(sc.Text(), "ready ")
			}
		}
		close(lines)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the child did not reach the tool result; stderr:\n%s", stderr.String())
	}
	id, tok, _ := strings.Cut(line, " ")
	if id == "" || tok == "" {
		cmd.Wait()
		t.Fatalf("the child exited early; stderr:\n%s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	ctx := context.Background()
	store, err := kv.Open(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	prefix := "agentkit/v1/crash/sessions/" + id + "/events/"
	if got := storedSeqs(t, store, keysWith(t, store, prefix)); fmt.Sprint(got) != "[[1 2 3]]" {
		t.Fatalf("the store has %v before the restart; want only the first turn's [[1 2 3]] (more: the kill came after a flush)", got)
	}

	rec := &recorder{}
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "crash", Model: rec}, StateRoot: root, Store: store, Memory: agent.Memory{Off: true}})
	// At the start, before any turn: the recorded events are in the store.
	if got := storedSeqs(t, store, keysWith(t, store, prefix)); fmt.Sprint(got) != "[[1 2 3] [4 5 6 7]]" {
		t.Errorf("stored after the restart: %v; want the first turn and the 4 events recorded before the kill", got)
	}
	if n := len(rec.requests()); n != 0 {
		t.Errorf("the interrupted turn was replayed: %d model calls at start", n)
	}
	last, err := rt.LastEvents(ctx, id, 10)
	if err != nil || len(last) != 7 || last[6].Type != agent.EventToolResult {
		t.Fatalf("the session after the restart: %+v %v", last, err)
	}
	// The next follow-up continues from the recorded events.
	s, err := rt.GetSession(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	page, err := rt.ListSessions(ctx, 10, "")
	if err != nil || len(page.Sessions) != 1 {
		t.Fatalf("sessions %+v %v", page, err)
	}
	res, err := rt.Continue(ctx, agent.ContinueRequest{Token: tok, Message: "next"})
	if err != nil || res.SessionID != id {
		t.Fatalf("the follow-up: %+v %v", res, err)
	}
	var hist []string
	for _, m := range rec.requests()[0].Messages {
		if m.Role != model.RoleSystem {
			hist = append(hist, string(m.Role)+":"+m.Content)
		}
	}
	if len(hist) != 6 || hist[0] != "user:start" || hist[2] != "user:go" || !strings.HasPrefix(hist[4], "tool:") || hist[5] != "user:next" {
		t.Errorf("the follow-up's history %q; want the interrupted turn's message, tool call and result, then the new message", hist)
	}
	after, _ := rt.GetSession(ctx, id)
	if after.Turns != s.Turns+1 || after.LastSeq != 10 {
		t.Errorf("after the follow-up: %+v (before %+v)", after, s)
	}
}
