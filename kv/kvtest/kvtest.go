// Package kvtest is the conformance suite for kv backends: every driver's own
// tests run it, and so can anyone who brings their own backend.
//
// A driver joins with a Harness (how to make a fresh, empty namespace and open
// clients to it) and one call:
//
//	func TestConformance(t *testing.T) {
//		kvtest.Run(t, kvtest.Harness{
//			NewNamespace: func(t testing.TB) kvtest.Opener {
//				store := memkv.NewStore()
//				return func(t testing.TB) *kv.DB {
//					db, err := kv.New("mem", store)
//					if err != nil {
//						t.Fatal(err)
//					}
//					return db
//				}
//			},
//		})
//	}
//
// Run runs one subtest per rule of the contract, named after the rule, and
// chooses the rules by the backend's declared capabilities (kv.Discover, as
// reported by (*kv.DB).Capabilities): a backend without Get, Delete or List
// gets the checks it can take and a log line naming the ones that do not
// apply. RunStore runs the core group (Put, Get, Delete, List), RunCAS the
// compare-and-set group. Every failure message ends with the rule it breaks.
//
// The checks cover the rules of package kv's documentation: misses versus
// empty values, overwrites, deletes, complete and ordered listings (10,000
// keys, nested prefixes, keys written concurrently with the listing), a
// corpus of hard keys (every character the key encoder emits, keys at
// kv.MaxKeyLength, `x` beside `x/y`), values of 0 bytes, 1 MiB and binary,
// context cancellation, error messages, and for the CAS group: conflicts,
// version tokens (from a second client, after reopening, stale, foreign or
// garbage), versions that change on identical bytes and are never reused
// after delete and re-create, races with exactly one winner per version, a
// counter driven by CAS loops, and a linearizability check of a concurrent
// history with porcupine.
//
// RunBenchmarks runs the shared benchmarks (Put, Get, PutIfVersion, List1000),
// so drivers can be compared side by side.
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"agentkit/kv"
)

// Run runs every check the backend's capabilities allow: the core group of
// RunStore and, when the backend has the CAS group, the checks of RunCAS.
func Run(t *testing.T, h Harness) {
	t.Helper()
	s := newSuite(t, h)
	s.run(t, allChecks())
}

// RunStore runs the checks of the core group (Put, Get, Delete, List and what
// every backend must do with keys, values and contexts). Checks that need a
// method the backend lacks are not run; the test log names them.
func RunStore(t *testing.T, h Harness) {
	t.Helper()
	s := newSuite(t, h)
	s.run(t, storeChecks())
}

// RunCAS runs the checks of the compare-and-set group. It fails at once when
// the backend does not provide the whole group.
func RunCAS(t *testing.T, h Harness) {
	t.Helper()
	s := newSuite(t, h)
	if !s.caps.CAS {
		t.Fatalf("kvtest: RunCAS needs a backend with the CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys); this one has %s%s",
			s.caps, missingNote(s.caps))
	}
	s.run(t, casChecks())
}

func missingNote(c kv.Capabilities) string {
	if len(c.MissingCAS) == 0 {
		return ""
	}
	return " and lacks " + strings.Join(c.MissingCAS, ", ")
}

// need is a set of capabilities a check requires.
type need uint

const (
	needGet    need = 1 << iota // the Get method
	needDelete                  // the Delete method
	needList                    // the List method (with values)
	needCAS                     // the whole CAS group
	needShared                  // independent clients (Harness.Shared)
	needRead                    // Get or GetWithVersion
	needKeys                    // List or ListKeys
	needBatch                   // the batch capability (kv.Batcher)
)

func (n need) String() string {
	var parts []string
	for _, p := range []struct {
		bit  need
		name string
	}{{needGet, "Get"}, {needDelete, "Delete"}, {needList, "List"}, {needCAS, "the CAS group"},
		{needShared, "Harness.Shared"}, {needRead, "Get or GetWithVersion"}, {needKeys, "List or ListKeys"},
		{needBatch, "the batch capability (kv.Batcher)"}} {
		if n&p.bit != 0 {
			parts = append(parts, p.name)
		}
	}
	return strings.Join(parts, ", ")
}

// check is one rule of the contract and the test that holds a backend to it.
type check struct {
	name  string // the subtest name, the rule in CamelCase
	rule  string // the rule in words; failure messages end with it
	needs need
	run   func(t testing.TB, s *suite)
}

// suite is one run of the checks against one harness.
type suite struct {
	h    Harness
	caps kv.Capabilities
	name string // the driver's name, as *kv.DB reports it
	// drawHistories writes a failing linearizability history to a file.
	drawHistories bool
}

