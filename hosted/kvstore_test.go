package hosted

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/kv"
	"agentkit/kv/hostedkv/wire"
	"agentkit/kv/memkv"
)

func init() {
	// A store with the core but no CAS group, for the refusal test.
	kv.Register("hostedtest-nocas", func(ctx context.Context, u *url.URL) (*kv.DB, error) {
		m := memkv.New()
		return kv.New("nocas", kv.Funcs{Put: m.Put, Get: m.Get, Delete: m.Delete, List: m.List})
	})
	// A store whose values are at most 4 KiB, for the too-large test.
	kv.Register("hostedtest-small", func(ctx context.Context, u *url.URL) (*kv.DB, error) {
		m := memkv.NewStore()
		check := func(v []byte) error {
			if len(v) > 4<<10 {
				return fmt.Errorf("small: %d bytes: %w", len(v), kv.ErrTooLarge)
			}
			return nil
		}
		return kv.New("small", kv.Funcs{
			Put: func(ctx context.Context, k string, v []byte) error {
				if err := check(v); err != nil {
					return err
				}
				return m.Put(ctx, k, v)
			},
			Get: m.Get, Delete: m.Delete, List: m.List,
			CAS: kv.CASFuncs{
				GetWithVersion: m.GetWithVersion, ListKeys: m.ListKeys,
				PutIfAbsent: func(ctx context.Context, k string, v []byte) (kv.Version, error) {
					if err := check(v); err != nil {
						return "", err
					}
					return m.PutIfAbsent(ctx, k, v)
				},
				PutIfVersion: func(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
					if err := check(v); err != nil {
						return "", err
					}
					return m.PutIfVersion(ctx, k, v, e)
				},
			},
		})
	})
}

// TestGenericBackendValueLimit: a value the backend's store refuses as too
// large is a 413 the client does not retry, and nothing is written.
func TestGenericBackendValueLimit(t *testing.T) {
	ts := newTestService(t, Options{Backend: "hostedtest-small://"}, "alpha")
	tok := ts.tokens["alpha"]
	a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, reqID(), bytes.Repeat([]byte("v"), 5<<10))
	if a.status != 413 || a.err.Code != wire.CodeTooLarge {
		t.Fatalf("a value over the store's limit: %d %+v, want 413 %s", a.status, a.err, wire.CodeTooLarge)
	}
	if g := ts.do(t, "GET", kvPath("alpha", "k"), tok, nil, nil); g.status != 404 {
		t.Fatalf("after the refused write: %d", g.status)
	}
	ts.put(t, "alpha", "k", "small enough")
}

// forEachGenericBackend runs fn on the generic backend over the memory
// driver and over Redis.
func forEachGenericBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Run("kv-mem", func(t *testing.T) { fn(t, "mem://") })
	t.Run("kv-redis", func(t *testing.T) { fn(t, redisBackend(t)) })
}

func TestGenericBackendNeedsTheCASGroup(t *testing.T) {
	dir := t.TempDir()
	creds := dir + "/creds.json"
	if _, _, err := AddCredential(creds, KeyPath(creds), "alpha", false); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), Options{Backend: "hostedtest-nocas://", Credentials: creds})
	if err == nil || !strings.Contains(err.Error(), "CAS group") {
		t.Fatalf("Open on a store without the CAS group: %v; want an error naming the CAS group", err)
	}
	_, err = Open(context.Background(), Options{Backend: "agentkit+http://127.0.0.1:1", Credentials: creds})
	if err == nil || !strings.Contains(err.Error(), "another storaged") {
		t.Fatalf("Open on another storaged: %v; want a refusal", err)
	}
}

