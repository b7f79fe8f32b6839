package kv_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"
	"unicode/utf8"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// seqOf yields the keys as entries.
func seqOf(keys ...string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		for _, k := range keys {
			if !yield(kv.Entry{Key: k}, nil) {
				return
			}
		}
	}
}

func collect(seq iter.Seq2[kv.Entry, error]) ([]string, error) {
	var keys []string
	for e, err := range seq {
		if err != nil {
			return keys, err
		}
		keys = append(keys, e.Key)
	}
	return keys, nil
}

func mustNew(t *testing.T, name string, backend any) *kv.DB {
	t.Helper()
	db, err := kv.New(name, backend)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return db
}

func TestDBMissingCapabilitiesAreUnsupported(t *testing.T) {
	store := memkv.NewStore()
	db := mustNew(t, "putonly", kv.Funcs{Put: store.Put})
	ctx := context.Background()
	if err := db.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatalf("Put: %v", err)
	}
	checks := map[string]error{}
	_, checks["Get"] = db.Get(ctx, "k")
	checks["Delete"] = db.Delete(ctx, "k")
	_, checks["List"] = collect(db.List(ctx, ""))
	_, _, checks["GetWithVersion"] = db.GetWithVersion(ctx, "k")
	_, checks["PutIfAbsent"] = db.PutIfAbsent(ctx, "k", nil)
	_, checks["PutIfVersion"] = db.PutIfVersion(ctx, "k", nil, "1")
	for _, err := range db.ListKeys(ctx, "") {
		checks["ListKeys"] = err
		break
	}
	for method, err := range checks {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s on a backend without it: got %v, want errors.ErrUnsupported", method, err)
			continue
		}
		if !strings.Contains(err.Error(), method) || !strings.Contains(err.Error(), "putonly") {
			t.Errorf("%s: error %q should name the method and the store", method, err)
		}
	}
}