func newSuite(t testing.TB, h Harness) *suite {
	t.Helper()
	if h.NewNamespace == nil {
		t.Fatal("kvtest: Harness.NewNamespace is nil; set it to a function that makes a fresh, empty namespace and returns an Opener for it")
	}
	if h.ManyKeys <= 0 {
		h.ManyKeys = DefaultManyKeys
	}
	s := &suite{h: h, drawHistories: true}
	open := h.NewNamespace(t)
	if open == nil {
		t.Fatal("kvtest: Harness.NewNamespace returned a nil Opener")
	}
	db := open(t)
	if db == nil {
		t.Fatal("kvtest: the Opener returned a nil *kv.DB")
	}
	s.caps = db.Capabilities()
	s.name = db.Name()
	if err := db.Close(); err != nil {
		t.Errorf("kvtest: closing the first client: %v", err)
	}
	if err := s.caps.Validate(); err != nil {
		t.Fatalf("kvtest: the backend is not usable: %v", err)
	}
	return s
}

// has reports whether the backend provides everything n names.
func (s *suite) has(n need) bool {
	c := s.caps
	ok := func(bit need, have bool) bool { return n&bit == 0 || have }
	return ok(needGet, c.Get) && ok(needDelete, c.Delete) && ok(needList, c.List) &&
		ok(needCAS, c.CAS) && ok(needShared, s.h.Shared) &&
		ok(needRead, c.Get || c.CAS) && ok(needKeys, c.List || c.CAS) && ok(needBatch, c.Batch)
}

// run runs each applicable check as a subtest and logs the others.
func (s *suite) run(t *testing.T, checks []check) {
	t.Helper()
	var notRun []string
	for _, c := range checks {
		if !s.has(c.needs) {
			notRun = append(notRun, fmt.Sprintf("%s (needs %s)", c.name, c.needs))
			continue
		}
		t.Run(c.name, func(t *testing.T) { s.runCheck(t, c) })
	}
	if len(notRun) > 0 {
		t.Logf("kvtest: backend %q has %s; checks not applicable: %s", s.name, s.caps, strings.Join(notRun, "; "))
	}
}

// runCheck runs one check with failures labelled by its rule.
func (s *suite) runCheck(t testing.TB, c check) {
	c.run(ruleT{TB: t, rule: c.rule}, s)
}

// ruleT labels every failure with the rule the check holds the backend to.
type ruleT struct {
	testing.TB
	rule string
}

func (r ruleT) label(msg string) string { return msg + "\n\trule: " + r.rule }

func (r ruleT) Errorf(format string, args ...any) {
	r.TB.Helper()
	r.TB.Error(r.label(fmt.Sprintf(format, args...)))
}

func (r ruleT) Error(args ...any) {
	r.TB.Helper()
	r.TB.Error(r.label(strings.TrimSuffix(fmt.Sprintln(args...), "\n")))
}

func (r ruleT) Fatalf(format string, args ...any) {
	r.TB.Helper()
	r.TB.Fatal(r.label(fmt.Sprintf(format, args...)))
}

func (r ruleT) Fatal(args ...any) {
	r.TB.Helper()
	r.TB.Fatal(r.label(strings.TrimSuffix(fmt.Sprintln(args...), "\n")))
}

// namespace makes a fresh namespace for one test.
func (s *suite) namespace(t testing.TB) Opener {
	t.Helper()
	open := s.h.NewNamespace(t)
	if open == nil {
		t.Fatal("kvtest: Harness.NewNamespace returned a nil Opener")
	}
	return open
}

