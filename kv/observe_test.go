package kv_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// seen records observations as "op key result".
type seen struct {
	mu  sync.Mutex
	ops []string
}

func (s *seen) observe(_ context.Context, o kv.Observation) {
	result := "ok"
	switch {
	case errors.Is(o.Err, kv.ErrNotFound):
		result = "not_found"
	case errors.Is(o.Err, kv.ErrConflict):
		result = "conflict"
	case o.Err != nil:
		var ke *kv.Error
		if !errors.As(o.Err, &ke) {
			result = "unwrapped error"
		} else {
			result = "error"
		}
	}
	if o.Duration < 0 {
		result += " negative duration"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, fmt.Sprintf("%s %s %s", o.Op, o.Key, result))
}

func (s *seen) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.ops
	s.ops = nil
	return out
}

func TestWithObserverReportsEveryOperationOnce(t *testing.T) {
	ctx := context.Background()
	store := memkv.NewStore()
	base := mustNew(t, "mem", store)
	var s seen
	db := base.WithObserver(s.observe)

	db.Put(ctx, "a", []byte("1"))
	db.Get(ctx, "a")
	db.Get(ctx, "missing")
	_, ver, _ := db.GetWithVersion(ctx, "a")
	db.PutIfAbsent(ctx, "a", nil)
	db.PutIfVersion(ctx, "a", []byte("2"), ver)
	db.Delete(ctx, "a")
	db.Put(ctx, "", nil) // refused before the backend: still observed
	for range db.List(ctx, "") {
	}
	db.Put(ctx, "b", nil)
	db.Put(ctx, "c", nil)
	for range db.ListKeys(ctx, "") {
		break // a listing stopped early is reported once, when it stops
	}
	want := []string{
		"put a ok", "get a ok", "get missing not_found", "get_with_version a ok",
		"put_if_absent a conflict", "put_if_version a ok", "delete a ok", "put  error",
		"list  ok", "put b ok", "put c ok", "list_keys  ok",
	}
	if got := s.take(); !slices.Equal(got, want) {
		t.Errorf("observed\n%q\nwant\n%q", got, want)
	}

	// The base handle is not observed, and shares the data.
	if v, err := base.Get(ctx, "b"); err != nil || len(v) != 0 {
		t.Errorf("base Get: %q %v", v, err)
	}
	if got := s.take(); len(got) != 0 {
		t.Errorf("the base handle was observed: %q", got)
	}
}

func TestWithObserverSharesTheBackendAndClosedState(t *testing.T) {
	ctx := context.Background()
	store := memkv.NewStore()
	base := mustNew(t, "mem", store)
	var first, second seen
	db := base.WithObserver(first.observe).WithObserver(second.observe)
	if db.Backend() != any(store) || db.Name() != "mem" || db.Capabilities().String() != base.Capabilities().String() {
		t.Errorf("observed handle: backend %T name %q caps %v", db.Backend(), db.Name(), db.Capabilities())
	}
	if base.WithObserver(nil) != base {
		t.Error("WithObserver(nil) made a new handle")
	}
	db.Put(ctx, "k", nil)
	if a, b := first.take(), second.take(); len(a) != 1 || len(b) != 1 {
		t.Errorf("chained observers saw %q and %q; want one operation each", a, b)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := base.Put(ctx, "k", nil); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Put on the base handle after closing the observed one: %v", err)
	}
	if err := base.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestWithObserverListErrorsAreReportedOnce(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	db := mustNew(t, "broken", kv.Funcs{
		Put: func(context.Context, string, []byte) error { return nil },
		List: func(context.Context, string) iter.Seq2[kv.Entry, error] {
			return func(yield func(kv.Entry, error) bool) {
				if yield(kv.Entry{Key: "a"}, nil) {
					yield(kv.Entry{}, boom)
				}
			}
		},
	})
	var s seen
	obs := db.WithObserver(s.observe)
	var errs []error
	for _, err := range obs.List(ctx, "") {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Fatalf("list errors %v", errs)
	}
	if got := s.take(); !slices.Equal(got, []string{"list  error"}) {
		t.Errorf("observed %q", got)
	}
}
