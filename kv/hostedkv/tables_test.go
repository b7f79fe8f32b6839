package hostedkv_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"agentkit/hosted/client"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/memory"
	"agentkit/model"
	"agentkit/storage"
)

// The tests of package hosted/client (the native tables and the memory
// backend bound to the runtime) live here, beside the fixture that runs a
// real storaged; a test file may import upwards, the driver itself never.

// backendCase is a storaged backend and a way to count rows in its tables.
type backendCase struct {
	name    string
	backend func(t *testing.T) string
	// count returns the rows of one of the service's tables (suffix such
	// as "ab_samples") in namespace ns.
	count func(t *testing.T, backend, suffix, ns string) int
}

func backendCases() []backendCase {
	return []backendCase{
		{"postgres", func(t *testing.T) string { return pgBackend(t, true) }, func(t *testing.T, backend, suffix, ns string) int {
			u, _ := url.Parse(backend)
			q := u.Query()
			prefix := q.Get("table")
			q.Del("table")
			u.RawQuery = q.Encode()
			conn, err := pgx.Connect(t.Context(), u.String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			var n int
			if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM "+prefix+"_"+suffix+" WHERE ns = $1", ns).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}},
		{"sqlite", func(t *testing.T) string {
			return "sqlite:" + filepath.Join(t.TempDir(), "hosted.db") + "?synchronous=normal"
		}, func(t *testing.T, backend, suffix, ns string) int {
			path, _, _ := strings.Cut(strings.TrimPrefix(backend, "sqlite:"), "?")
			db, err := sql.Open("sqlite", "file:"+path+"?_query_only=1")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.QueryRow("SELECT count(*) FROM agentkit_hosted_"+suffix+" WHERE ns = ?", ns).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}},
		{"redis", func(t *testing.T) string { return redisBackend(t) }, func(t *testing.T, backend, suffix, ns string) int {
			// The generic backend's layout (hosted/kvstore.go): eval runs
			// under hosted/ev/{ns}/, samples under hosted/as/{ns}/.
			prefix := map[string]string{"eval_runs": "hosted/ev/", "ab_samples": "hosted/as/"}[suffix] + ns + "/"
			db, err := kv.Open(t.Context(), backend)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			n := 0
			for _, err := range db.ListKeys(t.Context(), prefix) {
				if err != nil {
					t.Fatal(err)
				}
				n++
			}
			return n
		}},
	}
}

func TestNativeTables(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			backend := bc.backend(t)
			svc := startService(t, backend, "--max-page", "7")
			ns, token := svc.namespace(t)
			db := svc.open(t, ns, token, nil)
			defer db.Close()
			ctx := t.Context()

			evals, abs, ok := client.Tables(db)
			if !ok {
				t.Fatal("Tables: not a hosted store")
			}
			if _, _, ok := client.Tables(memkv.New()); ok {
				t.Fatal("Tables answered ok for a memory store")
			}
			// The runtime's view: storage.Define with the native tables.
			b, err := storage.Define(storage.Config{Backend: db, Evals: evals, ABs: abs})
			if err != nil {
				t.Fatal(err)
			}
			rep := b.Report()
			if rep.Evals != storage.ModeNative || rep.ABs != storage.ModeNative || rep.ABSnapshot != storage.ModeNative {
				t.Fatalf("storage report %+v, want native eval, A/B and snapshot tables", rep)
			}
			as, err := b.Agent("support")
			if err != nil {
				t.Fatal(err)
			}
			// Eval runs: more than a page (the service's page limit is 7),
			// upserts, deletes, and a run of another agent kept apart.
			var want []string
			for i := range 20 {
				id := fmt.Sprintf("run-%02d", i)
				want = append(want, id)
				if err := as.Evals().Put(ctx, id, json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))); err != nil {
					t.Fatal(err)
				}
			}
			if err := as.Evals().Put(ctx, "run-03", json.RawMessage(`{"i":"again"}`)); err != nil {
				t.Fatal(err)
			}
			if err := as.Evals().Delete(ctx, "run-05"); err != nil {
				t.Fatal(err)
			}
			want = slices.DeleteFunc(want, func(s string) bool { return s == "run-05" })
			other, _ := b.Agent("other")
			if err := other.Evals().Put(ctx, "run-x", json.RawMessage(`{}`)); err != nil {
				t.Fatal(err)
			}
			var got []string
			for r, err := range as.Evals().List(ctx) {
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, r.ID)
				if r.ID == "run-03" && string(r.Snapshot) != `{"i":"again"}` {
					t.Errorf("run-03 holds %s after the upsert", r.Snapshot)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("eval runs listed %v, want %v", got, want)
			}
			if n := bc.count(t, backend, "eval_runs", ns); n != 20 {
				t.Fatalf("the eval_runs table holds %d rows, want 20", n)
			}
			// A/B: samples are rows of their own; a resent sample is one row.
			at := time.Date(2026, 10, 1, 16, 42, 9, 118e6, time.UTC)
			s := storage.ABSample{Experiment: "exp", Variant: "b", SessionID: "s1", At: at, Metrics: json.RawMessage(`{"turns":1}`)}
			as.ABs().PutSample(ctx, s)
			as.ABs().PutSample(ctx, s)
			s.At = at.Add(time.Second)
			as.ABs().PutSample(ctx, s)
			if d := b.DroppedMirrorWrites(); d != 0 {
				t.Fatalf("%d A/B samples were dropped", d)
			}
			if n := bc.count(t, backend, "ab_samples", ns); n != 2 {
				t.Fatalf("the ab_samples table holds %d rows, want 2", n)
			}
			if _, err := as.ABs().GetSnapshot(ctx); !errors.Is(err, kv.ErrNotFound) {
				t.Fatalf("GetSnapshot before any: %v, want kv.ErrNotFound", err)
			}
			for _, doc := range []string{`{"v":1}`, `{"v":2}`} {
				if err := as.ABs().PutSnapshot(ctx, json.RawMessage(doc)); err != nil {
					t.Fatal(err)
				}
			}
			if doc, err := as.ABs().GetSnapshot(ctx); err != nil || string(doc) != `{"v":2}` {
				t.Fatalf("GetSnapshot = %s, %v; want the last one", doc, err)
			}
			// The tables are the namespace's: another namespace sees none.
			ns2, token2 := svc.namespace(t)
			db2 := svc.open(t, ns2, token2, nil)
			defer db2.Close()
			e2, _, _ := client.Tables(db2)
			for r, err := range e2.ListRuns(ctx, "support") {
				t.Fatalf("another namespace lists run %+v (%v)", r, err)
			}
		})
	}
}

