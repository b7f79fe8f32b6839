package kvtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/kv"
)

// storeChecks are the checks of the core group.
func storeChecks() []check {
	return []check{
		{"GetMissingKeyIsNotFound", "Get returns an error matching kv.ErrNotFound when the key does not exist, and only then", needRead, checkGetMissing},
		{"EmptyValueIsNotMissing", "a stored empty value reads back as empty with a nil error, distinct from a missing key", needRead, checkEmptyValue},
		{"PutCreatesAndOverwrites", "Put creates or overwrites the key with exactly the new value", needRead, checkPutOverwrites},
		{"ValuesAreCopied", "the store keeps its own copy of a value: changing the caller's slice after Put or after Get changes nothing stored", needRead, checkValuesCopied},
		{"DeleteOfMissingKeySucceeds", "Delete of a missing key is not an error, and Delete removes only its key", needDelete, checkDelete},
		{"ListIsCompleteOrderedAndOnce", "List and ListKeys return every key that starts with the prefix, in ascending bytewise order, each exactly once", needKeys, checkListBasics},
		{"ListYieldsCurrentValues", "List yields each key with its current value", needList, checkListValues},
		{"ListEmptyPrefixIsNamespaceOnly", "the empty prefix lists everything in the store's namespace and nothing else", needKeys, checkListNamespace},
		{"ListManyKeys", "List and ListKeys return every key that starts with the prefix, in ascending bytewise order, each exactly once, with many keys and nested prefixes", needKeys, checkListMany},
		{"ListAfterStartsAfterThePoint", "ListAfter and ListKeysAfter yield what List and ListKeys would, minus the keys at or before the point, whether the point is a stored key or not, and paging by them visits every key once even when the page's last key is deleted between pages", needKeys, checkListAfter},
		{"ListSeesKeysDespiteConcurrentWrites", "a key that existed before List began and was not deleted during it is returned, while other goroutines write", needKeys, checkListConcurrent},
		{"EncoderCharacterKeys", "keys using every character the key encoder emits (letters, digits, - _ . ! ~ * ' ( ) % / :) are stored, read back and listed apart", needKeys, checkWeirdKeys},
		{"PathLikeKeysKeptApart", "x and x/y, a/, a/b, a/bc and ab are distinct keys that can all exist at once", needRead, checkKeysApart},
		{"LongKeys", "keys of kv.MaxKeyLength bytes and long segments (256 bytes, sha256: digests) are stored intact and kept apart", needKeys, checkLongKeys},
		{"AnyValidUTF8Key", "every key *kv.DB accepts (valid UTF-8 without NUL) is stored, read back and listed in bytewise order", needKeys, checkUTF8Keys},
		{"LargeValues", "values of at least 1 MiB round-trip byte for byte; past a documented limit the driver returns kv.ErrTooLarge and never truncates", needRead, checkLargeValues},
		{"BinaryValues", "binary values (NUL, 0xff, every byte value, invalid UTF-8) round-trip byte for byte", needRead, checkBinaryValues},
		{"CanceledContext", "every operation honours ctx cancellation and deadlines: it fails with an error matching ctx.Err() and does not write", 0, checkCanceled},
		{"CancelInFlight", "operations in flight return promptly once ctx is canceled, with an error matching context.Canceled", 0, checkCancelInFlight},
		{"ErrorsNameDriverAndKey", "errors name the driver and the key, never the value", needRead, checkErrorMessages},
	}
}

func checkGetMissing(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	wantMissing(t, db, "never-written")
	put(t, db, "x/y", []byte("v"))
	put(t, db, "Case", []byte("v"))
	for _, k := range []string{"x", "x/", "x/y/", "x/y/z", "x/y ", "X/Y", "case", "CASE", "Cas", "Case/"} {
		wantMissing(t, db, k)
	}
	if v, err := read(ctx, db, "x/y"); err != nil || string(v) != "v" {
		t.Errorf("reading existing key %q: got %s, %v; want \"v\" and no error", "x/y", describe(v), err)
	}
	if s.caps.Get {
		if _, err := db.Get(ctx, "still-missing"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("Get(%q) of a missing key: got %v, want an error matching kv.ErrNotFound", "still-missing", err)
		}
	}
	if s.caps.CAS {
		if _, ver, err := db.GetWithVersion(ctx, "still-missing"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("GetWithVersion(%q) of a missing key: got version %q and %v, want an error matching kv.ErrNotFound", "still-missing", ver, err)
		}
	}
}

