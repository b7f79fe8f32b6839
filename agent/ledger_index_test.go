package agent_test

import (
	"context"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
)

const indexPrefix = "agentkit/v1/ledger-agent/session-index/"

// storeOps counts the store operations made under a context marked with
// counted, through an observer: the hosts' background work is not.
type storeOps struct {
	mu  sync.Mutex
	ops []kv.Observation
}

type countedKey struct{}

func counted() context.Context { return context.WithValue(context.Background(), countedKey{}, true) }

func (s *storeOps) observe(ctx context.Context, o kv.Observation) {
	if ctx.Value(countedKey{}) == nil {
		return
	}
	s.mu.Lock()
	s.ops = append(s.ops, o)
	s.mu.Unlock()
}

// count returns how many operations since the last reset read a key
// containing sub (Get, GetWithVersion, or a listing of a prefix with it).
func (s *storeOps) count(sub string) (reads, lists int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.ops {
		if !strings.Contains(o.Key, sub) {
			continue
		}
		switch o.Op {
		case kv.OpGet, kv.OpGetWithVersion:
			reads++
		case kv.OpList, kv.OpListKeys:
			lists++
		}
	}
	return reads, lists
}

func (s *storeOps) reset() {
	s.mu.Lock()
	s.ops = nil
	s.mu.Unlock()
}

func indexEntries(t *testing.T, db *kv.DB) []string {
	t.Helper()
	var out []string
	for k, err := range db.ListKeys(context.Background(), indexPrefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

// settle waits until the hosts' background index writes are done: n
// entries, each its session's current one. (A start is answered once its
// turn commits, and the entry of that commit is noted just after.)
func settle(t *testing.T, base *kv.DB, n int, hosts ...*agent.Runtime) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		done := true
		for _, rt := range hosts {
			ok, err := agent.LedgerIndexSettled(rt)
			if err != nil {
				t.Fatal(err)
			}
			done = done && ok
		}
		got := indexEntries(t, base)
		if done && len(got) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d index entries (settled: %v), want %d", len(got), done, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func listAll(t *testing.T, rt *agent.Runtime, limit int) []agent.Session {
	t.Helper()
	var all []agent.Session
	cur := ""
	for range 1000 {
		page, err := rt.ListSessions(context.Background(), limit, cur)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Sessions...)
		if page.NextCursor == "" {
			return all
		}
		cur = page.NextCursor
	}
	t.Fatal("the listing does not end")
	return nil
}

// TestLedgerListingReadsTheSessionIndex: in serving mode ledger, once the
// index is built, a page of the session listing reads the index from its
// cursor and one control record per session listed, not every session's:
// listing 10 of 60 sessions reads 11 control records. Paging visits every
// session once, newest first, on either host, and every session has one
// entry once the background writes are done.
func TestLedgerListingReadsTheSessionIndex(t *testing.T) {
	base := memkv.New()
	ops := &storeOps{}
	store := base.WithObserver(ops.observe)
	a := ledgerHost(t, store, echoModel(t), nil)
	b := ledgerHost(t, store, echoModel(t), nil)
	for _, rt := range []*agent.Runtime{a, b} {
		if err := agent.BuildLedgerIndex(rt); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]bool{}
	for i := range 60 {
		rt := a
		if i%2 == 1 {
			rt = b
		}
		ids[start(t, rt, "hello").SessionID] = true
	}
	settle(t, base, 60, a, b)
	ops.reset()
	page, err := b.ListSessions(counted(), 10, "")
	if err != nil {
		t.Fatal(err)
	}
	reads, lists := ops.count("/durable-session/ctl/")
	if len(page.Sessions) != 10 || page.NextCursor == "" || reads != 11 || lists != 0 {
		t.Errorf("a page of 10 of 60 sessions: %d sessions, cursor %q, %d control records read, %d listings of them; want 10, a cursor, 11 and 0",
			len(page.Sessions), page.NextCursor, reads, lists)
	}
	for _, rt := range []*agent.Runtime{a, b} {
		all := listAll(t, rt, 7)
		seen := map[string]bool{}
		for i, s := range all {
			if seen[s.ID] || !ids[s.ID] {
				t.Fatalf("session %s listed twice or unknown", s.ID)
			}
			seen[s.ID] = true
			if i > 0 && s.UpdatedAt.After(all[i-1].UpdatedAt) {
				t.Fatalf("the listing is not newest first at %d", i)
			}
			if s.Turns != 1 || s.ChannelID == "" {
				t.Fatalf("row %+v: want its turn and channel", s)
			}
		}
		if len(seen) != 60 {
			t.Errorf("paging lists %d of 60 sessions", len(seen))
		}
	}
}

