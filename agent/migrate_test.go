package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentkit/agent"
	"agentkit/agent/stateroot"
	"agentkit/kv"
	"agentkit/kv/sqlitekv"
)

// TestAFormatOneRootMovesItsStoreIntoTheSessionDatabase: a state root of
// format 1 kept the default store in kv/kv.db. Opening it with the default
// store copies every key with its version into the session database,
// marks the root format 2 and removes kv/kv.db; sessions go on, versions
// are never issued twice, and agentkit kv finds the store in its new
// place.
func TestAFormatOneRootMovesItsStoreIntoTheSessionDatabase(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, stateroot.FormatFile), []byte(`{"format":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	oldPath := filepath.Join(root, "kv", "kv.db")
	if got := stateroot.DefaultStoreURL(root); got != "sqlite:"+oldPath {
		t.Fatalf("the default store of a format-1 root: %s", got)
	}
	// What a format-1 runtime left: its sessions mirrored to kv/kv.db.
	old, err := sqlitekv.Open(ctx, oldPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{Agent: agent.Agent{Name: "mig", Model: echoModel(t)}, StateRoot: root, Store: old, Logger: discard}
	rt, err := agent.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := start(t, rt, "before")
	if err := rt.HostKV().Put(ctx, "note", []byte(`"kept"`)); err != nil {
		t.Fatal(err)
	}
	// Versions issued and then deleted: the counter is ahead of every key.
	for range 5 {
		if err := old.Put(ctx, "scratch", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Delete(ctx, "scratch"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	before := map[string]kv.Version{}
	var maxVer kv.Version
	for k, err := range old.ListKeys(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		_, v, err := old.GetWithVersion(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		before[k] = v
	}
	probe := "probe"
	if err := old.Put(ctx, probe, []byte("p")); err != nil {
		t.Fatal(err)
	}
	_, maxVer, _ = old.GetWithVersion(ctx, probe)
	if err := old.Delete(ctx, probe); err != nil {
		t.Fatal(err)
	}
	old.Close()
	if len(before) < 5 {
		t.Fatalf("the old store holds %d keys; want a mirrored session and host KV", len(before))
	}

	cfg.Store = nil
	if rt, err = agent.Open(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	f, _ := os.ReadFile(filepath.Join(root, stateroot.FormatFile))
	if strings.TrimSpace(string(f)) != `{"format":2}` {
		t.Errorf("the format after the move: %q", f)
	}
	if _, err := os.Stat(oldPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kv/kv.db is still there: %v", err)
	}
	store := rt.Store()
	for k, v := range before {
		_, got, err := store.GetWithVersion(ctx, k)
		if err != nil || got != v {
			t.Errorf("%s after the move: version %q %v; want %q", k, got, err, v)
		}
	}
	if err := store.Put(ctx, "after", []byte("a")); err != nil {
		t.Fatal(err)
	}
	_, v, _ := store.GetWithVersion(ctx, "after")
	if len(v) < len(maxVer) || len(v) == len(maxVer) && v <= maxVer {
		t.Errorf("a write after the move got version %s; the old store had issued up to %s", v, maxVer)
	}
	if got, err := rt.HostKV().Get(ctx, "note"); err != nil || string(got) != `"kept"` {
		t.Errorf("host KV after the move: %q %v", got, err)
	}
	r2, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "after"})
	if err != nil || r2.SessionID != res.SessionID {
		t.Fatalf("the session after the move: %+v %v", r2, err)
	}
	// The kv command's URL now names the session database.
	if got := stateroot.DefaultStoreURL(root); got != "sqlite:"+filepath.Join(root, "sessions", "sessions.db") {
		t.Errorf("the default store's URL after the move: %s", got)
	}
	ro, err := kv.Open(ctx, stateroot.DefaultStoreURL(root))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if ks := keysWith(t, ro, "agentkit/v1/mig/"); !contains(ks, "/sessions/"+res.SessionID+"/head") || !contains(ks, "/kv/note") {
		t.Errorf("kv ls after the move: %q", ks)
	}
}