func checkEmptyValue(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	put(t, db, "empty", []byte{})
	put(t, db, "nil", nil)
	for _, k := range []string{"empty", "nil"} {
		v, err := read(ctx, db, k)
		if err != nil {
			t.Errorf("reading %q, which holds an empty value: got %v, want the empty value and no error", k, err)
		} else if len(v) != 0 {
			t.Errorf("reading %q, which holds an empty value: got %s", k, describe(v))
		}
	}
	wantMissing(t, db, "never-written")
	if s.caps.Get && s.caps.CAS {
		if _, ver, err := db.GetWithVersion(ctx, "empty"); err != nil || ver == "" {
			t.Errorf("GetWithVersion of an empty value: got version %q and %v, want a version and no error", ver, err)
		}
	}
	if s.caps.CAS {
		if _, err := db.PutIfAbsent(ctx, "empty", []byte("x")); !errors.Is(err, kv.ErrConflict) {
			t.Errorf("PutIfAbsent on a key holding an empty value: got %v, want kv.ErrConflict (an empty value exists)", err)
		}
		if _, err := db.PutIfAbsent(ctx, "cas-empty", nil); err != nil {
			t.Fatalf("PutIfAbsent(%q, empty): %v", "cas-empty", err)
		}
		wantValue(t, db, "cas-empty", []byte{})
	}
	if s.caps.List || s.caps.CAS {
		wantKeys(t, "ListKeys(\"\") of two empty values", listKeys(t, db, ""), ifCAS(s, []string{"empty", "nil"}, "cas-empty"))
	}
	if s.caps.List {
		for _, e := range listEntries(t, db, "") {
			if len(e.Value) != 0 {
				t.Errorf("List yielded %q with %s, want the empty value", e.Key, describe(e.Value))
			}
		}
	}
	// Empty, then not, then empty again.
	put(t, db, "empty", []byte("x"))
	wantValue(t, db, "empty", []byte("x"))
	put(t, db, "empty", nil)
	wantValue(t, db, "empty", []byte{})
}

func ifCAS(s *suite, keys []string, more ...string) []string {
	if s.caps.CAS {
		return append(keys, more...)
	}
	return keys
}

func checkPutOverwrites(t testing.TB, s *suite) {
	db := s.store(t)
	put(t, db, "k", []byte("first"))
	wantValue(t, db, "k", []byte("first"))
	long := []byte(strings.Repeat("long value ", 100))
	for _, v := range [][]byte{[]byte("second"), long, []byte("s"), []byte("second"), long[:500], {}, []byte("last")} {
		put(t, db, "k", v)
		wantValue(t, db, "k", v) // a shorter value must not keep the tail of a longer one
	}
	// Other keys are untouched by an overwrite.
	put(t, db, "k2", []byte("other"))
	put(t, db, "k", []byte("again"))
	wantValue(t, db, "k2", []byte("other"))
}

func checkValuesCopied(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	buf := []byte("original")
	put(t, db, "k", buf)
	copy(buf, "MUTATED!")
	wantValue(t, db, "k", []byte("original"))
	got := mustRead(t, db, "k")
	if len(got) > 0 {
		got[0] = 'X'
	}
	wantValue(t, db, "k", []byte("original"))
	if s.caps.CAS {
		buf := []byte("cas value")
		ver, err := db.PutIfAbsent(ctx, "c", buf)
		if err != nil {
			t.Fatalf("PutIfAbsent: %v", err)
		}
		copy(buf, "MUTATED!!")
		wantValue(t, db, "c", []byte("cas value"))
		buf = []byte("cas value 2")
		if _, err := db.PutIfVersion(ctx, "c", buf, ver); err != nil {
			t.Fatalf("PutIfVersion: %v", err)
		}
		copy(buf, "MUTATED!!!!")
		wantValue(t, db, "c", []byte("cas value 2"))
	}
	if s.caps.List {
		for _, e := range listEntries(t, db, "") {
			for i := range e.Value {
				e.Value[i] = '!'
			}
		}
		wantValue(t, db, "k", []byte("original"))
	}
}

func checkDelete(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	for range 2 {
		if err := db.Delete(ctx, "never-written"); err != nil {
			t.Errorf("Delete of a missing key: %v; want no error", err)
		}
	}
	put(t, db, "k", []byte("v"))
	put(t, db, "k/child", []byte("child"))
	put(t, db, "k2", []byte("v2"))
	if err := db.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete of an existing key: %v", err)
	}
	if err := db.Delete(ctx, "k"); err != nil {
		t.Errorf("Delete of a key already deleted: %v; want no error", err)
	}
	if s.has(needRead) {
		wantMissing(t, db, "k")
		wantValue(t, db, "k/child", []byte("child"))
		wantValue(t, db, "k2", []byte("v2"))
	}
	if s.has(needKeys) {
		wantKeys(t, "ListKeys(\"\") after deleting k", listKeys(t, db, ""), []string{"k/child", "k2"})
	}
	// Re-create after delete.
	put(t, db, "k", []byte("again"))
	if s.has(needRead) {
		wantValue(t, db, "k", []byte("again"))
	}
}

// listCorpus are keys whose prefixes nest and touch: a/b beside a/bc, SQL
// LIKE wildcards, case, and a key that is itself a prefix.
var listCorpus = []string{
	"p", "p/", "p/a", "p/a/", "p/a/b", "p/a/b/c", "p/a/bc", "p/a/b/c/d/e/f", "p/ab", "p/b", "p/b/",
	"p/A", "p/a_c", "p/abc", "p/a%c", "p/aXc", "p/a.b", "p/a-b", "p/a~", "p/a:b", "p/a(b)", "p/a!",
	"o", "q", "pp", "p0", "P/a",
}

var listPrefixes = []string{
	"", "p", "p/", "p/a", "p/a/", "p/a/b", "p/a/b/", "p/a/b/c/d/e/f", "p/a/b/c/d/e/f/",
	"p/a_", "p/a%", "p/A", "P", "p/z", "zzz", "p/a.", "p/a:",
}

