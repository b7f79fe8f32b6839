package kvtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// These tests prove the suite can fail: each runs every check against a
// backend with one deliberate defect, through a recorder that collects
// failures instead of failing the test, and asserts that the check for the
// broken rule failed with a message naming that rule.

// recorder is a testing.TB that records failures. Everything else (Cleanup,
// Context, TempDir, Helper) goes to the real test.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	msgs   []string
	failed bool
}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	if msg != "" {
		r.msgs = append(r.msgs, msg)
	}
}

func (r *recorder) Error(args ...any)                 { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }
func (r *recorder) Fatal(args ...any)                 { r.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recorder) Fail()                    { r.fail("") }
func (r *recorder) FailNow()                 { r.fail(""); runtime.Goexit() }
func (r *recorder) Log(...any)               {}
func (r *recorder) Logf(string, ...any)      {}
func (r *recorder) Skip(args ...any)         { r.fail("skipped: " + fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Skipf(f string, a ...any) { r.Skip(fmt.Sprintf(f, a...)) }
func (r *recorder) SkipNow()                 { r.Skip() }
func (r *recorder) Skipped() bool            { return false }

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// outcome is what one check recorded.
type outcome struct {
	failed bool
	msgs   []string
}

// runRecorded runs every applicable check against h (or those named in
// only), each in its own goroutine with its own recorder, and returns the
// outcomes by check name.
func runRecorded(t *testing.T, h Harness, only ...string) map[string]outcome {
	t.Helper()
	s := newSuite(t, h)
	s.drawHistories = false
	out := map[string]outcome{}
	for _, c := range allChecks() {
		if !s.has(c.needs) || len(only) > 0 && !slices.Contains(only, c.name) {
			continue
		}
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.runCheck(r, c)
		}()
		start := time.Now()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("check %s did not finish", c.name)
		}
		if d := time.Since(start); d > time.Second {
			t.Logf("check %s took %v", c.name, d)
		}
		out[c.name] = outcome{failed: r.Failed(), msgs: r.msgs}
	}
	return out
}

func ruleOf(name string) string {
	for _, c := range allChecks() {
		if c.name == name {
			return c.rule
		}
	}
	return ""
}

// memHarness serves backends built by wrap around fresh memory stores.
func memHarness(wrap func(*memkv.Store) any) Harness {
	return Harness{
		ManyKeys: 300,
		Shared:   true,
		NewNamespace: func(t testing.TB) Opener {
			backend := wrap(memkv.NewStore())
			return func(t testing.TB) *kv.DB {
				db, err := kv.New("broken", backend)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

// --- the broken backends ---

// oneByOneBatch claims the batch capability but applies the ops one at a
// time, stopping at the first failure: a failed batch leaves its prefix.
type oneByOneBatch struct{ *memkv.Store }

func (b oneByOneBatch) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	vers := make([]kv.Version, len(ops))
	for i, op := range ops {
		var err error
		switch op.Kind {
		case kv.BatchPut:
			err = b.Store.Put(ctx, op.Key, op.Value)
			if err == nil {
				_, vers[i], err = b.Store.GetWithVersion(ctx, op.Key)
			}
		case kv.BatchDelete:
			err = b.Store.Delete(ctx, op.Key)
		case kv.BatchPutIfAbsent:
			vers[i], err = b.Store.PutIfAbsent(ctx, op.Key, op.Value)
		case kv.BatchPutIfVersion:
			vers[i], err = b.Store.PutIfVersion(ctx, op.Key, op.Value, op.Version)
		}
		if err != nil {
			return nil, &kv.BatchError{Index: i, Applied: 0, Err: err}
		}
		raceWindow()
	}
	return vers, nil
}

// nonAtomicCAS does compare-and-set as a read followed by a write, with a
// window between them in which another writer gets in.
type nonAtomicCAS struct{ *memkv.Store }

func (b nonAtomicCAS) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	_, ver, err := b.Store.GetWithVersion(ctx, key)
	if errors.Is(err, kv.ErrNotFound) || err == nil && ver != expected {
		return "", kv.ErrConflict
	}
	if err != nil {
		return "", err
	}
	raceWindow()
	if err := b.Store.Put(ctx, key, value); err != nil {
		return "", err
	}
	_, ver, err = b.Store.GetWithVersion(ctx, key)
	return ver, err
}

func (b nonAtomicCAS) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	_, err := b.Store.Get(ctx, key)
	if err == nil {
		return "", kv.ErrConflict
	}
	if !errors.Is(err, kv.ErrNotFound) {
		return "", err
	}
	raceWindow()
	if err := b.Store.Put(ctx, key, value); err != nil {
		return "", err
	}
	_, ver, err := b.Store.GetWithVersion(ctx, key)
	return ver, err
}

func raceWindow() {
	runtime.Gosched()
	time.Sleep(50 * time.Microsecond)
}

// mangledList rewrites every listing with fix.
type mangledList struct {
	*memkv.Store
	fix func([]kv.Entry) []kv.Entry
}

func (b mangledList) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		var all []kv.Entry
		for e, err := range b.Store.List(ctx, prefix) {
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			all = append(all, e)
		}
		for _, e := range b.fix(all) {
			if !yield(e, nil) {
				return
			}
		}
	}
}

