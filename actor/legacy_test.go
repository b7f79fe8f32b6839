package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
)

const legacyAgent = "support"

// legacyPrefix is the key-value prefix of actor id.
func legacyKey(t testing.TB, id, rest string) string {
	t.Helper()
	s, err := keys.Agent(legacyAgent)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Actor(id)
	if err != nil {
		t.Fatal(err)
	}
	return p + rest
}

// seedLegacy writes an actor in the key-value layout: a state, n messages
// (enveloped and bare), two events and one scheduled task due at due.
func seedLegacy(t testing.TB, store *kv.DB, id string, n int, due time.Time) {
	t.Helper()
	ctx := context.Background()
	put := func(rest, v string) {
		if err := store.Put(ctx, legacyKey(t, id, rest), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	put("state", `{"status":"waiting","lastReply":"old","at":12345678901234567890}`)
	for i := 1; i <= n; i++ {
		if i%2 == 0 {
			put("messages/"+keys.Seq(uint64(i)), fmt.Sprintf(`{"at":"2024-05-01T12:00:%02dZ","type":"user","data":{"n":%d}}`, i%60, i))
		} else {
			put("messages/"+keys.Seq(uint64(i)), fmt.Sprintf(`{"n":%d}`, i))
		}
	}
	put("events/"+keys.Seq(1), `{"at":"2024-05-01T12:00:00Z","type":"progress","data":"started"}`)
	put("events/"+keys.Seq(2), `"done"`)
	put("schedules/task_legacy", fmt.Sprintf(`{"id":"task_legacy","handler":"h","payload":{"x":1},"kind":"at","due":%q}`, due.UTC().Format(time.RFC3339Nano)))
}

// legacyStatus is the state seedLegacy writes, as the Status class sees it
// (the number does not fit int64, so tests read it as JSON).
const legacyStateJSON = `{"status":"waiting","lastReply":"old","at":12345678901234567890}`

func defineRaw(t testing.TB, h *Host) *Class[json.RawMessage] {
	t.Helper()
	c, err := Define(h, "session", func() json.RawMessage { return json.RawMessage(`{}`) })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func legacyHost(t testing.TB, store *kv.DB, dir, hostID string) (*Host, *Class[json.RawMessage]) {
	t.Helper()
	h := openHost(t, Options{Dir: dir, Store: store, Agent: legacyAgent, HostID: hostID})
	return h, defineRaw(t, h)
}

func storeKeys(t testing.TB, store *kv.DB, prefix string) []string {
	t.Helper()
	var out []string
	for k, err := range store.ListKeys(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

// checkLegacyReads reads every store of a legacy actor and compares it
// with what seedLegacy wrote.
func checkLegacyReads(t testing.TB, a *Actor[json.RawMessage], n int, wantState string) {
	t.Helper()
	ctx := context.Background()
	st, err := a.State(ctx)
	if err != nil || string(st) != wantState {
		t.Fatalf("state = %s, %v; want the key-value layout's", st, err)
	}
	last, err := a.Messages().Last(ctx, 3)
	if err != nil || len(last) != 3 || last[2].Seq != int64(n) {
		t.Fatalf("Last(3) = %+v, %v", last, err)
	}
	var all []Record
	for cursor, pages := int64(0), 0; ; pages++ {
		if pages > n {
			t.Fatalf("still paging after %d pages: the cursor does not advance", pages)
		}
		page, err := a.Messages().After(ctx, cursor, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		cursor = page[len(page)-1].Seq
	}
	if len(all) != n {
		t.Fatalf("paging read %d messages, want %d", len(all), n)
	}
	for i, r := range all {
		want := fmt.Sprintf(`{"n":%d}`, i+1)
		if r.Seq != int64(i+1) || string(r.Data) != want {
			t.Fatalf("message %d = %+v, want seq %d data %s", i, r, i+1, want)
		}
		if (i+1)%2 == 0 && (r.Type != "user" || r.At.IsZero()) {
			t.Fatalf("an enveloped message lost its type or time: %+v", r)
		}
	}
	ev, err := a.Events().After(ctx, 0, 0)
	if err != nil || len(ev) != 2 || ev[0].Type != "progress" || string(ev[0].Data) != `"started"` || string(ev[1].Data) != `"done"` {
		t.Fatalf("events = %+v, %v", ev, err)
	}
	ts, err := a.Schedules(ctx)
	if err != nil || len(ts) != 1 || ts[0].ID != "task_legacy" || string(ts[0].Payload) != `{"x":1}` || ts[0].Actor != a.ID() {
		t.Fatalf("tasks = %+v, %v", ts, err)
	}
}

// TestReadOnlyActorKeepsItsOldLayout: reads of an actor in the key-value
// layout serve it from there, create no file and change no key.
func TestReadOnlyActorKeepsItsOldLayout(t *testing.T) {
	store := memkv.New()
	seedLegacy(t, store, "s1", 9, time.Now().Add(time.Hour))
	before := storeKeys(t, store, "")
	h, c := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-a")
	a := actorOf(t, c, "s1")
	for range 2 {
		checkLegacyReads(t, a, 9, legacyStateJSON)
	}
	if fs := files(t, h.Dir()); fs != nil {
		t.Errorf("reads created files: %v", fs)
	}
	if after := storeKeys(t, store, ""); !slices.Equal(before, after) {
		t.Errorf("reads changed the store's keys:\nbefore %v\nafter  %v", before, after)
	}
}

// TestFirstWriteMigrates: the first write copies everything, leaves a
// marker naming this host, deletes the old keys, and the write applies on
// top of the migrated state.
func TestFirstWriteMigrates(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	seedLegacy(t, store, "s1", 9, time.Now().Add(time.Hour))
	seedLegacy(t, store, "s2", 3, time.Now().Add(time.Hour))
	h, c := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-a")
	a := actorOf(t, c, "s1")
	st, err := a.SetState(ctx, []byte(`{"status":"processing"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"status":"processing","lastReply":"old","at":12345678901234567890}`; string(st) != want {
		t.Fatalf("the first write gave %s, want %s (the patch on the migrated state)", st, want)
	}
	if !a.HasDatabase() {
		t.Fatal("no database after the migration")
	}
	left := storeKeys(t, store, legacyKey(t, "s1", ""))
	if len(left) != 1 || !strings.HasSuffix(left[0], "/migrated") {
		t.Fatalf("after the migration the store holds %v; want only the marker", left)
	}
	raw, _ := store.Get(ctx, left[0])
	var m markerRecord
	if err := json.Unmarshal(raw, &m); err != nil || m.State != markerMigrated || m.Host != "host-a" || m.Dir != h.Dir() || m.Class != "session" || m.ID != "s1" {
		t.Fatalf("marker %s (%v)", raw, err)
	}
	if n := len(storeKeys(t, store, legacyKey(t, "s2", ""))); n != 3+2+2 {
		t.Errorf("another actor's keys changed: %d left", n)
	}
	// Everything reads the same from the database, and the state with the
	// patch.
	if err := a.ReplaceStateJSON(ctx, []byte(legacyStateJSON)); err != nil {
		t.Fatal(err)
	}
	checkLegacyReads(t, a, 9, legacyStateJSON)
	if rec, err := a.Messages().Append(ctx, "user", json.RawMessage(`1`)); err != nil || rec.Seq != 10 {
		t.Fatalf("an append after the migration = %+v, %v; want seq 10", rec, err)
	}
	// A second write migrates nothing again.
	if _, err := a.SetState(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Messages().Last(ctx, 100); len(n) != 10 {
		t.Errorf("%d messages after a second write, want 10", len(n))
	}
}

// TestMarkerRefusesAHostWithoutTheDatabase: after a migration, another host
// (or this one, having lost the file) refuses the actor, naming the host
// that has it, instead of serving an empty actor.
func TestMarkerRefusesAHostWithoutTheDatabase(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	seedLegacy(t, store, "s1", 2, time.Now().Add(time.Hour))
	dirA := filepath.Join(t.TempDir(), "actors")
	_, ca := legacyHost(t, store, dirA, "host-a")
	if _, err := actorOf(t, ca, "s1").SetState(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_, cb := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-b")
	b := actorOf(t, cb, "s1")
	var me *MigratedError
	_, err := b.State(ctx)
	if !errors.As(err, &me) || me.Host != "host-a" || !errors.Is(err, ErrMigrated) || !strings.Contains(err.Error(), "host-a") {
		t.Fatalf("State on a host without the database = %v; want a MigratedError naming host-a", err)
	}
	for what, err := range map[string]error{
		"SetState": func() error { _, err := b.SetState(ctx, []byte(`{}`)); return err }(),
		"Last":     func() error { _, err := b.Messages().Last(ctx, 1); return err }(),
		"Append":   func() error { _, err := b.Events().Append(ctx, "x", nil); return err }(),
		"Tasks":    func() error { _, err := b.Schedules(ctx); return err }(),
	} {
		if !errors.Is(err, ErrMigrated) {
			t.Errorf("%s on a host without the database = %v", what, err)
		}
	}
	if b.HasDatabase() {
		t.Error("the refused host created a database")
	}
	// The migrating host with its file gone: the same refusal, saying so.
	_, ca2 := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-a")
	_, err = actorOf(t, ca2, "s1").State(ctx)
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "host-a") {
		t.Fatalf("host-a under another folder = %v", err)
	}
	if err := os.RemoveAll(dirA); err != nil {
		t.Fatal(err)
	}
	_, ca3 := legacyHost(t, store, dirA, "host-a")
	_, err = actorOf(t, ca3, "s1").SetState(ctx, []byte(`{}`))
	if !errors.As(err, &me) || !me.Lost || !strings.Contains(err.Error(), "restore it from a backup") {
		t.Fatalf("the migrating host without its file = %v; want the lost-database error", err)
	}
}

// TestAMigrationInProgressElsewhere: a marker claimed by another host that
// has not finished leaves the old records readable, but writes are that
// host's.
func TestAMigrationInProgressElsewhere(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	seedLegacy(t, store, "s1", 4, time.Now().Add(time.Hour))
	claim, _ := json.Marshal(markerRecord{Format: 1, State: markerMigrating, Host: "host-a", Dir: "/srv/a/actors", Class: "session", ID: "s1"})
	if err := store.Put(ctx, legacyKey(t, "s1", "migrated"), claim); err != nil {
		t.Fatal(err)
	}
	_, c := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-b")
	b := actorOf(t, c, "s1")
	checkLegacyReads(t, b, 4, legacyStateJSON)
	_, err := b.SetState(ctx, []byte(`{}`))
	var me *MigratedError
	if !errors.As(err, &me) || me.State != markerMigrating || !strings.Contains(err.Error(), "host-a") || !strings.Contains(err.Error(), legacyKey(t, "s1", "migrated")) {
		t.Fatalf("a write during another host's migration = %v", err)
	}
	if b.HasDatabase() {
		t.Error("a write refused during another host's migration created a database")
	}
}

func TestNewerMarkerIsRefused(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	seedLegacy(t, store, "s1", 1, time.Now())
	if err := store.Put(ctx, legacyKey(t, "s1", "migrated"), []byte(`{"format":2,"state":"migrated","host":"h9"}`)); err != nil {
		t.Fatal(err)
	}
	_, c := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-b")
	if _, err := actorOf(t, c, "s1").State(ctx); !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), "upgrade agentkit") {
		t.Fatalf("a newer marker = %v", err)
	}
}

// TestABadRecordStopsTheMigration: a record that is not what its key says
// is never dropped: the write fails naming the key, and nothing changes.
func TestABadRecordStopsTheMigration(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	seedLegacy(t, store, "s1", 2, time.Now())
	bad := legacyKey(t, "s1", "messages/"+keys.Seq(3))
	store.Put(ctx, bad, []byte(`{"n":`))
	h, c := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-a")
	a := actorOf(t, c, "s1")
	_, err := a.SetState(ctx, []byte(`{}`))
	if err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("migrating a bad record = %v; want an error naming %s", err, bad)
	}
	if a.HasDatabase() {
		t.Error("a failed migration left a database")
	}
	if n := len(storeKeys(t, store, legacyKey(t, "s1", ""))); n != 1+3+2+1+1 {
		t.Errorf("%d keys left, want every record and the claim", n)
	}
	store.Delete(ctx, bad)
	if _, err := a.SetState(ctx, []byte(`{}`)); err != nil {
		t.Fatalf("after fixing the record: %v", err)
	}
	if fs := files(t, h.Dir()); len(fs) == 0 || slices.ContainsFunc(fs, func(f string) bool { return strings.Contains(f, ".tmp-") }) {
		t.Errorf("files after the migration: %v", fs)
	}
}

// TestOtherClassesHaveNoLegacyLayout: only LegacyClass reads the key-value
// layout.
func TestOtherClassesHaveNoLegacyLayout(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	seedLegacy(t, store, "s1", 2, time.Now())
	h, _ := legacyHost(t, store, filepath.Join(t.TempDir(), "actors"), "host-a")
	a := actorOf(t, defineStatus(t, h), "s1")
	if st, err := a.State(ctx); err != nil || st.Status != "idle" {
		t.Fatalf("another class's actor = %+v, %v", st, err)
	}
	if _, err := a.SetState(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if n := len(storeKeys(t, store, legacyKey(t, "s1", ""))); n != 1+2+2+1 {
		t.Errorf("another class's write touched the key-value layout: %d keys", n)
	}
}

// TestLegacyTasksRun: Run finds the tasks of actors still in the key-value
// layout; running one migrates its actor.
// This host's own unfinished migration (a crash after its claim) does not
// hide the tasks either.
func TestLegacyTasksRun(t *testing.T) {
	for _, claimed := range []bool{false, true} {
		t.Run(fmt.Sprint("claimed=", claimed), func(t *testing.T) { testLegacyTasksRun(t, claimed) })
	}
}

func testLegacyTasksRun(t *testing.T, claimed bool) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		seedLegacy(t, store, "s1", 2, time.Now().Add(time.Hour))
		dir := filepath.Join(t.TempDir(), "actors")
		if claimed {
			b, _ := json.Marshal(markerRecord{Format: 1, State: markerMigrating, Host: "host-a", Dir: dir, Class: "session", ID: "s1"})
			store.Put(context.Background(), legacyKey(t, "s1", "migrated"), b)
		}
		rec := &runs{}
		h, err := Open(Options{Dir: dir, Store: store, Agent: legacyAgent, HostID: "host-a", Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		h.Handle("h", rec.handler)
		c := defineRaw(t, h)
		defer running(t, h)()
		time.Sleep(59 * time.Minute)
		synctest.Wait()
		if rec.count() != 0 || actorOf(t, c, "s1").HasDatabase() {
			t.Fatal("the legacy task ran early, or the actor migrated before a write")
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		tasks, _ := rec.snapshot()
		if len(tasks) != 1 || tasks[0].ID != "task_legacy" || string(tasks[0].Payload) != `{"x":1}` {
			t.Fatalf("runs %+v; want the legacy task once", tasks)
		}
		a := actorOf(t, c, "s1")
		if !a.HasDatabase() {
			t.Fatal("running the task did not migrate the actor")
		}
		if ts, _ := a.Schedules(context.Background()); len(ts) != 0 {
			t.Errorf("the task is still listed after running: %+v", ts)
		}
		if n := len(storeKeys(t, store, legacyKey(t, "s1", ""))); n != 1 {
			t.Errorf("%d keys left after the migration, want the marker", n)
		}
	})
}