func TestDBOverFuncs(t *testing.T) {
	store := memkv.NewStore()
	db := mustNew(t, "funcs", kv.Funcs{
		Put: store.Put, Get: store.Get, Delete: store.Delete, List: store.List,
	})
	ctx := context.Background()
	if err := db.Put(ctx, "a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, err := db.Get(ctx, "a"); err != nil || string(v) != "1" {
		t.Errorf("Get = %q, %v", v, err)
	}
	// Without a CAS group ListKeys falls back to List.
	var keys []string
	for k, err := range db.ListKeys(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if fmt.Sprint(keys) != "[a]" {
		t.Errorf("ListKeys through List = %q", keys)
	}
	if err := db.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Get(ctx, "a"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get after Delete = %v", err)
	}
	if c := db.Capabilities(); !c.Get || c.CAS {
		t.Errorf("Capabilities = %+v", c)
	}
	if _, ok := db.Backend().(kv.Funcs); !ok {
		t.Errorf("Backend() = %T, want the kv.Funcs given to New", db.Backend())
	}
}

func TestNew(t *testing.T) {
	inner := memkv.New()
	if db, err := kv.New("other", inner); err != nil || db != inner {
		t.Errorf("New(*DB) = %p, %v; want the same *DB", db, err)
	}
	db := mustNew(t, "", memkv.NewStore())
	if db.Name() != "kv" {
		t.Errorf("New with no name: Name() = %q, want \"kv\"", db.Name())
	}
	if _, err := kv.New("x", nil); err == nil || !strings.Contains(err.Error(), "Put") {
		t.Errorf("New(nil) = %v, want an error saying Put is required", err)
	}
}

func TestErrorWrapping(t *testing.T) {
	native := errors.New("native: connection reset")
	db := mustNew(t, "fake", kv.Funcs{
		Put: func(context.Context, string, []byte) error { return fmt.Errorf("%w: %w", kv.ErrTooLarge, native) },
		Get: func(context.Context, string) ([]byte, error) { return nil, kv.ErrNotFound },
	})
	ctx := context.Background()
	err := db.Put(ctx, "the/key", []byte("secret value"))
	if !errors.Is(err, kv.ErrTooLarge) || !errors.Is(err, native) {
		t.Errorf("Put error %v: want it to match kv.ErrTooLarge and the native error", err)
	}
	var ke *kv.Error
	if !errors.As(err, &ke) {
		t.Fatalf("Put error %v is not a *kv.Error", err)
	}
	if ke.Driver != "fake" || ke.Op != "put" || ke.Key != "the/key" || !errors.Is(ke.Err, native) {
		t.Errorf("*kv.Error = %+v", ke)
	}
	if msg := err.Error(); !strings.Contains(msg, "fake") || !strings.Contains(msg, `"the/key"`) || strings.Contains(msg, "secret") {
		t.Errorf("error %q: want the driver and the key, not the value", msg)
	}
	_, err = db.Get(ctx, "missing")
	if !errors.Is(err, kv.ErrNotFound) || !errors.As(err, &ke) || ke.Op != "get" {
		t.Errorf("Get error %v: want kv.ErrNotFound inside a *kv.Error for op get", err)
	}
}

// casFuncs returns a CAS group whose PutIfAbsent fails with err.
func casFuncs(store *memkv.Store, putIfAbsentErr error) kv.Funcs {
	c := kv.CASFuncsOf(store)
	c.PutIfAbsent = func(context.Context, string, []byte) (kv.Version, error) { return "", putIfAbsentErr }
	return kv.Funcs{Put: store.Put, CAS: c}
}

func TestPutIfAbsentConflictIsAlsoExists(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		err  error
	}{
		{"driver says conflict", kv.ErrConflict},
		{"driver says exists", kv.ErrExists},
		{"driver wraps conflict", fmt.Errorf("%w: %w", kv.ErrConflict, errors.New("native 412"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := mustNew(t, "fake", casFuncs(memkv.NewStore(), c.err))
			_, err := db.PutIfAbsent(ctx, "k", []byte("v"))
			if !errors.Is(err, kv.ErrConflict) || !errors.Is(err, kv.ErrExists) {
				t.Errorf("PutIfAbsent conflict = %v; want both kv.ErrConflict and kv.ErrExists", err)
			}
		})
	}
	// Through memkv, the reference.
	db := memkv.New()
	if _, err := db.PutIfAbsent(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	_, err := db.PutIfAbsent(ctx, "k", []byte("v"))
	if !errors.Is(err, kv.ErrConflict) || !errors.Is(err, kv.ErrExists) {
		t.Errorf("memkv PutIfAbsent conflict = %v; want both sentinels", err)
	}
	// A version conflict is not "exists".
	_, err = db.PutIfVersion(ctx, "k", []byte("v"), "stale")
	if !errors.Is(err, kv.ErrConflict) || errors.Is(err, kv.ErrExists) {
		t.Errorf("PutIfVersion conflict = %v; want kv.ErrConflict and not kv.ErrExists", err)
	}
	// Another failure is neither.
	db = mustNew(t, "fake", casFuncs(memkv.NewStore(), errors.New("timeout")))
	_, err = db.PutIfAbsent(ctx, "k", []byte("v"))
	if errors.Is(err, kv.ErrConflict) || errors.Is(err, kv.ErrExists) {
		t.Errorf("PutIfAbsent with an unknown outcome = %v; must not be reported as a conflict", err)
	}
}

func TestPutIfVersionEmptyVersion(t *testing.T) {
	called := false
	c := kv.CASFuncsOf(memkv.NewStore())
	c.PutIfVersion = func(context.Context, string, []byte, kv.Version) (kv.Version, error) {
		called = true
		return "1", nil
	}
	db := mustNew(t, "fake", kv.Funcs{Put: func(context.Context, string, []byte) error { return nil }, CAS: c})
	_, err := db.PutIfVersion(context.Background(), "k", nil, "")
	if !errors.Is(err, kv.ErrConflict) || !strings.Contains(err.Error(), "PutIfAbsent") {
		t.Errorf("PutIfVersion with the empty version = %v; want a conflict pointing to PutIfAbsent", err)
	}
	if called {
		t.Error("the driver was called with the empty version")
	}
}

func TestClosed(t *testing.T) {
	closes := 0
	store := memkv.NewStore()
	backend := &closer{Store: store, close: func() error { closes++; return nil }}
	db := mustNew(t, "closing", backend)
	ctx := context.Background()
	if err := db.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if closes != 1 {
		t.Errorf("the backend was closed %d times, want once", closes)
	}
	errs := map[string]error{"Put": db.Put(ctx, "k", nil), "Delete": db.Delete(ctx, "k")}
	_, errs["Get"] = db.Get(ctx, "k")
	_, errs["List"] = collect(db.List(ctx, ""))
	_, _, errs["GetWithVersion"] = db.GetWithVersion(ctx, "k")
	_, errs["PutIfAbsent"] = db.PutIfAbsent(ctx, "k", nil)
	_, errs["PutIfVersion"] = db.PutIfVersion(ctx, "k", nil, "1")
	for _, err := range db.ListKeys(ctx, "") {
		errs["ListKeys"] = err
		break
	}
	for op, err := range errs {
		if !errors.Is(err, kv.ErrClosed) {
			t.Errorf("%s after Close = %v, want kv.ErrClosed", op, err)
		}
		if errors.Is(err, kv.ErrNotFound) {
			t.Errorf("%s after Close matches kv.ErrNotFound: only a real miss may", op)
		}
	}

	failing := mustNew(t, "closing", &closer{Store: store, close: func() error { return errors.New("flush failed") }})
	err := failing.Close()
	var ke *kv.Error
	if !errors.As(err, &ke) || ke.Op != "close" || ke.Driver != "closing" {
		t.Errorf("Close error = %v, want a *kv.Error for op close", err)
	}
}

type closer struct {
	*memkv.Store
	close func() error
}

func (c *closer) Close() error { return c.close() }

func TestKeyValidation(t *testing.T) {
	cases := []struct {
		key  string
		want string // in the message; "" means valid
	}{
		{"", "empty"},
		{strings.Repeat("k", kv.MaxKeyLength+1), "1025 bytes is longer than the 1024-byte limit"},
		{"bad\xffutf8", "not valid UTF-8"},
		{"nul\x00byte", "NUL"},
		{strings.Repeat("k", kv.MaxKeyLength), ""},
		{"agentkit/v1/a/kv/x%2Fy", ""},
		{"héllo wörld\t\n", ""},
	}
	db := memkv.New()
	ctx := context.Background()
	for _, c := range cases {
		err := kv.ValidateKey(c.key)
		if c.want == "" {
			if err != nil {
				t.Errorf("ValidateKey(%.20q) = %v, want nil", c.key, err)
			}
			if err := db.Put(ctx, c.key, nil); err != nil {
				t.Errorf("Put(%.20q) = %v", c.key, err)
			}
			continue
		}
		if !errors.Is(err, kv.ErrInvalidKey) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ValidateKey(%.20q) = %v, want kv.ErrInvalidKey saying %q", c.key, err, c.want)
		}
		// Every keyed method of *DB rejects it before the driver sees it.
		perr := db.Put(ctx, c.key, nil)
		_, gerr := db.Get(ctx, c.key)
		_, cerr := db.PutIfAbsent(ctx, c.key, nil)
		for _, e := range []error{perr, gerr, cerr} {
			if !errors.Is(e, kv.ErrInvalidKey) {
				t.Errorf("a *DB method with key %.20q = %v, want kv.ErrInvalidKey", c.key, e)
			}
		}
	}
	// Prefixes may be empty but obey the other rules.
	if _, err := collect(db.List(ctx, "")); err != nil {
		t.Errorf("List(\"\") = %v", err)
	}
	if _, err := collect(db.List(ctx, "nul\x00")); !errors.Is(err, kv.ErrInvalidKey) {
		t.Errorf("List with a NUL in the prefix = %v, want kv.ErrInvalidKey", err)
	}
	if msg := kv.ValidateKey("nul\x00").Error(); !strings.Contains(msg, "package keys") {
		t.Errorf("message %q should say how to fix the key", msg)
	}
}

func TestListContractChecks(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		prefix string
		keys   []string
		want   string // in the error; "" means no error
	}{
		{"ordered", "a", []string{"a", "a/b", "ab"}, ""},
		{"out of order", "", []string{"b", "a"}, "out of ascending order"},
		{"repeat", "", []string{"a", "a"}, "twice"},
		{"outside prefix", "p/", []string{"p/a", "q"}, "outside the prefix"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			keys := c.keys
			db := mustNew(t, "fake", kv.Funcs{
				Put:  func(context.Context, string, []byte) error { return nil },
				List: func(context.Context, string) iter.Seq2[kv.Entry, error] { return seqOf(keys...) },
			})
			got, err := collect(db.List(ctx, c.prefix))
			gotKeys, kerr := collectKeys(db.ListKeys(ctx, c.prefix))
			if c.want == "" {
				if err != nil || kerr != nil || len(got) != len(keys) || len(gotKeys) != len(keys) {
					t.Errorf("List = %q, %v; ListKeys = %q, %v", got, err, gotKeys, kerr)
				}
				return
			}
			for _, e := range []error{err, kerr} {
				if !errors.Is(e, kv.ErrBrokenDriver) || !strings.Contains(e.Error(), c.want) {
					t.Errorf("listing %q = %v, want kv.ErrBrokenDriver saying %q", keys, e, c.want)
				}
			}
		})
	}
}