func (b mangledList) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for e, err := range b.List(ctx, prefix) {
			if !yield(e.Key, err) || err != nil {
				return
			}
		}
	}
}

// dropSecond loses the second entry of every listing.
func dropSecond(es []kv.Entry) []kv.Entry {
	if len(es) > 1 {
		return slices.Delete(es, 1, 2)
	}
	return es
}

// swapFirstTwo returns the first two entries of every listing swapped.
func swapFirstTwo(es []kv.Entry) []kv.Entry {
	if len(es) > 1 {
		es[0], es[1] = es[1], es[0]
	}
	return es
}

// fakeStore is a small map backend whose versioning is pluggable.
type fakeStore struct {
	mu      sync.Mutex
	data    map[string]fakeItem
	counter map[string]int // per-key write counters
	version func(f *fakeStore, key string, value []byte) kv.Version
}

type fakeItem struct {
	value []byte
	ver   kv.Version
}

func newFake(version func(f *fakeStore, key string, value []byte) kv.Version) *fakeStore {
	return &fakeStore{data: map[string]fakeItem{}, counter: map[string]int{}, version: version}
}

// contentHash versions a value by its bytes, as an S3 ETag does.
func contentHash(_ *fakeStore, _ string, value []byte) kv.Version {
	sum := sha256.Sum256(value)
	return kv.Version(hex.EncodeToString(sum[:8]))
}

// perKeyCounter counts writes per key and forgets the count on delete, as
// Dapr's Redis store did.
func perKeyCounter(f *fakeStore, key string, _ []byte) kv.Version {
	f.counter[key]++
	return kv.Version(strconv.Itoa(f.counter[key]))
}

func (f *fakeStore) write(key string, value []byte) kv.Version {
	v := f.version(f, key, value)
	f.data[key] = fakeItem{value: slices.Clone(value), ver: v}
	return v
}

func (f *fakeStore) Put(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.write(key, value)
	return nil
}

func (f *fakeStore) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := f.GetWithVersion(ctx, key)
	return v, err
}

func (f *fakeStore) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.data, key)
	delete(f.counter, key)
	return nil
}

func (f *fakeStore) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		if err := ctx.Err(); err != nil {
			yield(kv.Entry{}, err)
			return
		}
		f.mu.Lock()
		var out []kv.Entry
		for k, it := range f.data {
			if strings.HasPrefix(k, prefix) {
				out = append(out, kv.Entry{Key: k, Value: slices.Clone(it.value)})
			}
		}
		f.mu.Unlock()
		slices.SortFunc(out, func(a, b kv.Entry) int { return strings.Compare(a.Key, b.Key) })
		for _, e := range out {
			if !yield(e, nil) {
				return
			}
		}
	}
}

func (f *fakeStore) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	it, ok := f.data[key]
	if !ok {
		return nil, "", kv.ErrNotFound
	}
	return slices.Clone(it.value), it.ver, nil
}