func TestMemoryKeptAcrossHosts(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		testMemoryKeptAcrossHosts(t, "sqlite:"+filepath.Join(t.TempDir(), "hosted.db")+"?synchronous=normal")
	})
	t.Run("redis", func(t *testing.T) { testMemoryKeptAcrossHosts(t, redisBackend(t)) })
}

func testMemoryKeptAcrossHosts(t *testing.T, backend string) {
	svc := startService(t, backend, "--max-page", "3")
	ns, token := svc.namespace(t)
	ctx := t.Context()
	// Host A runs turns with the hosted memory backend.
	rootA := t.TempDir()
	dbA := svc.open(t, ns, token, nil)
	defer dbA.Close()
	memA, ok := client.NewMemory(dbA)
	if !ok {
		t.Fatal("NewMemory: not a hosted store")
	}
	defer memA.Close()
	hookA, err := memory.NewHook(memory.Info{StateRoot: rootA, AgentName: "support"}, &memory.Options{Backend: memA})
	if err != nil {
		t.Fatal(err)
	}
	turn := func(h *memory.Hook, i int, host string) {
		h.AfterTurn(ctx, memory.TurnInfo{SessionID: host, ChannelID: "http", UserMessage: fmt.Sprintf("message %d", i),
			Result: fmt.Sprintf("answer %d", i), Usage: model.Usage{InputTokens: int64(i)}, FinishedAt: time.Unix(int64(1e9+i), 0)})
	}
	for i := range 5 {
		turn(hookA, i, "a")
	}
	if st := hookA.Stats(); st.Appended != 5 || st.Failed != 0 {
		t.Fatalf("host A's hook: %+v", st)
	}
	journalA := readJournal(t, rootA)
	if len(journalA) != 5 {
		t.Fatalf("host A's local journal has %d lines, want 5:\n%s", len(journalA), strings.Join(journalA, "\n"))
	}
	// Host B is a fresh host (a redeploy): an empty state root. Its first
	// session brings the journal over, in order, before any turn of its own.
	rootB := t.TempDir()
	dbB := svc.open(t, ns, token, nil)
	defer dbB.Close()
	memB, _ := client.NewMemory(dbB)
	defer memB.Close()
	hookB, _ := memory.NewHook(memory.Info{StateRoot: rootB, AgentName: "support"}, &memory.Options{Backend: memB})
	hookB.PrepareSession(ctx, "b-session")
	if st := hookB.Stats(); st.PrepareFailed != 0 {
		t.Fatalf("host B's PrepareSession failed: %+v", st)
	}
	if got := readJournal(t, rootB); !slices.Equal(got, journalA) {
		t.Fatalf("host B's journal after its first session:\n%s\nwant host A's:\n%s", strings.Join(got, "\n"), strings.Join(journalA, "\n"))
	}
	// Both hosts go on; each sees the other's records at its next turn,
	// and nothing twice.
	turn(hookB, 5, "b")
	turn(hookA, 6, "a")
	hookB.PrepareSession(ctx, "b-2")
	a, b := readJournal(t, rootA), readJournal(t, rootB)
	if len(a) != 7 || !slices.Equal(a, b) {
		t.Fatalf("after turns on both hosts:\nA:\n%s\nB:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	// Another agent's journal is its own.
	rootC := t.TempDir()
	hookC, _ := memory.NewHook(memory.Info{StateRoot: rootC, AgentName: "billing"}, &memory.Options{Backend: memB})
	hookC.PrepareSession(ctx, "c")
	if got := readJournal(t, rootC); len(got) != 0 {
		t.Fatalf("agent billing's journal has %d records of agent support", len(got))
	}
}

// readJournal returns the lines of the live journal under a state root.
func readJournal(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(memory.JournalPath(root))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}