// TestGenericRequestIDsPushedOutOfTheEnvelope writes a key many times after
// a conditional write, so the write's request id leaves the key's envelope
// for a request record: the resent write still gets its recorded outcome,
// never a conflict and never a second application. Removing the records
// makes the id new again.
func TestGenericRequestIDsPushedOutOfTheEnvelope(t *testing.T) {
	forEachGenericBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		tok := ts.tokens["alpha"]
		v0 := ts.put(t, "alpha", "k", "zero")
		piv := map[string]string{wire.HeaderRequestID: newID(), wire.HeaderIfVersion: v0}
		a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, piv, []byte("mine"))
		if a.status != 204 {
			t.Fatalf("PutIfVersion: %d %+v", a.status, a.err)
		}
		v1 := a.header.Get(wire.HeaderVersion)
		del := map[string]string{wire.HeaderRequestID: newID()}
		if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, del, nil); a.status != 204 {
			t.Fatalf("DELETE: %d", a.status)
		}
		for i := range 3 * recentIDs {
			ts.put(t, "alpha", "k", fmt.Sprintf("other %d", i))
		}
		a = ts.do(t, "PUT", kvPath("alpha", "k"), tok, piv, []byte("mine"))
		if a.status != 204 || a.header.Get(wire.HeaderVersion) != v1 || a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("the resent PutIfVersion, %d writes later: %d %+v version %q replayed %q; want 204 with %q, replayed",
				3*recentIDs+1, a.status, a.err, a.header.Get(wire.HeaderVersion), a.header.Get(wire.HeaderReplayed), v1)
		}
		if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, del, nil); a.status != 204 || a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("the resent DELETE: %d replayed %q", a.status, a.header.Get(wire.HeaderReplayed))
		}
		want := fmt.Sprintf("other %d", 3*recentIDs-1)
		if g := ts.do(t, "GET", kvPath("alpha", "k"), tok, nil, nil); string(g.body) != want {
			t.Fatalf("after the resends the key holds %q (%d), want %q: a resend was applied again", g.body, g.status, want)
		}
		ctx := context.Background()
		if n, err := ts.svc.st.forgetRequests(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("forgetRequests(an hour ago) = %d, %v; want 0", n, err)
		}
		n, err := ts.svc.st.forgetRequests(ctx, time.Now().Add(time.Hour))
		if err != nil || n < 2*recentIDs {
			t.Fatalf("forgetRequests(in an hour) = %d, %v; want at least %d", n, err, 2*recentIDs)
		}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, piv, []byte("mine")); a.status != 412 || a.header.Get(wire.HeaderReplayed) != "" {
			t.Fatalf("after forgetting, the id is new again (a stale PutIfVersion): %d replayed %q", a.status, a.header.Get(wire.HeaderReplayed))
		}
	})
}

// TestGenericVersionsAfterDelete checks the counter a tombstone keeps: a
// key deleted and created again never gets a version it had before, and
// an old version never matches the new key.
func TestGenericVersionsAfterDelete(t *testing.T) {
	forEachGenericBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		tok := ts.tokens["alpha"]
		seen := map[string]bool{}
		var last string
		for i := range 5 {
			v := ts.put(t, "alpha", "k", fmt.Sprintf("v%d", i))
			if seen[v] {
				t.Fatalf("round %d: version %s was given before", i, v)
			}
			seen[v], last = true, v
			if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, reqID(), nil); a.status != 204 {
				t.Fatalf("DELETE: %d", a.status)
			}
		}
		a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, map[string]string{wire.HeaderRequestID: newID(), wire.HeaderIfAbsent: "1"}, []byte("new"))
		if a.status != 204 || seen[a.header.Get(wire.HeaderVersion)] {
			t.Fatalf("PutIfAbsent after the deletes: %d version %q (seen before: %v)", a.status, a.header.Get(wire.HeaderVersion), seen[a.header.Get(wire.HeaderVersion)])
		}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, map[string]string{wire.HeaderRequestID: newID(), wire.HeaderIfVersion: last}, []byte("x")); a.status != 412 {
			t.Fatalf("PutIfVersion with a version of the deleted key: %d, want 412", a.status)
		}
		// Listing skips tombstones.
		if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, reqID(), nil); a.status != 204 {
			t.Fatalf("DELETE: %d", a.status)
		}
		ts.put(t, "alpha", "k2", "x")
		a = ts.do(t, "GET", "/v1/ns/alpha/list?prefix=k", tok, nil, nil)
		if a.status != 200 || strings.Contains(string(a.body), `"key":"k"`) || !strings.Contains(string(a.body), `"key":"k2"`) {
			t.Fatalf("the listing after the delete: %d\n%s", a.status, a.body)
		}
	})
}