func (f *fakeStore) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.data[key]; ok {
		return "", kv.ErrConflict
	}
	return f.write(key, value), nil
}

func (f *fakeStore) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if it, ok := f.data[key]; !ok || it.ver != expected {
		return "", kv.ErrConflict
	}
	return f.write(key, value), nil
}

func (f *fakeStore) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for e, err := range f.List(ctx, prefix) {
			if !yield(e.Key, err) || err != nil {
				return
			}
		}
	}
}

// fakeHarness serves a fresh fakeStore per namespace.
func fakeHarness(version func(f *fakeStore, key string, value []byte) kv.Version) Harness {
	return Harness{
		ManyKeys: 300,
		NewNamespace: func(t testing.TB) Opener {
			f := newFake(version)
			return func(t testing.TB) *kv.DB {
				db, err := kv.New("broken", f)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

// overwritingPutIfAbsent writes even when the key exists (Dapr Redis).
type overwritingPutIfAbsent struct{ *memkv.Store }

func (b overwritingPutIfAbsent) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := b.Store.Put(ctx, key, value); err != nil {
		return "", err
	}
	_, v, err := b.Store.GetWithVersion(ctx, key)
	return v, err
}

// genericConflict reports a version mismatch as a plain error (Dapr
// Postgres).
type genericConflict struct{ *memkv.Store }

func (b genericConflict) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	v, err := b.Store.PutIfVersion(ctx, key, value, expected)
	if errors.Is(err, kv.ErrConflict) {
		return "", errors.New("broken: version mismatch")
	}
	return v, err
}

// emptyIsMissing reports an empty value as a miss.
type emptyIsMissing struct{ *memkv.Store }

func (b emptyIsMissing) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := b.Store.Get(ctx, key)
	if err == nil && len(v) == 0 {
		return nil, kv.ErrNotFound
	}
	return v, err
}

// ignoresContext runs every operation under context.Background.
type ignoresContext struct{ *memkv.Store }

func (b ignoresContext) Put(_ context.Context, key string, value []byte) error {
	return b.Store.Put(context.Background(), key, value)
}

func (b ignoresContext) Get(_ context.Context, key string) ([]byte, error) {
	return b.Store.Get(context.Background(), key)
}

// unorderedDelete serialises its conditional writes under a lock that
// Delete does not take, as versitygw's posix backend did: a PutIfVersion
// that has checked the version writes after a concurrent Delete returned.
type unorderedDelete struct {
	*memkv.Store
	mu *sync.Mutex
}

func (b unorderedDelete) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ver, err := b.Store.GetWithVersion(ctx, key)
	if errors.Is(err, kv.ErrNotFound) || err == nil && ver != expected {
		return "", kv.ErrConflict
	}
	if err != nil {
		return "", err
	}
	time.Sleep(time.Millisecond) // the write to disk; Delete does not wait
	if err := b.Store.Put(ctx, key, value); err != nil {
		return "", err
	}
	_, ver, err = b.Store.GetWithVersion(ctx, key)
	return ver, err
}

func (b unorderedDelete) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Store.PutIfAbsent(ctx, key, value)
}

// valueInErrors quotes the value in its conflict errors.
type valueInErrors struct{ *memkv.Store }

func (b valueInErrors) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	v, err := b.Store.PutIfAbsent(ctx, key, value)
	if err != nil {
		return "", fmt.Errorf("%w: refusing to write %q", err, value)
	}
	return v, nil
}

// truncating stores at most 512 KiB of a value, silently.
type truncating struct{ *memkv.Store }

func (b truncating) Put(ctx context.Context, key string, value []byte) error {
	return b.Store.Put(ctx, key, value[:min(len(value), 512<<10)])
}

// caseFolding matches list prefixes ignoring ASCII case, as SQL LIKE does.
type caseFolding struct{ *memkv.Store }

