package kvtest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"agentkit/kv"
)

// batchChecks hold a backend that declares the batch capability
// (kv.Batcher) to its promise: the ops of a batch are applied in order and
// all together, or, when a condition fails, not at all.
func batchChecks() []check {
	return []check{
		{
			name:  "BatchAppliesEveryOpInOrder",
			rule:  "WriteBatch applies every op in order, each with the meaning of its method, and returns the version each put gave its key",
			needs: needCAS | needBatch,
			run:   checkBatchApplies,
		},
		{
			name:  "BatchIsAllOrNothing",
			rule:  "when a condition of a batch fails, WriteBatch applies none of its ops and returns a *kv.BatchError naming the op, matching kv.ErrConflict",
			needs: needCAS | needBatch,
			run:   checkBatchAllOrNothing,
		},
		{
			name:  "ConcurrentBatchesOneWinner",
			rule:  "of batches racing on one version of a key, exactly one is applied, whole; the others apply nothing",
			needs: needCAS | needBatch,
			run:   checkConcurrentBatches,
		},
	}
}

func checkBatchApplies(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	put(t, db, "batch/a", []byte("a0"))
	_, va, err := db.GetWithVersion(ctx, "batch/a")
	if err != nil {
		t.Fatal(err)
	}
	put(t, db, "batch/gone", []byte("x"))
	ops := []kv.BatchOp{
		{Kind: kv.BatchPutIfVersion, Key: "batch/a", Value: []byte("a1"), Version: va},
		{Kind: kv.BatchPutIfAbsent, Key: "batch/b", Value: []byte("b1")},
		{Kind: kv.BatchPut, Key: "batch/c", Value: []byte("c1")},
		{Kind: kv.BatchPut, Key: "batch/c", Value: []byte("c2")},
		{Kind: kv.BatchDelete, Key: "batch/gone"},
		{Kind: kv.BatchPut, Key: "batch/empty"},
	}
	vers, err := db.WriteBatch(ctx, ops)
	if err != nil {
		t.Fatalf("WriteBatch of a batch whose conditions hold: %v", err)
	}
	if len(vers) != len(ops) {
		t.Fatalf("WriteBatch returned %d versions for %d ops", len(vers), len(ops))
	}
	wantValue(t, db, "batch/a", []byte("a1"))
	wantValue(t, db, "batch/b", []byte("b1"))
	wantValue(t, db, "batch/c", []byte("c2"))
	wantValue(t, db, "batch/empty", []byte{})
	wantMissing(t, db, "batch/gone")
	seen := map[kv.Version]int{}
	for i, op := range ops {
		if op.Kind == kv.BatchDelete {
			continue
		}
		if vers[i] == "" || vers[i] == va {
			t.Errorf("op %d (%s %q) returned version %q; want a fresh one", i, op.Kind, op.Key, vers[i])
		}
		if j, dup := seen[vers[i]]; dup {
			t.Errorf("ops %d and %d returned the same version %q", j, i, vers[i])
		}
		seen[vers[i]] = i
	}
	for _, i := range []int{0, 1, 3, 5} { // the last write of each key
		_, ver, err := db.GetWithVersion(ctx, ops[i].Key)
		if err != nil || ver != vers[i] {
			t.Errorf("GetWithVersion(%q) after the batch: version %q (%v); want %q, the one WriteBatch returned", ops[i].Key, ver, err, vers[i])
		}
	}
	// The versions a batch returns are good for conditional writes.
	if _, err := db.PutIfVersion(ctx, "batch/b", []byte("b2"), vers[1]); err != nil {
		t.Errorf("PutIfVersion with the version a batch returned: %v", err)
	}
}