func collectKeys(seq iter.Seq2[string, error]) ([]string, error) {
	var keys []string
	for k, err := range seq {
		if err != nil {
			return keys, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func TestEmptyVersionIsBroken(t *testing.T) {
	store := memkv.NewStore()
	c := kv.CASFuncsOf(store)
	c.GetWithVersion = func(context.Context, string) ([]byte, kv.Version, error) { return []byte("v"), "", nil }
	c.PutIfAbsent = func(context.Context, string, []byte) (kv.Version, error) { return "", nil }
	c.PutIfVersion = func(context.Context, string, []byte, kv.Version) (kv.Version, error) { return "", nil }
	db := mustNew(t, "fake", kv.Funcs{Put: store.Put, CAS: c})
	ctx := context.Background()
	_, _, err1 := db.GetWithVersion(ctx, "k")
	_, err2 := db.PutIfAbsent(ctx, "k", nil)
	_, err3 := db.PutIfVersion(ctx, "k", nil, "1")
	for i, err := range []error{err1, err2, err3} {
		if !errors.Is(err, kv.ErrBrokenDriver) || !strings.Contains(err.Error(), "empty version") {
			t.Errorf("call %d returning an empty version = %v, want kv.ErrBrokenDriver", i, err)
		}
	}
}

func TestNilValuesAreEmpty(t *testing.T) {
	stored := []byte("not called")
	db := mustNew(t, "fake", kv.Funcs{
		Put:  func(_ context.Context, _ string, v []byte) error { stored = v; return nil },
		Get:  func(context.Context, string) ([]byte, error) { return nil, nil },
		List: func(context.Context, string) iter.Seq2[kv.Entry, error] { return seqOf("a") },
	})
	ctx := context.Background()
	if err := db.Put(ctx, "k", nil); err != nil || stored == nil || len(stored) != 0 {
		t.Errorf("Put(nil) passed %v to the driver (err %v), want a non-nil empty slice", stored, err)
	}
	if v, err := db.Get(ctx, "k"); err != nil || v == nil {
		t.Errorf("Get of a nil driver value = %v, %v; want a non-nil empty slice", v, err)
	}
	for e, err := range db.List(ctx, "") {
		if err != nil || e.Value == nil {
			t.Errorf("List entry %q value %v, %v; want a non-nil empty slice", e.Key, e.Value, err)
		}
	}
}

func TestContextCheckedFirst(t *testing.T) {
	called := false
	native := errors.New("native: i/o timeout")
	db := mustNew(t, "fake", kv.Funcs{
		Put: func(context.Context, string, []byte) error { called = true; return nil },
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := db.Put(ctx, "k", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Put with a canceled context = %v", err)
	}
	if called {
		t.Error("the driver was called with a canceled context")
	}
	// When the context ends during the call and the driver reports it
	// through its own error, the error matches both.
	ctx2, cancel2 := context.WithCancel(context.Background())
	db2 := mustNew(t, "fake", kv.Funcs{
		Put: func(context.Context, string, []byte) error { return nil },
		Get: func(context.Context, string) ([]byte, error) { cancel2(); return nil, native },
	})
	_, err := db2.Get(ctx2, "k")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, native) {
		t.Errorf("Get whose context ended mid-call = %v, want context.Canceled and the driver's error", err)
	}
}

// An error about an over-long key quotes the start of it and its length,
// not all of it.
func TestErrorCutsLongKeys(t *testing.T) {
	db := memkv.New()
	key := strings.Repeat("k", 10<<10)
	err := db.Put(context.Background(), key, nil)
	if !errors.Is(err, kv.ErrInvalidKey) {
		t.Fatalf("Put of a 10 KiB key = %v, want kv.ErrInvalidKey", err)
	}
	if msg := err.Error(); len(msg) > 400 || !strings.Contains(msg, "10240 bytes") || !strings.Contains(msg, "kkkk") {
		t.Errorf("the error is %d bytes (%.80q…); want the key cut, with its length named", len(msg), msg)
	}
	short := (&kv.Error{Driver: "d", Op: "get", Key: "é/x", Err: kv.ErrNotFound}).Error()
	if want := `d: get "é/x": kv: key not found`; short != want {
		t.Errorf("Error() = %q, want %q", short, want)
	}
	// Cut at a character boundary, never inside one.
	long := (&kv.Error{Driver: "d", Op: "get", Key: strings.Repeat("é", 200), Err: kv.ErrNotFound}).Error()
	if !utf8.ValidString(long) {
		t.Errorf("the cut key is not valid UTF-8: %q", long)
	}
}