// shuffled returns keys in a fixed pseudo-random order, so the order of
// writes never matches the order a listing must return.
func shuffled(keys []string) []string {
	out := slices.Clone(keys)
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func withPrefix(keys []string, prefix string) []string {
	var out []string
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

func valueFor(key string) []byte { return []byte("v:" + key) }

func checkListBasics(t testing.TB, s *suite) {
	db := s.store(t)
	if got := listKeys(t, db, ""); len(got) != 0 {
		t.Errorf("ListKeys(\"\") of a fresh namespace: got %s, want nothing", sample(got))
	}
	for _, k := range shuffled(listCorpus) {
		put(t, db, k, valueFor(k))
	}
	for _, p := range listPrefixes {
		want := withPrefix(listCorpus, p)
		wantKeys(t, fmt.Sprintf("ListKeys(%q)", p), listKeys(t, db, p), want)
		if s.caps.List {
			var got []string
			for _, e := range listEntries(t, db, p) {
				got = append(got, e.Key)
			}
			wantKeys(t, fmt.Sprintf("List(%q)", p), got, want)
		}
	}
}

func checkListValues(t testing.TB, s *suite) {
	db := s.store(t)
	for _, k := range shuffled(listCorpus) {
		put(t, db, k, valueFor(k))
	}
	put(t, db, "p/a", []byte("overwritten"))
	for _, e := range listEntries(t, db, "p/") {
		want := valueFor(e.Key)
		if e.Key == "p/a" {
			want = []byte("overwritten")
		}
		if !bytesEqual(e.Value, want) {
			t.Errorf("List(%q) yielded %q with %s, want %s", "p/", e.Key, describe(e.Value), describe(want))
		}
	}
}

func checkListNamespace(t testing.TB, s *suite) {
	a := s.store(t)
	b := s.store(t)
	if got := listKeys(t, a, ""); len(got) != 0 {
		t.Fatalf("ListKeys(\"\") of a fresh namespace: got %s, want nothing (is NewNamespace returning a used namespace?)", sample(got))
	}
	aKeys := []string{"shared", "shared/x", "only-a", "a/1"}
	bKeys := []string{"shared", "shared/y", "only-b", "b/1"}
	for _, k := range aKeys {
		put(t, a, k, []byte("a"))
	}
	for _, k := range bKeys {
		put(t, b, k, []byte("b"))
	}
	wantKeys(t, "ListKeys(\"\") of namespace A", listKeys(t, a, ""), aKeys)
	wantKeys(t, "ListKeys(\"\") of namespace B", listKeys(t, b, ""), bKeys)
	wantKeys(t, "ListKeys(\"shared\") of namespace A", listKeys(t, a, "shared"), []string{"shared", "shared/x"})
	if s.caps.List {
		for _, e := range listEntries(t, a, "") {
			if string(e.Value) != "a" {
				t.Errorf("List(\"\") of namespace A yielded %q with %s, a value of namespace B", e.Key, describe(e.Value))
			}
		}
	}
	if s.has(needRead) {
		wantValue(t, a, "shared", []byte("a"))
		wantMissing(t, a, "only-b")
	}
}

// manyKey names key i of the large listing: four families whose prefixes
// nest (many/n/ inside many/n, beside many/nx/).
func manyKey(i int) string {
	switch i % 4 {
	case 0:
		return fmt.Sprintf("many/%07d", i)
	case 1:
		return fmt.Sprintf("many/n/%07d", i)
	case 2:
		return fmt.Sprintf("many/n/m/%07d", i)
	default:
		return fmt.Sprintf("many/nx/%07d", i)
	}
}

func checkListMany(t testing.TB, s *suite) {
	db := s.store(t)
	n := s.h.ManyKeys
	keys := make([]string, n)
	for i := range keys {
		keys[i] = manyKey(i)
	}
	putAll(t, db, shuffled(keys), valueFor)
	put(t, db, "other", []byte("outside the prefix"))
	for _, p := range []string{"many/", "many/n", "many/n/", "many/n/m/", "many/nx/", "many/0"} {
		wantKeys(t, fmt.Sprintf("ListKeys(%q) over %d keys", p, n), listKeys(t, db, p), withPrefix(keys, p))
	}
	wantKeys(t, fmt.Sprintf("ListKeys(\"\") over %d keys", n+1), listKeys(t, db, ""), append(slices.Clone(keys), "other"))
	if s.caps.List {
		var got []string
		bad := 0
		for _, e := range listEntries(t, db, "many/") {
			got = append(got, e.Key)
			if !bytesEqual(e.Value, valueFor(e.Key)) {
				if bad++; bad <= 3 {
					t.Errorf("List(%q) yielded %q with %s, want %s", "many/", e.Key, describe(e.Value), describe(valueFor(e.Key)))
				}
			}
		}
		wantKeys(t, fmt.Sprintf("List(%q) over %d keys", "many/", n), got, keys)
	}
	// A caller may stop early; the store must stay usable.
	seen := 0
	for _, err := range db.ListKeys(t.Context(), "many/") {
		if err != nil {
			t.Fatalf("ListKeys: %v", err)
		}
		if seen++; seen == 3 {
			break
		}
	}
	put(t, db, "after-break", []byte("ok"))
	wantKeys(t, "ListKeys(\"after\") after breaking out of a listing", listKeys(t, db, "after"), []string{"after-break"})
}

// afterKeys are the keys of the start-after check: nested prefixes,
// multi-byte runes and characters that sort around '/'.
var afterKeys = []string{
	"la/", "la/-", "la/.", "la/0", "la/a", "la/a/", "la/a/b", "la/a/b/c", "la/a~",
	"la/aa", "la/b", "la/b/a", "la/z", "la/~", "la/\u00e9", "la/\u00e9/x", "la/\u4e16", "la/\U0001F600",
}

func checkListAfter(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	putAll(t, db, shuffled(afterKeys), valueFor)
	put(t, db, "la", []byte("the prefix without its slash"))
	put(t, db, "lb/a", []byte("outside"))
	put(t, db, "l", []byte("outside"))

	points := []string{"", "a", "l", "la", "la/", "la/\x01", "la/a0", "la/a/a", "la/a/b/", "la/b/", "la/\u00e9\u00e9",
		"la/\U0010FFFF", "la0", "lb", "lb/a", "z"}
	for _, k := range afterKeys {
		r := []rune(k)
		points = append(points, k, string(r[:len(r)-1])+"\x01")
	}
	for _, prefix := range []string{"la/", "la/a", "la/a/", ""} {
		all := listKeys(t, db, prefix)
		for _, after := range points {
			var want []string
			for _, k := range all {
				if k > after {
					want = append(want, k)
				}
			}
			what := fmt.Sprintf("ListKeysAfter(%q, %q)", prefix, after)
			var got []string
			for k, err := range db.ListKeysAfter(ctx, prefix, after) {
				if err != nil {
					t.Fatalf("%s failed after %d keys: %v", what, len(got), err)
				}
				got = append(got, k)
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s", what, diffKeys(got, want))
			}
			if !s.caps.List {
				continue
			}
			what = fmt.Sprintf("ListAfter(%q, %q)", prefix, after)
			got = got[:0]
			for e, err := range db.ListAfter(ctx, prefix, after) {
				if err != nil {
					t.Fatalf("%s failed after %d entries: %v", what, len(got), err)
				}
				got = append(got, e.Key)
				if strings.HasPrefix(e.Key, "la/") && !bytesEqual(e.Value, valueFor(e.Key)) {
					t.Errorf("%s yielded %q with %s, want %s", what, e.Key, describe(e.Value), describe(valueFor(e.Key)))
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s", what, diffKeys(got, want))
			}
		}
	}

	// Paging: a page of three, then the next from the page's last key,
	// which is deleted before every second page is asked for. Every key
	// that was there all along is visited once, in order.
	keys := make([]string, min(s.h.ManyKeys, 300))
	for i := range keys {
		keys[i] = fmt.Sprintf("pg/%05d", i)
	}
	putAll(t, db, shuffled(keys), valueFor)
	var seen, deleted []string
	after, pages := "", 0
	for {
		page := 0
		for k, err := range db.ListKeysAfter(ctx, "pg/", after) {
			if err != nil {
				t.Fatalf("ListKeysAfter(%q, %q) on page %d: %v", "pg/", after, pages, err)
			}
			seen = append(seen, k)
			after = k
			if page++; page == 3 {
				break
			}
		}
		if page == 0 {
			break
		}
		if pages++; pages%2 == 0 && s.caps.Delete {
			if err := db.Delete(ctx, after); err != nil {
				t.Fatalf("Delete(%q) between pages: %v", after, err)
			}
			deleted = append(deleted, after)
		}
		if pages > len(keys) {
			t.Fatalf("paging %d keys by three took more than %d pages: the listing does not move past its point", len(keys), pages)
		}
	}
	wantKeys(t, fmt.Sprintf("paging %d keys by ListKeysAfter, three at a time", len(keys)), seen, keys)
	remaining := listKeys(t, db, "pg/")
	if want := len(keys) - len(deleted); len(remaining) != want {
		t.Errorf("after paging and deleting %d page ends, ListKeys(%q) has %d keys, want %d", len(deleted), "pg/", len(remaining), want)
	}
}

func checkListConcurrent(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	n := min(s.h.ManyKeys, 2000)
	seeded := make([]string, n)
	for i := range seeded {
		seeded[i] = fmt.Sprintf("c/%06d", i)
	}
	putAll(t, db, seeded, valueFor)
	seededSet := make(map[string]bool, n)
	for _, k := range seeded {
		seededSet[k] = true
	}

	const writers, maxWrites = 4, 2000
	var (
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		started sync.WaitGroup
		werr    atomic.Value
	)
	started.Add(writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []string
			first := true
			// Bounded, so a backend without Delete does not fill up.
			for i := range maxWrites {
				if !first {
					select {
					case <-stop:
						return
					default:
					}
				}
				// A new key sorting between two seeded ones, an overwrite
				// of a seeded key, and the delete of an earlier new key.
				nk := fmt.Sprintf("c/%06d-w%d-%d", r.IntN(n), w, i)
				err := db.Put(ctx, nk, []byte("new"))
				if err == nil {
					mine = append(mine, nk)
					err = db.Put(ctx, seeded[r.IntN(n)], []byte("overwritten"))
				}
				if err == nil && s.caps.Delete && len(mine) > 2 {
					err = db.Delete(ctx, mine[0])
					mine = mine[1:]
				}
				if err != nil {
					werr.CompareAndSwap(nil, err)
				}
				if first {
					started.Done()
					first = false
				}
				if err != nil {
					return
				}
			}
		}()
	}
	started.Wait()
	defer func() {
		close(stop)
		wg.Wait()
		if err, ok := werr.Load().(error); ok {
			t.Errorf("a concurrent writer failed: %v", err)
		}
	}()
	for round := range 3 {
		got := listKeys(t, db, "c/")
		count := 0
		var odd []string
		for _, k := range got {
			switch {
			case seededSet[k]:
				count++
			case !strings.Contains(k, "-w"):
				odd = append(odd, k)
			}
		}
		if count != n {
			var missing []string
			have := make(map[string]bool, len(got))
			for _, k := range got {
				have[k] = true
			}
			for _, k := range seeded {
				if !have[k] {
					missing = append(missing, k)
				}
			}
			t.Errorf("listing %d while others write: %d of %d keys that existed before the listing were returned; missing %s", round, count, n, sample(missing))
		}
		if len(odd) > 0 {
			t.Errorf("listing %d while others write: keys never written: %s", round, sample(odd))
		}
		if s.caps.List {
			for _, e := range listEntries(t, db, "c/") {
				if seededSet[e.Key] && string(e.Value) != "overwritten" && !bytesEqual(e.Value, valueFor(e.Key)) {
					t.Errorf("listing %d while others write: %q has %s, a value never written", round, e.Key, describe(e.Value))
					break
				}
			}
		}
	}
}

// roundTripKeys writes every key, reads each back when it can, and lists
// them, also under the prefixes the keys' characters make.
func roundTripKeys(t testing.TB, s *suite, keys []string, prefixes []string) {
	t.Helper()
	db := s.store(t)
	for _, k := range shuffled(keys) {
		if err := db.Put(t.Context(), k, valueFor(k)); err != nil {
			t.Errorf("Put(%q): %v", k, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if s.has(needRead) {
		for _, k := range keys {
			wantValue(t, db, k, valueFor(k))
		}
	}
	wantKeys(t, "ListKeys(\"\")", listKeys(t, db, ""), keys)
	if s.caps.List {
		for _, e := range listEntries(t, db, "") {
			if !bytesEqual(e.Value, valueFor(e.Key)) {
				t.Errorf("List(\"\") yielded %q with %s, want %s", e.Key, describe(e.Value), describe(valueFor(e.Key)))
			}
		}
	}
	for _, p := range prefixes {
		wantKeys(t, fmt.Sprintf("ListKeys(%q)", p), listKeys(t, db, p), withPrefix(keys, p))
	}
	if s.caps.CAS {
		// Conditional writes on the same keys.
		for _, k := range keys {
			_, ver, err := db.GetWithVersion(t.Context(), k)
			if err != nil {
				t.Errorf("GetWithVersion(%q): %v", k, err)
				continue
			}
			if _, err := db.PutIfVersion(t.Context(), k, []byte("cas:"+k), ver); err != nil {
				t.Errorf("PutIfVersion(%q) with its current version: %v", k, err)
			}
			if _, err := db.PutIfAbsent(t.Context(), k, []byte("x")); !errors.Is(err, kv.ErrConflict) {
				t.Errorf("PutIfAbsent(%q) on an existing key: got %v, want kv.ErrConflict", k, err)
			}
		}
	}
	if s.caps.Delete {
		for _, k := range keys {
			if err := db.Delete(t.Context(), k); err != nil {
				t.Errorf("Delete(%q): %v", k, err)
			}
		}
		if got := listKeys(t, db, ""); len(got) != 0 {
			t.Errorf("ListKeys(\"\") after deleting every key: got %s, want nothing", sample(got))
		}
	}
}

func checkWeirdKeys(t testing.TB, s *suite) {
	var prefixes []string
	for _, c := range EncoderChars {
		prefixes = append(prefixes, string(c), "k"+string(c), string(c)+string(c))
	}
	prefixes = append(prefixes, "a_", "a%", "a/", "agentkit/v1/", "Key", "key", "x.", "%2", "sha256:")
	roundTripKeys(t, s, WeirdKeys(), prefixes)
}

func checkLongKeys(t testing.TB, s *suite) {
	keys := LongKeys()
	long := strings.Repeat("k", kv.MaxKeyLength-1)
	roundTripKeys(t, s, keys, []string{long, "agentkit/v1/agent/kv/", "agentkit/v1/agent/kv/sha256:", "seg/seg/", keys[3][:kv.MaxKeyLength-1]})
}

func checkUTF8Keys(t testing.TB, s *suite) {
	roundTripKeys(t, s, UTF8Keys(), []string{"h", "é", "日本語/", "\x01", " ", "e"})
}

func checkKeysApart(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	// Written in both orders: parent first (x, then x/y) and child first
	// (y/z, then y), because a store mapping keys to paths or objects may
	// refuse one of them.
	keys := []string{"x", "x/y", "x/y/z", "y/z", "y", "a/", "a/b", "a/bc", "ab", "a", "a//", "b/", "b"}
	for _, k := range keys {
		if err := db.Put(ctx, k, valueFor(k)); err != nil {
			t.Errorf("Put(%q) beside %s: %v", k, sample(without(keys, k)), err)
		}
	}
	for _, k := range keys {
		wantValue(t, db, k, valueFor(k))
	}
	for _, k := range []string{"x/", "x/y/", "a/b/", "y/", "c", "a/b/c"} {
		wantMissing(t, db, k)
	}
	if s.has(needKeys) {
		wantKeys(t, "ListKeys(\"\")", listKeys(t, db, ""), keys)
		wantKeys(t, "ListKeys(\"a/b\")", listKeys(t, db, "a/b"), []string{"a/b", "a/bc"})
		wantKeys(t, "ListKeys(\"a/b/\")", listKeys(t, db, "a/b/"), nil)
		wantKeys(t, "ListKeys(\"x/\")", listKeys(t, db, "x/"), []string{"x/y", "x/y/z"})
	}
	if !s.caps.Delete {
		return
	}
	for _, k := range []string{"x", "a/", "y/z"} {
		if err := db.Delete(ctx, k); err != nil {
			t.Fatalf("Delete(%q): %v", k, err)
		}
		wantMissing(t, db, k)
	}
	for _, k := range []string{"x/y", "x/y/z", "a/b", "a", "ab", "y"} {
		wantValue(t, db, k, valueFor(k))
	}
	put(t, db, "x", []byte("back"))
	wantValue(t, db, "x", []byte("back"))
	wantValue(t, db, "x/y", valueFor("x/y"))
}

func without(keys []string, k string) []string {
	return slices.DeleteFunc(slices.Clone(keys), func(s string) bool { return s == k })
}

// randomBytes returns n bytes from a fixed seed, starting with NUL and
// ending with 0xff.
func randomBytes(n int, seed uint64) []byte {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'k', 'v'})
	b := make([]byte, n)
	_, _ = r.Read(b)
	if n > 0 {
		b[0] = 0
		b[n-1] = 0xff
	}
	return b
}

// MiB is the value size every driver must store: 1 MiB.
const MiB = 1 << 20

func checkLargeValues(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	limit := s.h.MaxValueSize
	size := MiB
	if limit > 0 && limit < size {
		size = limit
		t.Logf("the driver documents a %d-byte limit; checking values of that size", limit)
	}
	big := randomBytes(size, 1)
	put(t, db, "big", big)
	wantValue(t, db, "big", big)
	big2 := randomBytes(size, 2)
	put(t, db, "big", big2)
	wantValue(t, db, "big", big2)
	if s.caps.List {
		for _, e := range listEntries(t, db, "big") {
			if !bytesEqual(e.Value, big2) {
				t.Errorf("List yielded %q with %s, want the %d-byte value written", e.Key, describe(e.Value), size)
			}
		}
	}
	if s.caps.CAS {
		ver, err := db.PutIfAbsent(ctx, "big-cas", big)
		if err != nil {
			t.Fatalf("PutIfAbsent of %d bytes: %v", size, err)
		}
		v, ver2, err := db.GetWithVersion(ctx, "big-cas")
		if err != nil || !bytesEqual(v, big) || ver2 != ver {
			t.Errorf("GetWithVersion after a %d-byte PutIfAbsent: got %s, version %q (want %q), %v", size, describe(v), ver2, ver, err)
		}
		if _, err := db.PutIfVersion(ctx, "big-cas", big2, ver); err != nil {
			t.Fatalf("PutIfVersion of %d bytes: %v", size, err)
		}
		wantValue(t, db, "big-cas", big2)
	}
	if limit <= 0 || limit > 16*MiB {
		return
	}
	// Past the limit: ErrTooLarge, nothing stored, nothing truncated.
	over := randomBytes(limit+1, 3)
	err := db.Put(ctx, "big", over)
	if !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("Put of %d bytes, past the documented %d-byte limit: got %v, want an error matching kv.ErrTooLarge", limit+1, limit, err)
	}
	wantValue(t, db, "big", big2)
	if err := db.Put(ctx, "over", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("Put of %d bytes to a new key: got %v, want kv.ErrTooLarge", limit+1, err)
	}
	wantMissing(t, db, "over")
	if s.caps.CAS {
		if _, err := db.PutIfAbsent(ctx, "over-cas", over); !errors.Is(err, kv.ErrTooLarge) {
			t.Errorf("PutIfAbsent of %d bytes: got %v, want kv.ErrTooLarge", limit+1, err)
		}
		wantMissing(t, db, "over-cas")
		_, ver, err := db.GetWithVersion(ctx, "big-cas")
		if err != nil {
			t.Fatalf("GetWithVersion: %v", err)
		}
		if _, err := db.PutIfVersion(ctx, "big-cas", over, ver); !errors.Is(err, kv.ErrTooLarge) {
			t.Errorf("PutIfVersion of %d bytes: got %v, want kv.ErrTooLarge", limit+1, err)
		}
		wantValue(t, db, "big-cas", big2)
	}
}

// binaryValues are values that trip text-minded stores.
func binaryValues() map[string][]byte {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	rev := slices.Clone(all)
	slices.Reverse(rev)
	return map[string][]byte{
		"nul":          {0},
		"ff":           {0xff},
		"all-bytes":    all,
		"all-reversed": rev,
		"nul-inside":   []byte("a\x00b"),
		"nul-run":      make([]byte, 1000),
		"ff-run":       []byte(strings.Repeat("\xff", 1000)),
		"bad-utf8":     {0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1},
		"crlf":         []byte("line\r\nline\n\r"),
		"bom":          {0xef, 0xbb, 0xbf, 'x'},
		"json":         []byte(`{"a":"\u0000"}`),
		"random":       randomBytes(4096, 4),
		"space":        []byte(" "),
	}
}

func checkBinaryValues(t testing.TB, s *suite) {
	db := s.store(t)
	vals := binaryValues()
	for name, v := range vals {
		put(t, db, "bin/"+name, v)
	}
	for name, v := range vals {
		wantValue(t, db, "bin/"+name, v)
	}
	if s.caps.List {
		for _, e := range listEntries(t, db, "bin/") {
			if want := vals[strings.TrimPrefix(e.Key, "bin/")]; !bytesEqual(e.Value, want) {
				t.Errorf("List yielded %q with %s, want %s", e.Key, describe(e.Value), describe(want))
			}
		}
	}
	if s.caps.CAS {
		for name, v := range vals {
			k := "cas/" + name
			ver, err := db.PutIfAbsent(t.Context(), k, v)
			if err != nil {
				t.Fatalf("PutIfAbsent(%q): %v", k, err)
			}
			got, gver, err := db.GetWithVersion(t.Context(), k)
			if err != nil || !bytesEqual(got, v) || gver != ver {
				t.Errorf("GetWithVersion(%q): got %s, version %q (want %q), %v; want %s", k, describe(got), gver, ver, err, describe(v))
			}
		}
	}
}

// rawFuncs returns the driver's own methods, bypassing *kv.DB, so the checks
// can see what the driver itself does with a canceled context.
func rawFuncs(db *kv.DB) kv.Funcs {
	switch b := db.Backend().(type) {
	case kv.Funcs:
		return b
	case *kv.Funcs:
		return *b
	}
	b := db.Backend()
	var f kv.Funcs
	if p, ok := b.(kv.Putter); ok {
		f.Put = p.Put
	}
	if g, ok := b.(kv.Getter); ok {
		f.Get = g.Get
	}
	if d, ok := b.(kv.Deleter); ok {
		f.Delete = d.Delete
	}
	if l, ok := b.(kv.Lister); ok {
		f.List = l.List
	}
	if c, ok := b.(kv.CAS); ok {
		f.CAS = kv.CASFuncsOf(c)
	}
	return f
}

func checkCanceled(t testing.TB, s *suite) {
	db := s.store(t)
	put(t, db, "exists", []byte("v"))
	put(t, db, "exists2", []byte("v"))
	var ver kv.Version
	if s.caps.CAS {
		var err error
		if _, ver, err = db.GetWithVersion(t.Context(), "exists"); err != nil {
			t.Fatalf("GetWithVersion: %v", err)
		}
	}
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	expired, cancel2 := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel2()

	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{canceled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		ctx, want := c.ctx, c.want
		wantErr := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, want) {
				t.Errorf("%s with a context that ended (%v): got %v, want an error matching %v", op, want, err, want)
			}
		}
		wantErr("Put", db.Put(ctx, "canceled", []byte("v")))
		if s.caps.Get {
			_, err := db.Get(ctx, "exists")
			wantErr("Get", err)
		}
		if s.caps.Delete {
			wantErr("Delete", db.Delete(ctx, "exists"))
		}
		if s.caps.List {
			var err error
			for _, err = range db.List(ctx, "") {
				if err != nil {
					break
				}
			}
			wantErr("List", err)
		}
		if s.caps.List || s.caps.CAS {
			var err error
			for _, err = range db.ListKeys(ctx, "") {
				if err != nil {
					break
				}
			}
			wantErr("ListKeys", err)
		}
		if s.caps.CAS {
			_, _, err := db.GetWithVersion(ctx, "exists")
			wantErr("GetWithVersion", err)
			_, err = db.PutIfAbsent(ctx, "canceled", []byte("v"))
			wantErr("PutIfAbsent", err)
			_, err = db.PutIfVersion(ctx, "exists", []byte("v2"), ver)
			wantErr("PutIfVersion", err)
		}
	}

	// The driver itself, below *kv.DB: an operation under a canceled
	// context fails and writes nothing.
	raw := rawFuncs(db)
	ctx := canceled
	if err := raw.Put(ctx, "canceled-raw", []byte("v")); err == nil {
		t.Errorf("the driver's Put returned no error for a canceled context")
	}
	if raw.Get != nil {
		if v, err := raw.Get(ctx, "exists"); err == nil {
			t.Errorf("the driver's Get returned %s and no error for a canceled context", describe(v))
		}
	}
	if raw.Delete != nil {
		if err := raw.Delete(ctx, "exists2"); err == nil {
			t.Errorf("the driver's Delete returned no error for a canceled context")
		}
	}
	if raw.List != nil {
		var last error
		n := 0
		for _, err := range raw.List(ctx, "") {
			n++
			if last = err; err != nil {
				break
			}
		}
		if last == nil {
			t.Errorf("the driver's List under a canceled context ended after %d entries without an error; a caller would take a partial listing for a complete one", n)
		}
	}
	if raw.CAS.PutIfAbsent != nil {
		if _, err := raw.CAS.PutIfAbsent(ctx, "canceled-raw-cas", []byte("v")); err == nil {
			t.Errorf("the driver's PutIfAbsent returned no error for a canceled context")
		}
		if _, err := raw.CAS.PutIfVersion(ctx, "exists", []byte("v2"), ver); err == nil {
			t.Errorf("the driver's PutIfVersion returned no error for a canceled context")
		}
		if _, _, err := raw.CAS.GetWithVersion(ctx, "exists"); err == nil {
			t.Errorf("the driver's GetWithVersion returned no error for a canceled context")
		}
		var last error
		for _, err := range raw.CAS.ListKeys(ctx, "") {
			if last = err; err != nil {
				break
			}
		}
		if last == nil {
			t.Errorf("the driver's ListKeys under a canceled context ended without an error")
		}
	}
	if s.has(needRead) {
		wantMissing(t, db, "canceled")
		wantMissing(t, db, "canceled-raw")
		wantValue(t, db, "exists", []byte("v"))
		if s.caps.Delete {
			wantValue(t, db, "exists2", []byte("v"))
		}
		if s.caps.CAS {
			wantMissing(t, db, "canceled-raw-cas")
		}
	}
}

