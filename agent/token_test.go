package agent_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/model"
)

func TestTokensAreRandomAndURLSafe(t *testing.T) {
	rt := open(t, agent.Config{})
	seen := map[string]bool{}
	for range 20 {
		tok := start(t, rt, "x").ContinuationToken
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) < 16 || len(tok) != 43 {
			t.Fatalf("token %q: %d bytes, %v", tok, len(b), err)
		}
		if seen[tok] {
			t.Fatalf("token %q issued twice", tok)
		}
		seen[tok] = true
	}
}

func TestTokenStaysValidForTheSession(t *testing.T) {
	rt := open(t, agent.Config{})
	res := start(t, rt, "one")
	for i := range 3 {
		r, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "more"})
		if err != nil || r.ContinuationToken != res.ContinuationToken || r.SessionID != res.SessionID {
			t.Fatalf("follow-up %d: %+v %v", i, r, err)
		}
	}
}

func TestUnknownTokenIsAnErrorNeverANewSession(t *testing.T) {
	c := newCounting(memkv.New())
	rt := open(t, agent.Config{Store: c.funcs()})
	ctx := context.Background()
	for _, tok := range []string{"nope", strings.Repeat("a", 43), strings.Repeat("x", 5000)} {
		_, err := rt.Continue(ctx, agent.ContinueRequest{Token: tok, Message: "hi"})
		if !errors.Is(err, agent.ErrUnknownToken) {
			t.Errorf("Continue(%.10q…) = %v, want ErrUnknownToken", tok, err)
		}
	}
	page, _ := rt.ListSessions(ctx, 10, "")
	if len(page.Sessions) != 0 {
		t.Errorf("an unknown token created %d sessions", len(page.Sessions))
	}
}

// TestTokenResolvedThroughTheStore continues a session on a second host
// that shares only the store.
func TestTokenResolvedThroughTheStore(t *testing.T) {
	store := memkv.New()
	a := open(t, agent.Config{Agent: agent.Agent{Name: "shared"}, Store: store})
	res := start(t, a, "remember 42")
	rec := &recorder{}
	c := newCounting(store)
	b := open(t, agent.Config{Agent: agent.Agent{Name: "shared", Model: rec}, Store: c.funcs(), Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}})
	ctx := context.Background()
	if _, err := b.GetSession(ctx, "missing"); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("GetSession(missing) = %v", err)
	}
	r, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "what number?"})
	if err != nil {
		t.Fatal(err)
	}
	if r.SessionID != res.SessionID || r.ContinuationToken != res.ContinuationToken {
		t.Errorf("resumed %+v", r)
	}
	// The second host's model saw the first host's turn.
	msgs := rec.requests()[0].Messages
	var hist []string
	for _, m := range msgs {
		if m.Role != model.RoleSystem {
			hist = append(hist, m.Content)
		}
	}
	if strings.Join(hist, "|") != "remember 42|echo: remember 42|what number?" {
		t.Errorf("history on the second host %q", hist)
	}
	s, err := b.GetSession(ctx, res.SessionID)
	if err != nil || s.Turns != 2 || s.LastSeq != 6 {
		t.Errorf("session on the second host %+v %v", s, err)
	}
	// Now it is local: a second follow-up does not look the token up or
	// load the session again; it only reads the session head.
	c.reset()
	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.gotKeys() {
		if strings.Contains(k, "/continuations/") || strings.HasSuffix(k, "/meta") || strings.HasSuffix(k, "/events/00000000000000000001") {
			t.Errorf("a local token read %s", k)
		}
	}
}

func TestStoreFailureWhileResolvingIsUnavailable(t *testing.T) {
	store := memkv.New()
	a := open(t, agent.Config{Agent: agent.Agent{Name: "shared"}, Store: store})
	res := start(t, a, "x")
	c := newCounting(store)
	c.failGet.Store(true)
	b := open(t, agent.Config{Agent: agent.Agent{Name: "shared"}, Store: c.funcs(), Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}})
	_, err := b.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "y"})
	if !errors.Is(err, agent.ErrStoreUnavailable) || errors.Is(err, agent.ErrUnknownToken) {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(err.Error(), res.ContinuationToken) || !strings.Contains(err.Error(), "REDACTED") {
		t.Errorf("error %q shows the token", err)
	}
	page, _ := b.ListSessions(context.Background(), 10, "")
	if len(page.Sessions) != 0 {
		t.Error("a store outage opened a session")
	}
	// Once the store is back, the same token works.
	c.failGet.Store(false)
	if _, err := b.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "y"}); err != nil {
		t.Errorf("after the outage: %v", err)
	}
}

func TestDeleteSession(t *testing.T) {
	store := memkv.New()
	ctx := context.Background()
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "del"}, Store: store})
	res := start(t, rt, "x")
	keep := start(t, rt, "keep")
	if _, err := rt.CreateReminder(ctx, agent.ReminderRequest{SessionID: res.SessionID, Delay: 3600e9, Message: "later"}); err != nil {
		t.Fatal(err)
	}
	if err := rt.DeleteSession(ctx, res.SessionID); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.GetSession(ctx, res.SessionID); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("GetSession after delete: %v", err)
	}
	if _, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "y"}); !errors.Is(err, agent.ErrUnknownToken) {
		t.Errorf("token after delete: %v", err)
	}
	// Only the tombstone stays, so no host brings the session back.
	for _, k := range keysWith(t, store, "agentkit/v1/del/") {
		if strings.Contains(k, res.ContinuationToken) || strings.Contains(k, res.SessionID) && !strings.HasSuffix(k, "/head") {
			t.Errorf("left in the store: %s", k)
		}
	}
	head, err := store.Get(ctx, "agentkit/v1/del/sessions/"+res.SessionID+"/head")
	if err != nil || !strings.Contains(string(head), `"deleted":true`) || strings.Contains(string(head), res.ContinuationToken) {
		t.Errorf("tombstone %s %v", head, err)
	}
	if rems, _ := rt.ListReminders(ctx, res.SessionID); len(rems) != 0 {
		t.Errorf("reminders left: %+v", rems)
	}
	if err := rt.DeleteSession(ctx, res.SessionID); !errors.Is(err, agent.ErrSessionNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if _, err := rt.GetSession(ctx, keep.SessionID); err != nil {
		t.Errorf("the other session: %v", err)
	}
}