// TestGenericKeyLayout checks the backend keys of long names: they fit the
// contract's key limit, differ for different names, and a listing gives
// the names back in order whatever their digests.
func TestGenericKeyLayout(t *testing.T) {
	prefix := kvPrefix(strings.Repeat("n", 63))
	var names []string
	base := strings.Repeat("a", treeHead-1)
	for _, tail := range []string{"", "b", "é", "éz", "b" + strings.Repeat("z", 200), "c", "bb", "ba"} {
		names = append(names, base+tail, base+"x"+tail, base+"é"+tail)
	}
	names = append(names, strings.Repeat("k", kv.MaxKeyLength), strings.Repeat("é", kv.MaxKeyLength/2))
	seen := map[string]string{}
	for _, n := range names {
		if len(n) > kv.MaxKeyLength {
			continue
		}
		bk, digested := treeKey(prefix, n)
		if err := kv.ValidateKey(bk); err != nil {
			t.Fatalf("the backend key of a %d-byte name: %v", len(n), err)
		}
		if other, dup := seen[bk]; dup && other != n {
			t.Fatalf("two names share the backend key %q", bk)
		}
		seen[bk] = n
		if got, whole := treeName(bk[len(prefix):]); whole != !digested || whole && got != n {
			t.Fatalf("treeName(%q) = %q, %v; treeKey said digested=%v", bk, got, whole, digested)
		}
	}
	ts := newTestService(t, Options{Backend: "mem://"}, "alpha")
	var want []string
	for _, n := range names {
		if len(n) <= kv.MaxKeyLength && !slices.Contains(want, n) {
			ts.put(t, "alpha", n, "v")
			want = append(want, n)
		}
	}
	slices.Sort(want)
	rows, _, err := ts.svc.st.list(context.Background(), "alpha", "", "", 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.key)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the listing is not in name order:\n got %q\nwant %q", got, want)
	}
	// From the middle of a digested group, and with a prefix past the head.
	rows, _, err = ts.svc.st.list(context.Background(), "alpha", base+"b", want[3], 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	var tail []string
	for _, n := range want {
		if strings.HasPrefix(n, base+"b") && n > want[3] {
			tail = append(tail, n)
		}
	}
	got = got[:0]
	for _, r := range rows {
		got = append(got, r.key)
	}
	if !slices.Equal(got, tail) {
		t.Fatalf("the listing after %q with prefix …b:\n got %q\nwant %q", want[3], got, tail)
	}
	// From every name, and one page of one name at a time: the backend
	// listing starts at the cursor, before the head group of a digested
	// name, and skips none of the group.
	for i, from := range want {
		rows, _, err := ts.svc.st.list(context.Background(), "alpha", "", from, 1000, false)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, r := range rows {
			got = append(got, r.key)
		}
		if !slices.Equal(got, want[i+1:]) {
			t.Fatalf("the listing after name %d (%d bytes):\n got %d names %q\nwant %d", i, len(from), len(got), got, len(want)-i-1)
		}
	}
	got = got[:0]
	for after := ""; ; {
		rows, more, err := ts.svc.st.list(context.Background(), "alpha", "", after, 1, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			got = append(got, r.key)
			after = r.key
		}
		if !more || len(rows) == 0 {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paging one name at a time:\n got %q\nwant %q", got, want)
	}
}

// TestGenericMemoryJournal appends across several listing blocks and
// reads the journal back in pages, and resends an early append.
func TestGenericMemoryJournal(t *testing.T) {
	forEachGenericBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		ctx := context.Background()
		st := ts.svc.st
		const n = memBlock + 40
		firstID := newID()
		for i := 1; i <= n; i++ {
			id := newID()
			if i == 1 {
				id = firstID
			}
			seq, replayed, err := st.appendMemory(ctx, "alpha", "support", id, []byte(fmt.Sprintf(`{"i":%d}`, i)))
			if err != nil || seq != int64(i) || replayed {
				t.Fatalf("append %d: seq %d replayed %v, %v", i, seq, replayed, err)
			}
		}
		if seq, replayed, err := st.appendMemory(ctx, "alpha", "support", firstID, []byte(`{"i":1}`)); err != nil || seq != 1 || !replayed {
			t.Fatalf("the first append resent %d appends later: seq %d replayed %v, %v; want 1, replayed", n, seq, replayed, err)
		}
		if _, _, err := st.appendMemory(ctx, "alpha", "other", newID(), []byte(`{"other":true}`)); err != nil {
			t.Fatal(err)
		}
		var after int64
		for page := 0; ; page++ {
			recs, more, err := st.listMemory(ctx, "alpha", "support", after, 97)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				after++
				if r.seq != after || string(r.record) != fmt.Sprintf(`{"i":%d}`, after) {
					t.Fatalf("page %d: record %d holds %s, want %d", page, r.seq, r.record, after)
				}
			}
			if !more {
				break
			}
		}
		if after != n {
			t.Fatalf("the journal lists %d records, want %d", after, n)
		}
		if recs, more, err := st.listMemory(ctx, "alpha", "support", n, 10); err != nil || len(recs) != 0 || more {
			t.Fatalf("after the last record: %d records, more %v, %v", len(recs), more, err)
		}
	})
}

