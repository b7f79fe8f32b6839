package client_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/hosted"
	"agentkit/hosted/client"
	"agentkit/kv"
	"agentkit/kv/hostedkv"
	"agentkit/kv/memkv"
	"agentkit/memory"
)

// The tests over every backend of the service are in
// kv/hostedkv/tables_test.go, beside the driver's storaged fixture; these
// pin what this package adds on its own, on an in-process service over
// SQLite.

// openService starts a service with a page limit of 2 and returns a store
// of a fresh namespace of it.
func openService(t *testing.T, ns string) *kv.DB {
	t.Helper()
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	token, _, err := hosted.AddCredential(creds, hosted.KeyPath(creds), ns, false)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := hosted.Open(t.Context(), hosted.Options{Backend: "sqlite:" + filepath.Join(dir, "hosted.db"), Credentials: creds, MaxPage: 2})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc)
	t.Cleanup(func() { srv.Close(); svc.Close() })
	db, err := hostedkv.Open(t.Context(), srv.URL, ns, &hostedkv.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOtherDriversHaveNoHostedTables(t *testing.T) {
	if _, _, ok := client.Tables(memkv.New()); ok {
		t.Error("Tables answered ok for a memory store")
	}
	if _, ok := client.NewMemory(memkv.New()); ok {
		t.Error("NewMemory answered ok for a memory store")
	}
	if _, _, ok := client.Tables(nil); ok {
		t.Error("Tables answered ok for no store")
	}
}

// The cursor beside the local journal says how far the copy got: a host
// that restarts copies only what came since, the file is owner-only and
// replaced without leftovers, and a cursor of another namespace or agent
// is not trusted.
func TestMemoryCursor(t *testing.T) {
	ctx := context.Background()
	db := openService(t, "acme")
	root := t.TempDir()
	info := memory.Info{StateRoot: root, AgentName: "support"}
	appendTurns := func(m *client.Memory, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			rec := memory.Record{At: time.Unix(int64(1e9+i), 0).UTC(), SessionID: "s", ChannelID: "http",
				Status: memory.StatusCompleted, UserMessage: fmt.Sprintf("message %d", i), Result: "ok"}
			if err := m.AppendTurn(ctx, rec, info); err != nil {
				t.Fatal(err)
			}
		}
	}
	m, ok := client.NewMemory(db)
	if !ok {
		t.Fatal("NewMemory: not a hosted store")
	}
	appendTurns(m, 0, 5)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	cursor := filepath.Join(memory.Dir(root), ".hosted-cursor")
	b, err := os.ReadFile(cursor)
	if err != nil || string(b) != "acme support\t5\n" {
		t.Fatalf("the cursor holds %q (%v), want the namespace, the agent and the last record's number", b, err)
	}
	if st, _ := os.Stat(cursor); st.Mode().Perm() != 0o600 {
		t.Errorf("the cursor's mode is %v, want owner-only 0600", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(memory.Dir(root))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("a temporary file was left in the journal's folder: %s", e.Name())
		}
	}
	want := journal(t, root)
	if len(want) != 5 {
		t.Fatalf("the local journal has %d records, want 5", len(want))
	}
	// A restarted host (a new Memory on the same state root) copies
	// nothing twice.
	m2, _ := client.NewMemory(db)
	defer m2.Close()
	if err := m2.Sync(ctx, info); err != nil {
		t.Fatal(err)
	}
	if got := journal(t, root); !slices.Equal(got, want) {
		t.Fatalf("after a restart the journal has %d records, want the same 5", len(got))
	}
	// A cursor another namespace wrote is not trusted: a host whose
	// state root holds one copies the whole journal.
	rootB := t.TempDir()
	if err := os.MkdirAll(memory.Dir(rootB), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(memory.Dir(rootB), ".hosted-cursor"), []byte("other support\t5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m2.Sync(ctx, memory.Info{StateRoot: rootB, AgentName: "support"}); err != nil {
		t.Fatal(err)
	}
	if got := journal(t, rootB); !slices.Equal(got, want) {
		t.Fatalf("with another namespace's cursor the copy holds %d records, want all 5", len(got))
	}
}

// journal returns the lines of the local journal under root.
func journal(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(memory.JournalPath(root))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}