// client opens a client with open and closes it when the test ends.
func client(t testing.TB, open Opener) *kv.DB {
	t.Helper()
	db := open(t)
	if db == nil {
		t.Fatal("kvtest: the Opener returned a nil *kv.DB")
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// store makes a fresh namespace and opens one client to it.
func (s *suite) store(t testing.TB) *kv.DB {
	t.Helper()
	return client(t, s.namespace(t))
}

// twoClients opens two clients to one fresh namespace: independent ones when
// the harness is Shared, otherwise the same client twice.
func (s *suite) twoClients(t testing.TB) (*kv.DB, *kv.DB) {
	t.Helper()
	open := s.namespace(t)
	a := client(t, open)
	if !s.h.Shared {
		return a, a
	}
	return a, client(t, open)
}

// --- helpers shared by the checks ---

func put(t testing.TB, db *kv.DB, key string, value []byte) {
	t.Helper()
	if err := db.Put(t.Context(), key, value); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

// read returns the value of key through Get, or GetWithVersion when the
// backend has no Get.
func read(ctx context.Context, db *kv.DB, key string) ([]byte, error) {
	if db.Capabilities().Get {
		return db.Get(ctx, key)
	}
	v, _, err := db.GetWithVersion(ctx, key)
	return v, err
}

// mustRead reads key, failing the test on any error.
func mustRead(t testing.TB, db *kv.DB, key string) []byte {
	t.Helper()
	v, err := read(t.Context(), db, key)
	if err != nil {
		t.Fatalf("reading %q: %v", key, err)
	}
	return v
}

// wantValue checks that key holds want.
func wantValue(t testing.TB, db *kv.DB, key string, want []byte) {
	t.Helper()
	v, err := read(t.Context(), db, key)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		t.Errorf("reading %q: got ErrNotFound, want the %d-byte value written before (%v)", key, len(want), err)
	case err != nil:
		t.Errorf("reading %q: %v", key, err)
	case !bytesEqual(v, want):
		t.Errorf("reading %q: got %s, want %s", key, describe(v), describe(want))
	}
}

// wantMissing checks that reading key fails with ErrNotFound.
func wantMissing(t testing.TB, db *kv.DB, key string) {
	t.Helper()
	v, err := read(t.Context(), db, key)
	if !errors.Is(err, kv.ErrNotFound) {
		if err == nil {
			t.Errorf("reading missing key %q: got %s and no error, want an error matching kv.ErrNotFound", key, describe(v))
		} else {
			t.Errorf("reading missing key %q: got %v, want an error matching kv.ErrNotFound", key, err)
		}
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// describe prints a value briefly: short ones quoted, long ones by length
// and first difference-friendly prefix.
func describe(v []byte) string {
	if len(v) <= 64 {
		return fmt.Sprintf("%q (%d bytes)", v, len(v))
	}
	return fmt.Sprintf("%q… (%d bytes)", v[:32], len(v))
}

// listKeys lists the keys under prefix with ListKeys (which *kv.DB serves
// from List when the backend has no CAS group).
func listKeys(t testing.TB, db *kv.DB, prefix string) []string {
	t.Helper()
	var keys []string
	for k, err := range db.ListKeys(t.Context(), prefix) {
		if err != nil {
			t.Fatalf("ListKeys(%q) failed after %d keys: %v", prefix, len(keys), err)
		}
		keys = append(keys, k)
	}
	return keys
}

// listEntries lists the entries under prefix with List.
func listEntries(t testing.TB, db *kv.DB, prefix string) []kv.Entry {
	t.Helper()
	var out []kv.Entry
	for e, err := range db.List(t.Context(), prefix) {
		if err != nil {
			t.Fatalf("List(%q) failed after %d entries: %v", prefix, len(out), err)
		}
		out = append(out, e)
	}
	return out
}

// wantKeys compares a listing with the keys expected, naming what is
// missing, extra, repeated or out of order.
func wantKeys(t testing.TB, what string, got, want []string) {
	t.Helper()
	want = slices.Clone(want)
	slices.Sort(want)
	want = slices.Compact(want)
	if slices.Equal(got, want) {
		return
	}
	t.Errorf("%s: %s", what, diffKeys(got, want))
}

// diffKeys explains how a listing differs from the sorted, unique want.
func diffKeys(got, want []string) string {
	var notes []string
	wantSet := make(map[string]bool, len(want))
	for _, k := range want {
		wantSet[k] = true
	}
	seen := make(map[string]int, len(got))
	for _, k := range got {
		seen[k]++
	}
	var missing, extra, repeated []string
	for _, k := range want {
		if seen[k] == 0 {
			missing = append(missing, k)
		}
	}
	for k, n := range seen {
		if !wantSet[k] {
			extra = append(extra, k)
		}
		if n > 1 {
			repeated = append(repeated, k)
		}
	}
	slices.Sort(extra)
	slices.Sort(repeated)
	if len(missing) > 0 {
		notes = append(notes, fmt.Sprintf("%s missing (not every key was returned), e.g. %s", count(len(missing), "key"), sample(missing)))
	}
	if len(extra) > 0 {
		notes = append(notes, fmt.Sprintf("%s not expected (outside the prefix, the namespace or never written), e.g. %s", count(len(extra), "key"), sample(extra)))
	}
	if len(repeated) > 0 {
		notes = append(notes, fmt.Sprintf("%s returned more than once, e.g. %s", count(len(repeated), "key"), sample(repeated)))
	}
	if i := firstDisorder(got); i > 0 {
		notes = append(notes, fmt.Sprintf("not in ascending bytewise order: %q came after %q", got[i], got[i-1]))
	}
	if len(notes) == 0 {
		notes = append(notes, fmt.Sprintf("got %s, want %s", sample(got), sample(want)))
	}
	return fmt.Sprintf("got %s, want %d: %s", count(len(got), "key"), len(want), strings.Join(notes, "; "))
}

// count says "1 key" or "2 keys".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func firstDisorder(keys []string) int {
	for i := 1; i < len(keys); i++ {
		if keys[i] < keys[i-1] {
			return i
		}
	}
	return -1
}

func sample(keys []string) string {
	const n = 5
	if len(keys) <= n {
		return fmt.Sprintf("%q", keys)
	}
	return fmt.Sprintf("%q and %d more", keys[:n], len(keys)-n)
}

// parallel runs fn(i) for i in [0, n) on a few goroutines and returns the
// first error.
func parallel(n, workers int, fn func(i int) error) error {
	if workers > n {
		workers = n
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		mu.Lock()
		stop := first != nil
		mu.Unlock()
		if stop {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// putAll writes each key with value(key), a few at a time.
func putAll(t testing.TB, db *kv.DB, keys []string, value func(string) []byte) {
	t.Helper()
	ctx := t.Context()
	err := parallel(len(keys), 8, func(i int) error {
		return db.Put(ctx, keys[i], value(keys[i]))
	})
	if err != nil {
		t.Fatalf("writing %d keys: %v", len(keys), err)
	}
}

// allChecks is every check, core group first, then the CAS group's and the
// batch capability's.
func allChecks() []check { return append(append(storeChecks(), casChecks()...), batchChecks()...) }