// TestLateCopiesOfWritesThatChangedNothing sends a copy of a PutIfAbsent
// that lost and of a delete of a missing key again after the key changed:
// the copies get the first outcome and change nothing, as a delayed copy
// must once its client has been answered.
func TestLateCopiesOfWritesThatChangedNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		tok := ts.tokens["alpha"]
		ts.put(t, "alpha", "k", "first")
		pia := map[string]string{wire.HeaderRequestID: newID(), wire.HeaderIfAbsent: "1"}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, pia, []byte("late")); a.status != 412 || a.err.Code != wire.CodeExists {
			t.Fatalf("PutIfAbsent on a key that exists: %d %+v", a.status, a.err)
		}
		if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, reqID(), nil); a.status != 204 {
			t.Fatalf("DELETE: %d", a.status)
		}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, pia, []byte("late")); a.status != 412 || a.err.Code != wire.CodeExists || a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("a late copy of the lost PutIfAbsent, after the key was deleted: %d %+v replayed %q; want its first outcome, exists",
				a.status, a.err, a.header.Get(wire.HeaderReplayed))
		}
		if g := ts.do(t, "GET", kvPath("alpha", "k"), tok, nil, nil); g.status != 404 {
			t.Fatalf("the late copy created the key: %d %q", g.status, g.body)
		}
		del := map[string]string{wire.HeaderRequestID: newID()}
		if a := ts.do(t, "DELETE", kvPath("alpha", "never"), tok, del, nil); a.status != 204 {
			t.Fatalf("DELETE of a missing key: %d", a.status)
		}
		ts.put(t, "alpha", "never", "created since")
		if a := ts.do(t, "DELETE", kvPath("alpha", "never"), tok, del, nil); a.status != 204 || a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("a late copy of the delete: %d replayed %q", a.status, a.header.Get(wire.HeaderReplayed))
		}
		if g := ts.do(t, "GET", kvPath("alpha", "never"), tok, nil, nil); string(g.body) != "created since" {
			t.Fatalf("the late copy of the delete removed a key created since: %d %q", g.status, g.body)
		}
	})
}