func checkCancelInFlight(t testing.TB, s *suite) {
	db := s.store(t)
	for i := range 20 {
		put(t, db, fmt.Sprintf("f/%02d", i), []byte("v"))
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const workers = 4
	var (
		wg      sync.WaitGroup
		ops     atomic.Int64
		errs    = make([]error, workers)
		started = make(chan struct{}, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			signalled := false
			for i := 0; ; i++ {
				key := fmt.Sprintf("f/%02d", (i+w)%20)
				var err error
				switch {
				case i%4 == 1 && s.has(needRead):
					_, err = read(ctx, db, key)
				case i%4 == 2 && s.has(needKeys):
					for _, err = range db.ListKeys(ctx, "f/") {
						if err != nil {
							break
						}
					}
				case i%4 == 3 && s.caps.CAS:
					_, err = db.PutIfAbsent(ctx, fmt.Sprintf("f/new-%d-%d", w, i), []byte("v"))
				default:
					err = db.Put(ctx, key, []byte("v"))
				}
				ops.Add(1)
				if !signalled && i >= 2 {
					started <- struct{}{}
					signalled = true
				}
				if err != nil {
					errs[w] = err
					if !signalled {
						started <- struct{}{}
					}
					return
				}
			}
		}()
	}
	for range workers {
		<-started
	}
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	const grace = 10 * time.Second
	select {
	case <-done:
	case <-time.After(grace):
		t.Fatalf("operations were still running %v after their context was canceled", grace)
	}
	for w, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("worker %d ended with %v, want an error matching context.Canceled", w, err)
		}
	}
}