func checkBatchAllOrNothing(t testing.TB, s *suite) {
	db := s.store(t)
	ctx := t.Context()
	put(t, db, "all/a", []byte("a0"))
	_, va, err := db.GetWithVersion(ctx, "all/a")
	if err != nil {
		t.Fatal(err)
	}
	put(t, db, "all/exists", []byte("e0"))
	put(t, db, "all/keep", []byte("k0"))
	put(t, db, "all/moved", []byte("m0"))
	_, vm, err := db.GetWithVersion(ctx, "all/moved")
	if err != nil {
		t.Fatal(err)
	}
	put(t, db, "all/moved", []byte("m1"))
	cases := []struct {
		name   string
		ops    []kv.BatchOp
		index  int
		exists bool
	}{
		{
			name: "a PutIfAbsent of an existing key last",
			ops: []kv.BatchOp{
				{Kind: kv.BatchPutIfVersion, Key: "all/a", Value: []byte("a1"), Version: va},
				{Kind: kv.BatchPut, Key: "all/new", Value: []byte("n1")},
				{Kind: kv.BatchDelete, Key: "all/keep"},
				{Kind: kv.BatchPutIfAbsent, Key: "all/exists", Value: []byte("e1")},
			},
			index: 3, exists: true,
		},
		{
			name: "a PutIfVersion with a stale version in the middle",
			ops: []kv.BatchOp{
				{Kind: kv.BatchPut, Key: "all/new", Value: []byte("n1")},
				{Kind: kv.BatchPutIfVersion, Key: "all/moved", Value: []byte("m2"), Version: vm},
				{Kind: kv.BatchPutIfVersion, Key: "all/a", Value: []byte("a1"), Version: va},
			},
			index: 1,
		},
		{
			name: "a PutIfAbsent of a key the batch created before it",
			ops: []kv.BatchOp{
				{Kind: kv.BatchDelete, Key: "all/keep"},
				{Kind: kv.BatchPutIfAbsent, Key: "all/new", Value: []byte("n1")},
				{Kind: kv.BatchPutIfAbsent, Key: "all/new", Value: []byte("n2")},
			},
			index: 2, exists: true,
		},
		{
			name: "a PutIfVersion of a key the batch deleted before it",
			ops: []kv.BatchOp{
				{Kind: kv.BatchDelete, Key: "all/a"},
				{Kind: kv.BatchPutIfVersion, Key: "all/a", Value: []byte("a1"), Version: va},
			},
			index: 1,
		},
	}
	for _, c := range cases {
		_, err := db.WriteBatch(ctx, c.ops)
		var be *kv.BatchError
		switch {
		case err == nil:
			t.Errorf("%s: WriteBatch succeeded; want a conflict", c.name)
		case !errors.Is(err, kv.ErrConflict):
			t.Errorf("%s: %v; want an error matching kv.ErrConflict", c.name, err)
		case c.exists && !errors.Is(err, kv.ErrExists):
			t.Errorf("%s: %v; want an error matching kv.ErrExists too", c.name, err)
		case !errors.As(err, &be):
			t.Errorf("%s: %v; want a *kv.BatchError naming the op", c.name, err)
		case be.Index != c.index || be.Applied != 0:
			t.Errorf("%s: the error names op %d with %d applied; want op %d with none applied", c.name, be.Index, be.Applied, c.index)
		}
		// Nothing of the batch was applied.
		wantValue(t, db, "all/a", []byte("a0"))
		if _, ver, err := db.GetWithVersion(ctx, "all/a"); err != nil || ver != va {
			t.Errorf("%s: all/a has version %q after the failed batch (%v); want %q, untouched", c.name, ver, err, va)
		}
		wantValue(t, db, "all/exists", []byte("e0"))
		wantValue(t, db, "all/keep", []byte("k0"))
		wantValue(t, db, "all/moved", []byte("m1"))
		wantMissing(t, db, "all/new")
	}
}

func checkConcurrentBatches(t testing.TB, s *suite) {
	a, b := s.twoClients(t)
	ctx := t.Context()
	const rounds = 40
	for round := range rounds {
		head := fmt.Sprintf("race/%d/head", round)
		put(t, a, head, []byte("h0"))
		_, ver, err := a.GetWithVersion(ctx, head)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, db := range []*kv.DB{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = db.WriteBatch(ctx, []kv.BatchOp{
					{Kind: kv.BatchPutIfAbsent, Key: fmt.Sprintf("race/%d/part/%d", round, i), Value: []byte("p")},
					{Kind: kv.BatchPutIfVersion, Key: head, Value: []byte(fmt.Sprintf("h%d", i+1)), Version: ver},
				})
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won >= 0:
				t.Fatalf("round %d: both batches were applied over one version of the head", round)
			case err == nil:
				won = i
			case !errors.Is(err, kv.ErrConflict):
				t.Fatalf("round %d: batch %d failed with %v; want success or kv.ErrConflict", round, i, err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: neither batch was applied (%v, %v); exactly one must win", round, errs[0], errs[1])
		}
		wantValue(t, a, head, []byte(fmt.Sprintf("h%d", won+1)))
		wantValue(t, a, fmt.Sprintf("race/%d/part/%d", round, won), []byte("p"))
		wantMissing(t, a, fmt.Sprintf("race/%d/part/%d", round, 1-won))
	}
}
