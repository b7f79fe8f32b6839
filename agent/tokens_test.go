package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/ledger"
)

// TestNoTokenIsStoredInPlain: sessions are created, continued, replayed
// by their Idempotency-Keys and restored on a second host, in both
// serving modes and on the embedded default store; then no raw key or
// value of the store and no file of either state root holds any token a
// client was given, while the hosts run and after they close. The tokens
// all still continue their sessions.
func TestNoTokenIsStoredInPlain(t *testing.T) {
	for _, mode := range []string{"local", "embedded", "ledger"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			store := memkv.New()
			rootA, rootB := t.TempDir(), t.TempDir()
			host := func(root string) *agent.Runtime {
				cfg := agent.Config{Agent: agent.Agent{Name: "tok", Model: echoModel(t)}, StateRoot: root, Store: store}
				switch mode {
				case "embedded":
					cfg.Store = nil
				case "ledger":
					cfg.Serving = agent.ServingLedger
					cfg.Ledger.AllowProcessLocal = true
					cfg.Ledger.FollowInterval = 20 * time.Millisecond
				}
				return open(t, cfg)
			}
			a := host(rootA)
			var tokens []string
			give := func(res agent.TurnResult, err error) agent.TurnResult {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				if res.ContinuationToken != "" {
					tokens = append(tokens, res.ContinuationToken)
				}
				return res
			}
			first := give(a.StartSession(ctx, agent.StartRequest{Message: "one", IdempotencyKey: "start-1"}))
			give(a.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "two", IdempotencyKey: "cont-1"}))
			again := give(a.StartSession(ctx, agent.StartRequest{Message: "one", IdempotencyKey: "start-1"}))
			if again.SessionID != first.SessionID || !again.Replayed {
				t.Fatalf("the retried start %+v; want a replay of session %s", again, first.SessionID)
			}
			give(a.Continue(ctx, agent.ContinueRequest{Token: again.ContinuationToken, Message: "three"}))
			give(a.Continue(ctx, agent.ContinueRequest{Token: first.ContinuationToken, Message: "two", IdempotencyKey: "cont-1"}))
			plain := give(a.StartSession(ctx, agent.StartRequest{Message: "another"}))

			var b *agent.Runtime
			if mode != "embedded" {
				// A second host restores the sessions from the store and
				// continues them with the tokens clients hold.
				b = host(rootB)
				for _, tok := range []string{first.ContinuationToken, again.ContinuationToken, plain.ContinuationToken} {
					res := give(b.Continue(ctx, agent.ContinueRequest{Token: tok, Message: "on b"}))
					if res.Queued {
						waitTurns(t, b, res.SessionID, 1)
					}
				}
			}
			if mode == "ledger" {
				waitTurns(t, a, first.SessionID, 5)
			}
			noTokens(t, store, []string{rootA, rootB}, tokens)
			for _, rt := range []*agent.Runtime{a, b} {
				if rt != nil {
					rt.Close()
				}
			}
			noTokens(t, store, []string{rootA, rootB}, tokens)
		})
	}
}