func (b caseFolding) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		for e, err := range b.Store.List(ctx, "") {
			if err != nil || strings.HasPrefix(strings.ToLower(e.Key), strings.ToLower(prefix)) {
				if !yield(e, err) || err != nil {
					return
				}
			}
		}
	}
}

func (b caseFolding) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for e, err := range b.List(ctx, prefix) {
			if !yield(e.Key, err) || err != nil {
				return
			}
		}
	}
}

// leakyNamespaces keeps every namespace in one shared store under its own
// key prefix, but lists the whole shared store for the empty prefix.
func leakyNamespaces() Harness {
	shared := memkv.NewStore()
	var mu sync.Mutex
	n := 0
	return Harness{
		ManyKeys: 300,
		NewNamespace: func(t testing.TB) Opener {
			mu.Lock()
			n++
			ns := fmt.Sprintf("ns%d/", n)
			mu.Unlock()
			f := kv.Funcs{
				Put: func(ctx context.Context, key string, value []byte) error {
					return shared.Put(ctx, ns+key, value)
				},
				Get: func(ctx context.Context, key string) ([]byte, error) {
					return shared.Get(ctx, ns+key)
				},
				List: func(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
					if prefix == "" {
						// The defect: the empty prefix lists every namespace.
						return shared.List(ctx, "")
					}
					return func(yield func(kv.Entry, error) bool) {
						for e, err := range shared.List(ctx, ns+prefix) {
							e.Key = strings.TrimPrefix(e.Key, ns)
							if !yield(e, err) || err != nil {
								return
							}
						}
					}
				},
			}
			return func(t testing.TB) *kv.DB {
				db, err := kv.New("broken", f)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

func TestSuitePassesMemkv(t *testing.T) {
	got := runRecorded(t, memHarness(func(s *memkv.Store) any { return s }))
	if len(got) != len(allChecks()) {
		t.Errorf("ran %d checks against memkv, want all %d", len(got), len(allChecks()))
	}
	for name, o := range got {
		if o.failed {
			t.Errorf("check %s failed against the reference driver: %s", name, strings.Join(o.msgs, "\n"))
		}
	}
}

func TestSuiteCatchesBrokenBackends(t *testing.T) {
	cases := []struct {
		name    string
		h       Harness
		want    []string // checks that must fail
		details []string // text the failures must contain
		only    bool     // run only the checks in want (the backend is slow to list)
	}{
		{
			name:    "CASAsGetThenPut",
			h:       memHarness(func(s *memkv.Store) any { return nonAtomicCAS{s} }),
			want:    []string{"ConcurrentConditionalWritesOneWinner", "ConcurrentConditionalWritesOneWinnerAcrossClients", "CASCounterCountsExactly", "Linearizable"},
			details: []string{"exactly one must", "increments were lost"},
		},
		{
			name:    "DeleteOutsideTheConditionalWritesLock",
			h:       memHarness(func(s *memkv.Store) any { return unorderedDelete{s, new(sync.Mutex)} }),
			want:    []string{"DeleteOrderedWithConditionalWrites"},
			details: []string{"the write landed after the delete"},
			only:    true,
		},
		{
			name:    "ListDropsAKey",
			h:       memHarness(func(s *memkv.Store) any { return mangledList{s, dropSecond} }),
			want:    []string{"ListIsCompleteOrderedAndOnce", "ListManyKeys", "ListSeesKeysDespiteConcurrentWrites", "EncoderCharacterKeys"},
			details: []string{"missing (not every key was returned)", "that existed before the listing were returned"},
		},
		{
			name:    "ListReordersKeys",
			h:       memHarness(func(s *memkv.Store) any { return mangledList{s, swapFirstTwo} }),
			want:    []string{"ListIsCompleteOrderedAndOnce", "ListManyKeys", "EncoderCharacterKeys"},
			details: []string{"out of ascending order"},
		},
		{
			name:    "ContentHashVersions",
			h:       fakeHarness(contentHash),
			want:    []string{"IdenticalBytesChangeVersion", "VersionsNeverReusedAfterDelete"},
			details: []string{"a Put of identical bytes", "had already been given"},
		},
		{
			name:    "VersionCounterRestartsAfterDelete",
			h:       fakeHarness(perKeyCounter),
			want:    []string{"VersionsNeverReusedAfterDelete", "BadTokensConflict", "PutIfAbsentAfterDelete", "Linearizable"},
			details: []string{"before a delete and re-create"},
		},
		{
			name:    "PutIfAbsentOverwrites",
			h:       memHarness(func(s *memkv.Store) any { return overwritingPutIfAbsent{s} }),
			want:    []string{"PutIfAbsentOnlyWhenAbsent", "ConcurrentConditionalWritesOneWinner"},
			details: []string{"PutIfAbsent of an existing key: succeeded"},
		},
		{
			name:    "ConflictAsGenericError",
			h:       memHarness(func(s *memkv.Store) any { return genericConflict{s} }),
			want:    []string{"PutIfVersionOnlyAtExpectedVersion", "BadTokensConflict"},
			details: []string{"broken: version mismatch"},
		},
		{
			name:    "EmptyValueReadsAsMissing",
			h:       memHarness(func(s *memkv.Store) any { return emptyIsMissing{s} }),
			want:    []string{"EmptyValueIsNotMissing"},
			details: []string{"which holds an empty value"},
		},
		{
			name:    "IgnoresContext",
			h:       memHarness(func(s *memkv.Store) any { return ignoresContext{s} }),
			want:    []string{"CanceledContext"},
			details: []string{"the driver's Put returned no error for a canceled context"},
		},
		{
			name:    "ValueInErrors",
			h:       memHarness(func(s *memkv.Store) any { return valueInErrors{s} }),
			want:    []string{"ErrorsNameDriverAndKey"},
			details: []string{"contains the value"},
		},
		{
			name:    "TruncatesLargeValues",
			h:       memHarness(func(s *memkv.Store) any { return truncating{s} }),
			want:    []string{"LargeValues"},
			details: []string{"1048576 bytes"},
		},
		{
			name:    "CaseInsensitivePrefixes",
			h:       memHarness(func(s *memkv.Store) any { return caseFolding{s} }),
			want:    []string{"ListIsCompleteOrderedAndOnce", "EncoderCharacterKeys"},
			details: []string{"outside the prefix"},
		},
		{
			name:    "BatchAppliedOneByOne",
			h:       memHarness(func(s *memkv.Store) any { return oneByOneBatch{s} }),
			only:    true,
			want:    []string{"BatchIsAllOrNothing", "ConcurrentBatchesOneWinner"},
			details: []string{"untouched", "reading missing key \"race/"},
		},
		{
			name:    "EmptyPrefixListsOtherNamespaces",
			h:       leakyNamespaces(),
			only:    true,
			want:    []string{"ListEmptyPrefixIsNamespaceOnly", "ListIsCompleteOrderedAndOnce", "EncoderCharacterKeys"},
			details: []string{"ListKeys(\"\") of a fresh namespace"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var only []string
			if c.only {
				only = c.want
			}
			got := runRecorded(t, c.h, only...)
			var all []string
			for _, name := range c.want {
				o, ran := got[name]
				switch {
				case !ran:
					t.Errorf("check %s did not run", name)
					continue
				case !o.failed:
					t.Errorf("check %s passed against a backend that breaks its rule", name)
					continue
				}
				rule := ruleOf(name)
				for _, m := range o.msgs {
					if !strings.Contains(m, "rule: "+rule) {
						t.Errorf("check %s failed with a message that does not name its rule %q:\n%s", name, rule, m)
					}
				}
				all = append(all, o.msgs...)
			}
			joined := strings.Join(all, "\n")
			for _, d := range c.details {
				if !strings.Contains(joined, d) {
					t.Errorf("no failure message says %q; got:\n%s", d, joined)
				}
			}
			if testing.Verbose() {
				for _, name := range slices.Sorted(maps.Keys(got)) {
					if o := got[name]; o.failed && len(o.msgs) > 0 {
						t.Logf("%s: %s", name, o.msgs[0])
					}
				}
			}
		})
	}
}