// TestLedgerIndexRepairsWhatAHostLeftBehind: an entry left for an older
// time (a host killed between a commit and its entry's write) still lists
// the session, and the listing writes the current entry and deletes the
// old one; a deleted session's entry is skipped and deleted; an entry
// lost altogether is written again by the janitor's sweep hook.
func TestLedgerIndexRepairsWhatAHostLeftBehind(t *testing.T) {
	base := memkv.New()
	a := ledgerHost(t, base, echoModel(t), nil)
	if err := agent.BuildLedgerIndex(a); err != nil {
		t.Fatal(err)
	}
	first := start(t, a, "one")
	settle(t, base, 1, a)
	old := indexEntries(t, base)
	oldEntry, _ := base.Get(context.Background(), old[0])
	// A second turn, whose entry's write is lost: the old entry stays,
	// the new one never comes.
	if _, err := a.Continue(context.Background(), agent.ContinueRequest{Token: first.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	settle(t, base, 1, a)
	for _, k := range indexEntries(t, base) {
		base.Delete(context.Background(), k)
	}
	if err := base.Put(context.Background(), old[0], oldEntry); err != nil {
		t.Fatal(err)
	}
	b := ledgerHost(t, base, echoModel(t), nil) // another host, which never wrote the entry
	page, err := b.ListSessions(context.Background(), 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Sessions) != 1 || page.Sessions[0].ID != first.SessionID || page.Sessions[0].Turns != 2 {
		t.Fatalf("the listing over a stale entry: %+v; want the session with its 2 turns", page.Sessions)
	}
	agent.FlushLedgerIndex(b)
	now := indexEntries(t, base)
	if len(now) != 1 || now[0] == old[0] {
		t.Errorf("after the listing's repair the entries are %q; want one, not the stale %q", now, old[0])
	}

	// Lost altogether: the sweep hook writes it.
	base.Delete(context.Background(), now[0])
	if err := agent.SweepLedgerIndex(b, first.SessionID); err != nil {
		t.Fatal(err)
	}
	if got := indexEntries(t, base); len(got) != 1 || got[0] != now[0] {
		t.Errorf("after the sweep hook the entries are %q; want %q again", got, now[0])
	}

	// Deleted: not listed, and its entry goes.
	if err := a.DeleteSession(context.Background(), first.SessionID); err != nil {
		t.Fatal(err)
	}
	page, err = b.ListSessions(context.Background(), 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Sessions) != 0 {
		t.Errorf("a deleted session is listed: %+v", page.Sessions)
	}
	agent.FlushLedgerIndex(b)
	if got := indexEntries(t, base); len(got) != 0 {
		t.Errorf("the deleted session's entries stay: %q", got)
	}
}

// TestLedgerIndexIsBuiltForEarlierSessions: sessions served before the
// index existed (no entries, no marker) are listed from every control
// record until a host builds the index, then from the index, all of them.
func TestLedgerIndexIsBuiltForEarlierSessions(t *testing.T) {
	base := memkv.New()
	a := ledgerHost(t, base, echoModel(t), nil)
	if err := agent.BuildLedgerIndex(a); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		start(t, a, "hi")
	}
	settle(t, base, 5, a)
	// As an earlier build left the store: no entries, no marker.
	for _, k := range indexEntries(t, base) {
		base.Delete(context.Background(), k)
	}
	if err := base.Delete(context.Background(), "agentkit/v1/ledger-agent/migrations/ledger-session-index"); err != nil {
		t.Fatal(err)
	}
	b := ledgerHost(t, base, echoModel(t), func(c *agent.Config) { c.Agent.Name = "ledger-agent" })
	if got := listAll(t, b, 2); len(got) != 5 {
		// The build may have run already; either way every session shows.
		t.Errorf("before or during the build: %d of 5 sessions listed", len(got))
	}
	if err := agent.BuildLedgerIndex(b); err != nil {
		t.Fatal(err)
	}
	if n := len(indexEntries(t, base)); n != 5 {
		t.Errorf("the build wrote %d entries for 5 sessions", n)
	}
	if got := listAll(t, b, 2); len(got) != 5 {
		t.Errorf("from the index: %d of 5 sessions listed", len(got))
	}
}

// TestLedgerListingBegunBeforeAnEntryWasWrittenStillListsTheSession: a
// listing reads a stale entry of a session whose current entry was
// written after the listing began, between its cursor and that stale
// entry: the listing cannot see the current entry, so it lists the
// session at the stale one instead of skipping it.
func TestLedgerListingBegunBeforeAnEntryWasWrittenStillListsTheSession(t *testing.T) {
	inner := memkv.NewStore()
	var mu sync.Mutex
	var hook func()
	f := kv.Funcs{
		Put: inner.Put, Get: inner.Get, Delete: inner.Delete, List: inner.List,
		ListKeysAfter: inner.ListKeysAfter,
		ListAfter: func(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
			return func(yield func(kv.Entry, error) bool) {
				for e, err := range inner.ListAfter(ctx, prefix, after) {
					mu.Lock()
					h := hook
					hook = nil
					mu.Unlock()
					if h != nil && prefix == indexPrefix {
						h() // written after the listing read the index
					}
					if !yield(e, err) {
						return
					}
				}
			}
		},
		CAS:          kv.CASFuncsOf(inner),
		ProcessLocal: true, // a memory store, as the CAS group says
	}
	base, err := kv.New("hooked", f)
	if err != nil {
		t.Fatal(err)
	}
	a := ledgerHost(t, base, echoModel(t), func(c *agent.Config) { c.Ledger.AllowProcessLocal = true })
	if err := agent.BuildLedgerIndex(a); err != nil {
		t.Fatal(err)
	}
	first := start(t, a, "one")
	settle(t, base, 1, a)
	stale := indexEntries(t, base)[0]
	staleValue, _ := base.Get(context.Background(), stale)
	if _, err := a.Continue(context.Background(), agent.ContinueRequest{Token: first.ContinuationToken, Message: "two"}); err != nil {
		t.Fatal(err)
	}
	settle(t, base, 1, a)
	current := indexEntries(t, base)[0]
	currentValue, _ := base.Get(context.Background(), current)
	base.Delete(context.Background(), current)
	base.Put(context.Background(), stale, staleValue)
	mu.Lock()
	hook = func() { base.Put(context.Background(), current, currentValue) }
	mu.Unlock()
	page, err := a.ListSessions(context.Background(), 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Sessions) != 1 || page.Sessions[0].Turns != 2 {
		t.Errorf("a listing begun before the current entry was written: %+v; want the session, with its 2 turns", page.Sessions)
	}
}

// TestLedgerListingSkipsAnUnreadableControlRecord: a session whose control
// record this build cannot read (a newer format) is left out of the page,
// as the listing from every control record leaves it out, and the other
// sessions are listed.
func TestLedgerListingSkipsAnUnreadableControlRecord(t *testing.T) {
	base := memkv.New()
	a := ledgerHost(t, base, echoModel(t), nil)
	if err := agent.BuildLedgerIndex(a); err != nil {
		t.Fatal(err)
	}
	one, two := start(t, a, "one"), start(t, a, "two")
	settle(t, base, 2, a)
	if err := base.Put(context.Background(), "agentkit/v1/ledger-agent/durable-session/ctl/"+one.SessionID, []byte(`{"v":99}`)); err != nil {
		t.Fatal(err)
	}
	page, err := a.ListSessions(context.Background(), 10, "")
	if err != nil || len(page.Sessions) != 1 || page.Sessions[0].ID != two.SessionID {
		t.Errorf("with one unreadable control record: %+v, %v; want the other session", page.Sessions, err)
	}
}
