package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/tool"
)

// scripted is a model for the cache's tests: it records a deep copy of
// every request, and answers the first model call of a turn whose message
// starts with "tools" with two tool calls (one with arguments that are not
// JSON), then with a text holding bytes that are not UTF-8 and HTML
// characters, which the stored events change (the cache must not keep
// what the turn held before storing).
type scripted struct {
	requests [][]model.Message
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Generate(_ context.Context, req model.Request) (model.Response, error) {
	msgs := make([]model.Message, len(req.Messages))
	for i, m := range req.Messages {
		m.ToolCalls = append([]model.ToolCall(nil), m.ToolCalls...)
		msgs[i] = m
	}
	s.requests = append(s.requests, msgs)
	last := req.Messages[len(req.Messages)-1]
	if last.Role == model.RoleUser && strings.HasPrefix(last.Content, "tools") {
		return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "calling \xff", ToolCalls: []model.ToolCall{
			{Name: "mangle", Arguments: json.RawMessage(`{not json`)},
			{ID: "own", Name: "mangle", Arguments: json.RawMessage(` { "a" : "<b>&" } `)},
		}}}, nil
	}
	return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "answer to " + last.Content + " \xfe <b>&"}}, nil
}

// mangle answers with bytes that are not UTF-8 and its arguments.
var mangle = tool.Tool{Spec: model.ToolSpec{Name: "mangle"}, Run: func(_ context.Context, _ *tool.Env, args json.RawMessage) (string, error) {
	return "out \xff\xfe " + string(args), nil
}}

// cacheScenario runs one session through what can change a session's
// history under a cached conversation, and returns every request each
// host's model got: turns with tool calls and mangled texts; a restart;
// another host continuing the session (taken over at the next turn here);
// a turn during a store outage that then loses to another host's (a
// fork); a host that imports the session from the store; a delete. With
// cached false, every runtime rebuilds its conversations from the
// database for every turn.
func cacheScenario(t *testing.T, cached bool) (requests map[string][][]model.Message, cachedAtEnd int) {
	ctx := context.Background()
	shared := memkv.New()
	g := &gate{db: shared}
	models := map[string]*scripted{}
	openHost := func(name, root string, store any) *agent.Runtime {
		if models[name] == nil {
			models[name] = &scripted{}
		}
		rt, err := agent.Open(ctx, agent.Config{
			Agent:     agent.Agent{Name: "conv", Model: models[name], Tools: []tool.Tool{mangle}, NoWorkspaceTools: true, Instructions: "be brief"},
			StateRoot: root, Store: store, Logger: discard, Memory: agent.Memory{Off: true},
			Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !cached {
			agent.DisableConversationCache(rt)
		}
		return rt
	}
	turn := func(rt *agent.Runtime, token, msg string) {
		t.Helper()
		res, err := rt.Continue(ctx, agent.ContinueRequest{Token: token, Message: msg})
		if err != nil || res.Turn.Status != agent.StatusCompleted {
			t.Fatalf("turn %q: %+v %v", msg, res, err)
		}
	}
	rootA, rootB, rootC := t.TempDir(), t.TempDir(), t.TempDir()
	a := openHost("a", rootA, g.funcs())
	res, err := a.StartSession(ctx, agent.StartRequest{Message: "tools one"})
	if err != nil {
		t.Fatal(err)
	}
	tok := res.ContinuationToken
	turn(a, tok, "two")
	turn(a, tok, "tools three")
	// A restart: the next turn starts without a cached conversation.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a = openHost("a", rootA, g.funcs())
	turn(a, tok, "four")
	turn(a, tok, "five")
	// B takes a turn; A's next turn takes it from the store.
	b := openHost("b", rootB, shared)
	turn(b, tok, "tools six on B")
	turn(a, tok, "seven")
	// A turn of A while the store is down loses to one of B's: A's next
	// turn forks it away and goes on from the store's history.
	g.down.Store(true)
	turn(a, tok, "eight on A, lost")
	g.down.Store(false)
	turn(b, tok, "eight on B")
	turn(a, tok, "nine")
	turn(a, tok, "tools ten")
	// C imports the session from the store through the token.
	c := openHost("c", rootC, shared)
	turn(c, tok, "eleven on C")
	turn(c, tok, "twelve on C")
	// A second session, deleted on A while A caches its conversation.
	other, err := a.StartSession(ctx, agent.StartRequest{Message: "other"})
	if err != nil {
		t.Fatal(err)
	}
	before := agent.CachedConversations(a)
	if err := a.DeleteSession(ctx, other.SessionID); err != nil {
		t.Fatal(err)
	}
	if after := agent.CachedConversations(a); cached && after != before-1 {
		t.Errorf("cached conversations %d before the delete, %d after; want one less", before, after)
	}
	turn(a, tok, "thirteen")
	cachedAtEnd = agent.CachedConversations(a)
	for _, rt := range []*agent.Runtime{a, b, c} {
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
	}
	requests = map[string][][]model.Message{}
	for name, m := range models {
		requests[name] = m.requests
	}
	return requests, cachedAtEnd
}

// TestTheCacheNeverChangesWhatTheModelSees runs the same scenario with
// the conversation cache and without it: every request of every host is
// the same, byte for byte.
func TestTheCacheNeverChangesWhatTheModelSees(t *testing.T) {
	with, n := cacheScenario(t, true)
	without, _ := cacheScenario(t, false)
	if n == 0 {
		t.Fatal("the cached run cached no conversation; the comparison would prove nothing")
	}
	for _, host := range []string{"a", "b", "c"} {
		w, wo := with[host], without[host]
		if len(w) != len(wo) {
			t.Errorf("host %s: %d model calls with the cache, %d without", host, len(w), len(wo))
			continue
		}
		for i := range w {
			if !reflect.DeepEqual(w[i], wo[i]) {
				t.Errorf("host %s, model call %d differs with the cache:\n with    %s\n without %s", host, i+1, show(w[i]), show(wo[i]))
			}
		}
	}
	// The scenario's last request holds the whole history as the store
	// has it: B's and C's turns, and A's lost turn where its fork was
	// recorded (after the turn of B it lost to), as a message and its
	// answer.
	last := with["a"][len(with["a"])-1]
	var users []string
	for _, m := range last {
		if m.Role == model.RoleUser {
			users = append(users, m.Content)
		}
	}
	want := "tools one|two|tools three|four|five|tools six on B|seven|eight on B|eight on A, lost|nine|tools ten|eleven on C|twelve on C|thirteen"
	if got := strings.Join(users, "|"); got != want {
		t.Errorf("A's last request has the user messages\n %s\nwant\n %s", got, want)
	}
	if last[0].Role != model.RoleSystem || last[0].Content != "be brief" {
		t.Errorf("the request starts with %+v; want the instructions as the system prompt", last[0])
	}
}

func show(msgs []model.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "[%s %q", m.Role, m.Content)
		for _, c := range m.ToolCalls {
			fmt.Fprintf(&b, " call %s %s %s", c.ID, c.Name, c.Arguments)
		}
		if m.ToolCallID != "" {
			fmt.Fprintf(&b, " for %s", m.ToolCallID)
		}
		b.WriteString("] ")
	}
	return b.String()
}