func checkErrorMessages(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	const key = "errors/the-key"
	secret := "SECRET-VALUE-" + strings.Repeat("s", 20)
	checkMsg := func(op string, err error, k string) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: got no error, want one", op)
			return
		}
		msg := err.Error()
		if !strings.Contains(msg, s.name) {
			t.Errorf("%s: the error %q does not name the driver %q", op, msg, s.name)
		}
		if !strings.Contains(msg, k) {
			t.Errorf("%s: the error %q does not name the key %q", op, msg, k)
		}
		if strings.Contains(msg, "SECRET-VALUE") {
			t.Errorf("%s: the error %q contains the value", op, msg)
		}
		var ke *kv.Error
		if !errors.As(err, &ke) {
			t.Errorf("%s: the error %q is not a *kv.Error", op, msg)
		} else if ke.Key != k || ke.Driver != s.name {
			t.Errorf("%s: *kv.Error has Driver %q and Key %q, want %q and %q", op, ke.Driver, ke.Key, s.name, k)
		}
	}
	_, err := read(ctx, db, key+"-missing")
	checkMsg("reading a missing key", err, key+"-missing")
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	checkMsg("Put under a canceled context", db.Put(canceled, key, []byte(secret)), key)
	put(t, db, key, []byte(secret))
	if s.caps.CAS {
		_, err := db.PutIfAbsent(ctx, key, []byte(secret))
		checkMsg("PutIfAbsent conflict", err, key)
		_, err = db.PutIfVersion(ctx, key, []byte(secret), "not-a-version")
		checkMsg("PutIfVersion conflict", err, key)
		_, err = db.PutIfVersion(ctx, key+"-missing", []byte(secret), "not-a-version")
		checkMsg("PutIfVersion of a missing key", err, key+"-missing")
	}
	if limit := s.h.MaxValueSize; limit > 0 && limit <= 16*MiB {
		over := []byte(secret + strings.Repeat("s", limit))
		checkMsg("Put past the size limit", db.Put(ctx, key, over), key)
	}
}
