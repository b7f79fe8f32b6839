package agent_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	_ "agentkit/kv/sqlitekv"
)

// sharedStore is a real SQLite store two hosts share.
func sharedStore(t *testing.T) *kv.DB {
	t.Helper()
	db, err := kv.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "shared.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

var epoch = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// seedSessions runs n one-turn sessions on another host (its own state
// root), the i-th updated at times[i], and returns their ids.
func seedSessions(t *testing.T, store *kv.DB, times []time.Time) []string {
	t.Helper()
	clk := newClock(epoch)
	other := open(t, agent.Config{Agent: agent.Agent{Name: "restore"}, Store: store, Now: clk.Now, Memory: agent.Memory{Off: true}})
	var ids []string
	for _, at := range times {
		clk.Set(at)
		ids = append(ids, start(t, other, "hello there").SessionID)
	}
	return ids
}

// openAt opens a runtime of the "restore" agent on root.
func openAt(t *testing.T, root string, store any, p agent.Policy, now func() time.Time) *agent.Runtime {
	t.Helper()
	rt, err := agent.Open(context.Background(), agent.Config{
		Agent: agent.Agent{Name: "restore", Model: echoModel(t)}, StateRoot: root, Store: store,
		Policy: p, Now: now, Memory: agent.Memory{Off: true}, Logger: discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func localIDs(t *testing.T, rt *agent.Runtime) []string {
	t.Helper()
	page, err := rt.ListSessions(context.Background(), 1000, "")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range page.Sessions {
		ids = append(ids, s.ID)
	}
	return ids
}

func minutes(n int) []time.Time {
	var out []time.Time
	for i := range n {
		out = append(out, epoch.Add(time.Duration(i)*time.Minute))
	}
	return out
}

func newestFirst(ids []string) []string {
	out := slices.Clone(ids)
	slices.Reverse(out)
	return out
}

func TestRestoreMaxSessionsAcrossRestarts(t *testing.T) {
	store := sharedStore(t)
	ids := newestFirst(seedSessions(t, store, minutes(6)))
	root := t.TempDir()
	now := func() time.Time { return epoch.Add(time.Hour) }
	p := agent.Policy{Restore: agent.RestorePolicy{MaxSessions: 3}}

	rt := openAt(t, root, store, p, now)
	if got := localIDs(t, rt); !slices.Equal(got, ids[:3]) {
		t.Errorf("first start restored %q, want the 3 newest %q", got, ids[:3])
	}
	// A restored session is complete: its events came along.
	ev, err := rt.LastEvents(context.Background(), ids[0], 10)
	if err != nil || len(ev) != 3 || ev[2].Type != agent.EventTurnFinished || ev[2].Result != "echo: hello there" {
		t.Errorf("restored events %+v %v", ev, err)
	}
	rt.Close()

	// Same folder, same cap: the local sessions count toward it.
	rt = openAt(t, root, store, p, now)
	if got := localIDs(t, rt); !slices.Equal(got, ids[:3]) {
		t.Errorf("restart restored %q", got)
	}
	rt.Close()

	// A larger cap loads the next ones.
	p.Restore.MaxSessions = 5
	rt = openAt(t, root, store, p, now)
	if got := localIDs(t, rt); !slices.Equal(got, ids[:5]) {
		t.Errorf("cap 5 gave %q, want %q", got, ids[:5])
	}
	rt.Close()
}

func TestRestoreMaxAge(t *testing.T) {
	store := sharedStore(t)
	now := epoch.Add(100 * 24 * time.Hour)
	days := func(d int) time.Time { return now.Add(-time.Duration(d) * 24 * time.Hour) }
	ids := seedSessions(t, store, []time.Time{days(40), days(20), days(10), days(1)})
	root := t.TempDir()
	p := agent.Policy{Restore: agent.RestorePolicy{MaxAge: 15 * 24 * time.Hour}}
	rt := openAt(t, root, store, p, func() time.Time { return now })
	if got, want := localIDs(t, rt), []string{ids[3], ids[2]}; !slices.Equal(got, want) {
		t.Errorf("MaxAge 15d restored %q, want %q", got, want)
	}
	rt.Close()
	// Default MaxAge (30 days) after a restart on the same folder.
	rt = openAt(t, root, store, agent.Policy{}, func() time.Time { return now })
	if got, want := localIDs(t, rt), []string{ids[3], ids[2], ids[1]}; !slices.Equal(got, want) {
		t.Errorf("default MaxAge restored %q, want %q", got, want)
	}
	rt.Close()
}

func TestRestoreMaxTotalBytes(t *testing.T) {
	store := sharedStore(t)
	ids := newestFirst(seedSessions(t, store, minutes(5)))
	ctx := context.Background()
	// The bytes restore reads per session: its index entry and its folder
	// (head, metadata, event batch) (docs/runtime.md).
	size := func(id string) int64 {
		var n int64
		for e, err := range store.List(ctx, "agentkit/v1/restore/") {
			if err != nil {
				t.Fatal(err)
			}
			isIndex := strings.HasPrefix(e.Key, "agentkit/v1/restore/session-index/") && strings.HasSuffix(e.Key, "/"+id)
			if isIndex || strings.HasPrefix(e.Key, "agentkit/v1/restore/sessions/"+id+"/") {
				n += int64(len(e.Value))
			}
		}
		return n
	}
	s0, s1 := size(ids[0]), size(ids[1])
	now := func() time.Time { return epoch.Add(time.Hour) }
	for _, c := range []struct {
		budget int64
		want   int
	}{
		{1, 1},              // the first session crosses the budget: loaded, then stop
		{s0 + s1, 2},        // exactly two sessions' bytes
		{s0 + s1 + 1, 3},    // a byte more: the third is read too
		{1 << 30, len(ids)}, // the default
	} {
		root := t.TempDir()
		rt := openAt(t, root, store, agent.Policy{Restore: agent.RestorePolicy{MaxTotalBytes: c.budget}}, now)
		if got := localIDs(t, rt); !slices.Equal(got, ids[:c.want]) {
			t.Errorf("budget %d restored %d sessions, want %d", c.budget, len(got), c.want)
		}
		rt.Close()
		// Reopening the same folder keeps what is there.
		rt = openAt(t, root, store, agent.Policy{Restore: agent.RestorePolicy{MaxTotalBytes: c.budget}}, now)
		if got := localIDs(t, rt); len(got) < c.want {
			t.Errorf("budget %d after restart: %d sessions", c.budget, len(got))
		}
		rt.Close()
	}
}

func TestRestoreOffLoadsOnDemand(t *testing.T) {
	store := sharedStore(t)
	c := newCounting(store)
	ids := seedSessions(t, store, minutes(3))
	root := t.TempDir()
	p := agent.Policy{Restore: agent.RestorePolicy{Off: true}}
	rt := openAt(t, root, c.funcs(), p, nil)
	if got := localIDs(t, rt); len(got) != 0 {
		t.Errorf("restore off loaded %q", got)
	}
	if n := c.lists.Load(); n != 2 { // the reminders' hydration and the actors' scheduled tasks only
		t.Errorf("restore off listed the store %d times", n)
	}
	// On demand: GetSession loads the session.
	s, err := rt.GetSession(context.Background(), ids[0])
	if err != nil || s.ID != ids[0] || s.Turns != 1 {
		t.Errorf("on demand %+v %v", s, err)
	}
	rt.Close()
	rt = openAt(t, root, c.funcs(), p, nil)
	defer rt.Close()
	if got := localIDs(t, rt); !slices.Equal(got, []string{ids[0]}) {
		t.Errorf("after a restart with restore off: %q", got)
	}
}

// TestAnOlderCopyCatchesUpAtRestart: a host whose local copy is older
// than the store's (another host continued the session meanwhile) takes
// the newer turns at start-up, reading only the batches it lacks.
func TestAnOlderCopyCatchesUpAtRestart(t *testing.T) {
	store := sharedStore(t)
	ctx := context.Background()
	root := t.TempDir()
	a := openAt(t, root, store, agent.Policy{}, nil)
	res := start(t, a, "one")
	a.Close()
	// Another host continues the session through the store.
	b := open(t, agent.Config{Agent: agent.Agent{Name: "restore"}, Store: store})
	if _, err := b.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	c := newCounting(store)
	a = openAt(t, root, c.funcs(), agent.Policy{}, nil)
	defer a.Close()
	s, err := a.GetSession(ctx, res.SessionID)
	if err != nil || s.Turns != 2 || s.LastSeq != 6 {
		t.Errorf("after the restart: %+v %v; want the store's 2 turns", s, err)
	}
	for _, k := range c.gotKeys() {
		if strings.HasSuffix(k, "/events/00000000000000000001") {
			t.Errorf("the catch-up read batch 1, which the local copy has")
		}
	}
	ev, _ := a.LastEvents(ctx, res.SessionID, 1)
	if len(ev) != 1 || ev[0].Result != "echo: two" {
		t.Errorf("last event %+v", ev)
	}
}

func TestRestoreSkipsDeletedAndSurvivesStoreErrors(t *testing.T) {
	ctx := context.Background()
	store := sharedStore(t)
	ids := seedSessions(t, store, minutes(3))
	// Delete one session on another host, and put back its index entry
	// as a host that missed the delete would: a stale entry of a deleted
	// session.
	var staleKey string
	var stale []byte
	for e, err := range store.List(ctx, "agentkit/v1/restore/session-index/") {
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(e.Key, "/"+ids[2]) {
			staleKey, stale = e.Key, e.Value
		}
	}
	other := open(t, agent.Config{Agent: agent.Agent{Name: "restore"}, Store: store, Policy: agent.Policy{Restore: agent.RestorePolicy{Off: true}}})
	if err := other.DeleteSession(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	if err := store.Put(ctx, staleKey, stale); err != nil {
		t.Fatal(err)
	}
	rt := openAt(t, t.TempDir(), store, agent.Policy{}, func() time.Time { return epoch.Add(time.Hour) })
	if got, want := localIDs(t, rt), []string{ids[1], ids[0]}; !slices.Equal(got, want) {
		t.Errorf("restored %q, want %q", got, want)
	}
	rt.Close()
	if _, err := store.Get(ctx, staleKey); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("the stale index entry of the deleted session is still there: %v", err)
	}

	c := newCounting(store)
	c.failGet.Store(true)
	rt = openAt(t, t.TempDir(), c.funcs(), agent.Policy{}, nil)
	defer rt.Close()
	if got := localIDs(t, rt); len(got) != 0 {
		t.Errorf("restored %q from a failing store", got)
	}
	if _, err := rt.GetSession(ctx, ids[0]); !errors.Is(err, agent.ErrStoreUnavailable) {
		t.Errorf("GetSession with a failing store: %v", err)
	}
}
