package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"agentkit/internal/testenv/natstest"
	"agentkit/kv"
	"agentkit/kv/memkv"
	_ "agentkit/kv/natskv" // nats:// URLs
	"agentkit/storage"
)

// bigRun is an eval run snapshot of n cases with answers of size bytes,
// the answer of case i carrying mark[i] when given.
func bigRun(n, size int, mark map[int]string) json.RawMessage {
	cases := make([]map[string]any, n)
	for i := range cases {
		cases[i] = map[string]any{"name": fmt.Sprintf("case-%05d", i), "input": "q", "status": "passed",
			"answer": mark[i] + strings.Repeat("a", size)}
	}
	doc, _ := json.Marshal(map[string]any{"v": 1, "runId": "r1", "status": "running", "counts": map[string]int{"total": n}, "cases": cases})
	return doc
}

// sameJSON reports whether two documents hold the same value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	return reflect.DeepEqual(x, y)
}

func keysUnder(t *testing.T, db *kv.DB, prefix string) []string {
	t.Helper()
	var out []string
	for k, err := range db.ListKeys(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

func listRun(t *testing.T, a *storage.AgentStore, id string) json.RawMessage {
	t.Helper()
	var got json.RawMessage
	for r, err := range a.Evals().List(context.Background()) {
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if r.ID == id {
			got = r.Snapshot
		}
	}
	return got
}

const pagesPrefix = "agentkit/v1/support/eval-cases/r1/"

// TestALargeEvalRunKeepsItsCasesInPages: a run over 256 KiB keeps its
// record at eval-runs/{runId} (without the cases, naming its pages) and
// its cases in pages; it reads back whole; a progress write rewrites only
// the page whose case changed; deleting the run deletes its pages. A
// small run stays one record of format 1.
func TestALargeEvalRunKeepsItsCasesInPages(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	a := agent(t, define(t, storage.Config{Backend: db}), "support")

	small := bigRun(3, 10, nil)
	if err := a.Evals().Put(ctx, "small", small); err != nil {
		t.Fatal(err)
	}
	if raw, _ := db.Get(ctx, "agentkit/v1/support/eval-runs/small"); !strings.HasPrefix(string(raw), `{"v":1,`) {
		t.Errorf("a small run is stored as %.60s…; want one record of format 1", raw)
	}

	doc := bigRun(1000, 600, nil) // about 680 KB
	if err := a.Evals().Put(ctx, "r1", doc); err != nil {
		t.Fatal(err)
	}
	head, err := db.Get(ctx, "agentkit/v1/support/eval-runs/r1")
	if err != nil {
		t.Fatal(err)
	}
	pages := keysUnder(t, db, pagesPrefix)
	if len(head) > 64<<10 || !strings.HasPrefix(string(head), `{"v":2,`) || strings.Contains(string(head), "case-00001") {
		t.Errorf("the run record is %d bytes, %.40s…: want a small format 2 record without the cases", len(head), head)
	}
	if len(pages) < 5 {
		t.Errorf("%d case pages for 1,000 cases of 600 bytes", len(pages))
	}
	for _, pk := range pages {
		if v, _ := db.Get(ctx, pk); len(v) > 256<<10 {
			t.Errorf("the page %s is %d bytes", pk, len(v))
		}
	}
	if got := listRun(t, a, "r1"); !sameJSON(t, got, doc) {
		t.Fatalf("the paged run reads back as %d bytes that differ from the %d written", len(got), len(doc))
	}

	// One case changes: one page is replaced, the others stay.
	doc2 := bigRun(1000, 600, map[int]string{700: "changed "})
	if err := a.Evals().Put(ctx, "r1", doc2); err != nil {
		t.Fatal(err)
	}
	after := keysUnder(t, db, pagesPrefix)
	gone, added := diff(pages, after), diff(after, pages)
	if len(gone) != 1 || len(added) != 1 {
		t.Errorf("changing one case replaced pages %q with %q; want one page replaced", gone, added)
	}
	if got := listRun(t, a, "r1"); !sameJSON(t, got, doc2) {
		t.Fatal("the run does not read back as the second write")
	}

	// Update sees the whole stored run, cases included.
	err = a.Evals().Update(ctx, "r1", func(old json.RawMessage) (json.RawMessage, error) {
		if !sameJSON(t, old, doc2) {
			t.Error("Update was given a snapshot without the cases of the stored run")
		}
		var m map[string]any
		json.Unmarshal(old, &m)
		m["status"] = "interrupted"
		return json.Marshal(m)
	})
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Status string            `json:"status"`
		Cases  []json.RawMessage `json:"cases"`
	}
	if err := json.Unmarshal(listRun(t, a, "r1"), &m); err != nil || m.Status != "interrupted" || len(m.Cases) != 1000 {
		t.Errorf("after Update: status %q, %d cases, %v", m.Status, len(m.Cases), err)
	}

	if err := a.Evals().Delete(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if left := keysUnder(t, db, pagesPrefix); len(left) != 0 {
		t.Errorf("deleting the run left %d case pages", len(left))
	}
	if got := listRun(t, a, "r1"); got != nil {
		t.Error("the deleted run is still listed")
	}
}

// diff returns what a has and b lacks.
func diff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// TestAReaderOfAPagedRunThatMovesOnReadsItAgain: a write that replaces a
// run while a reader is between the record and its pages deletes a page
// the reader still wants; the reader reads the record again and returns
// the new run whole, never a mix of the two.
func TestAReaderOfAPagedRunThatMovesOnReadsItAgain(t *testing.T) {
	ctx := context.Background()
	store := memkv.NewStore()
	var once sync.Once
	var writer func()
	f := kv.Funcs{
		Put: store.Put, Delete: store.Delete, List: store.List,
		CAS: kv.CASFuncs{GetWithVersion: store.GetWithVersion, PutIfAbsent: store.PutIfAbsent, PutIfVersion: store.PutIfVersion, ListKeys: store.ListKeys},
		Get: func(ctx context.Context, key string) ([]byte, error) {
			if strings.HasPrefix(key, pagesPrefix) && writer != nil {
				once.Do(writer) // the first page read: another host replaces the run
			}
			return store.Get(ctx, key)
		},
	}
	db, err := kv.New("hooked", f)
	if err != nil {
		t.Fatal(err)
	}
	a := agent(t, define(t, storage.Config{Backend: db}), "support")
	first, second := bigRun(1000, 600, nil), bigRun(1000, 600, map[int]string{0: "new ", 999: "new "})
	if err := a.Evals().Put(ctx, "r1", first); err != nil {
		t.Fatal(err)
	}
	writer = func() {
		if err := a.Evals().Put(ctx, "r1", second); err != nil {
			t.Errorf("the concurrent write: %v", err)
		}
	}
	got := listRun(t, a, "r1")
	if !sameJSON(t, got, second) {
		t.Errorf("a reader overtaken by a write read %d bytes that are not the new run", len(got))
	}
}

// TestRacingWritersOfAPagedRunLeaveNoPageBehind: hosts writing one run at
// once lose compare-and-sets to each other; every page the stored record
// names exists, and no page it does not name is left.
func TestRacingWritersOfAPagedRunLeaveNoPageBehind(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	hosts := []*storage.AgentStore{
		agent(t, define(t, storage.Config{Backend: db}), "support"),
		agent(t, define(t, storage.Config{Backend: db}), "support"),
		agent(t, define(t, storage.Config{Backend: db}), "support"),
	}
	var wg sync.WaitGroup
	for h, a := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 6 {
				doc := bigRun(450, 600, map[int]string{(h*6 + i) * 7 % 450: fmt.Sprintf("h%d-%d ", h, i)})
				if err := a.Evals().Put(ctx, "r1", doc); err != nil {
					t.Errorf("host %d write %d: %v", h, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var rec struct {
		Pages []struct {
			ID string `json:"id"`
		} `json:"casePages"`
	}
	raw, err := db.Get(ctx, "agentkit/v1/support/eval-runs/r1")
	if err != nil || json.Unmarshal(raw, &rec) != nil || len(rec.Pages) == 0 {
		t.Fatalf("the run record: %v, %d pages", err, len(rec.Pages))
	}
	var named []string
	for _, p := range rec.Pages {
		if !slices.Contains(named, pagesPrefix+p.ID) {
			named = append(named, pagesPrefix+p.ID)
		}
	}
	stored := keysUnder(t, db, pagesPrefix)
	slices.Sort(named)
	if !slices.Equal(stored, named) {
		t.Errorf("the record names %d pages; the store holds %d: missing %q, left behind %q", len(named), len(stored), diff(named, stored), diff(stored, named))
	}
	if got := listRun(t, hosts[0], "r1"); got == nil {
		t.Error("the run does not read back")
	}
}

// TestAPageThatDoesNotMatchItsRecordIsRefused: a page changed by
// something other than agentkit is an error naming it, not a run with
// other cases.
func TestAPageThatDoesNotMatchItsRecordIsRefused(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	a := agent(t, define(t, storage.Config{Backend: db}), "support")
	if err := a.Evals().Put(ctx, "r1", bigRun(1000, 600, nil)); err != nil {
		t.Fatal(err)
	}
	pk := keysUnder(t, db, pagesPrefix)[0]
	raw, _ := db.Get(ctx, pk)
	if err := db.Put(ctx, pk, []byte(strings.Replace(string(raw), "case-", "CASE-", 1))); err != nil {
		t.Fatal(err)
	}
	var listErr error
	for _, err := range a.Evals().List(ctx) {
		if err != nil {
			listErr = err
		}
	}
	if listErr == nil || !strings.Contains(listErr.Error(), "do not match its run's record") {
		t.Errorf("a changed page: %v", listErr)
	}
	if errors.Is(listErr, kv.ErrNotFound) {
		t.Error("a changed page reads as a missing one")
	}
}

// TestALosingWriterDeletesNoPageTheWinnerNames: a write that loses its
// compare-and-set to another host, and then gives up, must not have
// deleted a page of the record it read: the winner's record may name it.
func TestALosingWriterDeletesNoPageTheWinnerNames(t *testing.T) {
	store := memkv.NewStore()
	var hook func()
	f := kv.Funcs{
		Put: store.Put, Get: store.Get, Delete: store.Delete, List: store.List,
		CAS: kv.CASFuncs{GetWithVersion: store.GetWithVersion, PutIfAbsent: store.PutIfAbsent, ListKeys: store.ListKeys,
			PutIfVersion: func(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
				if h := hook; h != nil && strings.Contains(key, "/eval-runs/") {
					hook = nil
					h() // the other host's write lands first
				}
				return store.PutIfVersion(ctx, key, value, expected)
			}},
	}
	db, err := kv.New("hooked", f)
	if err != nil {
		t.Fatal(err)
	}
	winner := agent(t, define(t, storage.Config{Backend: db}), "support")
	loser := agent(t, define(t, storage.Config{Backend: db}), "support")
	if err := winner.Evals().Put(context.Background(), "r1", bigRun(1000, 600, nil)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	won := bigRun(1000, 600, map[int]string{999: "winner "}) // keeps the first page
	hook = func() {
		if err := winner.Evals().Put(context.Background(), "r1", won); err != nil {
			t.Errorf("the winning write: %v", err)
		}
		cancel() // the loser gives up after its conflict
	}
	err = loser.Evals().Put(ctx, "r1", bigRun(1000, 600, map[int]string{0: "loser "})) // changes the first page
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the losing write: %v, want it to give up", err)
	}
	if got := listRun(t, winner, "r1"); !sameJSON(t, got, won) {
		t.Error("the winner's run does not read back whole")
	}
}

// TestALargeEvalRunOverNATS: a run of 1.3 MB (NATS takes values up to
// 1 MiB) is stored in pages, read back whole by another host, updated and
// deleted with its pages.
func TestALargeEvalRunOverNATS(t *testing.T) {
	ctx := context.Background()
	u := natstest.URL(t, "storage_evals_")
	open := func() *storage.AgentStore {
		db, err := kv.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return agent(t, define(t, storage.Config{Backend: db}), "support")
	}
	a, b := open(), open()
	doc := bigRun(2000, 600, nil)
	if err := a.Evals().Put(ctx, "r1", doc); err != nil {
		t.Fatalf("a 1.3 MB run over NATS: %v", err)
	}
	if got := listRun(t, b, "r1"); !sameJSON(t, got, doc) {
		t.Fatal("another host does not read the run back whole")
	}
	err := b.Evals().Update(ctx, "r1", func(old json.RawMessage) (json.RawMessage, error) {
		return bigRun(2000, 600, map[int]string{1999: "done "}), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := listRun(t, a, "r1"); !sameJSON(t, got, bigRun(2000, 600, map[int]string{1999: "done "})) {
		t.Fatal("the updated run does not read back")
	}
	if err := a.Evals().Delete(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	db, _ := kv.Open(ctx, u)
	defer db.Close()
	if left := keysUnder(t, db, "agentkit/v1/support/eval-"); len(left) != 0 {
		t.Errorf("deleting the run left %d keys: %q", len(left), left[:min(3, len(left))])
	}
}

// TestDeletingARunSparesTheNextWritesPages: a write of the run that lands
// while the run is being deleted (its record created again, with pages of
// its own) keeps every page its record names.
func TestDeletingARunSparesTheNextWritesPages(t *testing.T) {
	store := memkv.NewStore()
	var hook func()
	f := kv.Funcs{
		Put: store.Put, Get: store.Get, List: store.List,
		Delete: func(ctx context.Context, key string) error {
			err := store.Delete(ctx, key)
			if h := hook; h != nil && strings.HasSuffix(key, "/eval-runs/r1") {
				hook = nil
				h() // another host writes the run again, just after the record went
			}
			return err
		},
		CAS: kv.CASFuncsOf(store),
	}
	db, err := kv.New("hooked", f)
	if err != nil {
		t.Fatal(err)
	}
	a := agent(t, define(t, storage.Config{Backend: db}), "support")
	b := agent(t, define(t, storage.Config{Backend: db}), "support")
	ctx := context.Background()
	if err := a.Evals().Put(ctx, "r1", bigRun(1000, 600, nil)); err != nil {
		t.Fatal(err)
	}
	again := bigRun(1000, 600, map[int]string{0: "again "})
	hook = func() {
		if err := b.Evals().Put(ctx, "r1", again); err != nil {
			t.Errorf("the write racing the deletion: %v", err)
		}
	}
	if err := a.Evals().Delete(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if got := listRun(t, a, "r1"); !sameJSON(t, got, again) {
		t.Errorf("the run written during its deletion reads back as %d bytes, not whole", len(got))
	}
}