// noTokens fails the test if a key or value of store, or a file under
// one of roots, holds one of tokens.
func noTokens(t *testing.T, store *kv.DB, roots, tokens []string) {
	t.Helper()
	ctx := context.Background()
	scanned := 0
	for e, err := range store.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		scanned++
		for _, tok := range tokens {
			if strings.Contains(e.Key, tok) || bytes.Contains(e.Value, []byte(tok)) {
				t.Errorf("the store's %s holds a continuation token", e.Key)
			}
		}
	}
	files := 0
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			for _, tok := range tokens {
				if bytes.Contains(b, []byte(tok)) || strings.Contains(path, tok) {
					rel, _ := filepath.Rel(root, path)
					t.Errorf("the state root's %s holds a continuation token", rel)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files == 0 || len(tokens) == 0 {
		t.Fatalf("scanned %d store records, %d files for %d tokens: nothing was scanned", scanned, files, len(tokens))
	}
}

// TestPlainTokensOfAnEarlierBuildAreRewritten: a store an earlier build
// wrote, with plain continuation tokens in its continuation records,
// session heads, metadata and index entries (serving mode local), or in
// the ledger's messages and committed turns (serving mode ledger), is
// rewritten by the next start: no record holds a token, every token still
// continues its session, and the migration's marker makes later starts
// read nothing more.
func TestPlainTokensOfAnEarlierBuildAreRewritten(t *testing.T) {
	for _, mode := range []string{"local", "ledger"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			store := memkv.New()
			cfg := func(root string) agent.Config {
				c := agent.Config{Agent: agent.Agent{Name: "old", Model: echoModel(t)}, StateRoot: root, Store: store}
				if mode == "ledger" {
					c.Serving = agent.ServingLedger
					c.Ledger.AllowProcessLocal = true
					c.Ledger.FollowInterval = 20 * time.Millisecond
				}
				return c
			}
			// Sessions of this build, then their records turned back into
			// an earlier build's: the token in plain, the marker gone.
			a, err := agent.Open(ctx, cfg(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			var tokens, ids []string
			for _, msg := range []string{"one", "two"} {
				res, err := a.StartSession(ctx, agent.StartRequest{Message: msg})
				if err != nil {
					t.Fatal(err)
				}
				tokens, ids = append(tokens, res.ContinuationToken), append(ids, res.SessionID)
			}
			if mode == "ledger" {
				for _, id := range ids {
					waitTurns(t, a, id, 1)
				}
			}
			a.Close()
			plainAgain(t, store, "old", ids, tokens, mode == "ledger")

			b := open(t, cfg(t.TempDir()))
			noTokens(t, store, []string{b.StateRoot()}, tokens)
			for i, tok := range tokens {
				res, err := b.Continue(ctx, agent.ContinueRequest{Token: tok, Message: "after the migration"})
				if err != nil || res.SessionID != ids[i] {
					t.Fatalf("continuing with a migrated token: %+v %v; want session %s", res, err, ids[i])
				}
			}
			if _, err := store.Get(ctx, "agentkit/v1/old/migrations/token-digests"); err != nil {
				t.Errorf("the migration's marker: %v", err)
			}
		})
	}
}

// plainAgain turns the records of sessions ids back into what an earlier
// build wrote: each token in plain (continuations/{token}, and in the
// heads, metadata and index entries, or in the ledger's first messages
// and turn headers), and no migration marker.
func plainAgain(t *testing.T, store *kv.DB, agentName string, ids, tokens []string, ledgerMode bool) {
	t.Helper()
	ctx := context.Background()
	p := "agentkit/v1/" + agentName + "/"
	if err := store.Delete(ctx, p+"migrations/token-digests"); err != nil {
		t.Fatal(err)
	}
	plain := map[string]string{} // digest → token
	for i, tok := range tokens {
		plain[keys.TokenDigest(tok)] = tok
		d := keys.TokenDigest(tok)
		v, err := store.Get(ctx, p+"continuations/"+d)
		if err != nil {
			t.Fatal(err)
		}
		store.Delete(ctx, p+"continuations/"+d)
		store.Put(ctx, p+"continuations/"+tok, v)
		_ = ids[i]
	}
	// A JSON object's tokenDigest becomes the earlier "continuationToken"
	// (session records) or "token" (the ledger's session metadata).
	toPlain := func(b []byte, field string) ([]byte, bool) {
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil {
			return nil, false
		}
		var d string
		if json.Unmarshal(m["tokenDigest"], &d) != nil || plain[d] == "" {
			return nil, false
		}
		delete(m, "tokenDigest")
		m[field], _ = json.Marshal(plain[d])
		m["v"] = json.RawMessage("1")
		out, _ := json.Marshal(m)
		return out, true
	}
	if !ledgerMode {
		for e, err := range store.List(ctx, p) {
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(e.Key, "/head") || strings.HasSuffix(e.Key, "/meta") || strings.Contains(e.Key, "/session-index/") {
				if b, ok := toPlain(e.Value, "continuationToken"); ok {
					store.Put(ctx, e.Key, b)
				}
			}
		}
		return
	}
	l, err := ledger.Open(ledger.Options{Store: store, Agent: agentName, Passive: true, AllowProcessLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	nested := func(b []byte, at string) ([]byte, bool) {
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil || m[at] == nil {
			return nil, false
		}
		s, ok := toPlain(m[at], "token")
		if !ok {
			return nil, false
		}
		var inner map[string]json.RawMessage
		json.Unmarshal(s, &inner)
		delete(inner, "v")
		m[at], _ = json.Marshal(inner)
		m["v"] = json.RawMessage("1")
		out, _ := json.Marshal(m)
		return out, true
	}
	st, err := l.Rewrite(ctx, ledger.Rewrite{
		Payload: func(_ string, b json.RawMessage) (json.RawMessage, bool) { return nested(b, "start") },
		Output:  func(_ string, b json.RawMessage) (json.RawMessage, bool) { return nested(b, "session") },
	})
	if err != nil || st.Turns+st.Controls == 0 {
		t.Fatalf("making the ledger's records an earlier build's: %+v %v", st, err)
	}
	var found bool
	for e, err := range store.List(ctx, p) {
		if err == nil && bytes.Contains(e.Value, []byte(tokens[0])) {
			found = true
		}
	}
	if !found {
		t.Fatal("the earlier build's records hold no token: the test would prove nothing")
	}
}

// TestAQueuedMessageCarriesNoToken: in serving mode ledger a session's
// first message waits in its inbox until its turn runs, and what waits
// there carries the token's digest, not the token.
func TestAQueuedMessageCarriesNoToken(t *testing.T) {
	store := memkv.New()
	g := newGate(t)
	g.blocking.Store(true)
	a := ledgerHost(t, store, g, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := a.StartSession(ctx, agent.StartRequest{Message: "held"})
	if err != nil || !res.Queued || res.ContinuationToken == "" {
		t.Fatalf("a start whose turn is held: %+v %v; want it queued, with its token", res, err)
	}
	<-g.entered // the turn runs: its message is in the inbox until it commits
	noTokens(t, store, []string{a.StateRoot()}, []string{res.ContinuationToken})
	g.open()
	waitTurns(t, a, res.SessionID, 1)
	noTokens(t, store, []string{a.StateRoot()}, []string{res.ContinuationToken})
}
