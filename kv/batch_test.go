package kv_test

import (
	"context"
	"errors"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// TestWriteBatchFallsBackToOneByOne: without a Batcher the ops are applied
// one at a time; a failure stops the batch and says how many were applied.
func TestWriteBatchFallsBackToOneByOne(t *testing.T) {
	ctx := context.Background()
	store := memkv.NewStore()
	db := mustNew(t, "funcs", kv.Funcs{
		Put: store.Put, Get: store.Get, Delete: store.Delete, List: store.List,
		CAS: kv.CASFuncsOf(store),
	})
	if db.Capabilities().Batch {
		t.Fatal("a kv.Funcs reports the batch capability")
	}
	if err := db.Put(ctx, "k/exists", []byte("e")); err != nil {
		t.Fatal(err)
	}
	vers, err := db.WriteBatch(ctx, []kv.BatchOp{
		{Kind: kv.BatchPut, Key: "k/a", Value: []byte("a")},
		{Kind: kv.BatchPutIfAbsent, Key: "k/b", Value: []byte("b")},
		{Kind: kv.BatchDelete, Key: "k/exists"},
	})
	if err != nil || len(vers) != 3 || vers[1] == "" {
		t.Fatalf("a batch applied one by one: %v %v", vers, err)
	}
	_, err = db.WriteBatch(ctx, []kv.BatchOp{
		{Kind: kv.BatchPut, Key: "k/c", Value: []byte("c")},
		{Kind: kv.BatchPutIfAbsent, Key: "k/a", Value: []byte("a2")},
		{Kind: kv.BatchPut, Key: "k/d", Value: []byte("d")},
	})
	var be *kv.BatchError
	if !errors.Is(err, kv.ErrConflict) || !errors.Is(err, kv.ErrExists) || !errors.As(err, &be) || be.Index != 1 || be.Applied != 1 {
		t.Fatalf("a failed op 1: %v (%+v); want a conflict naming op 1 with one op applied", err, be)
	}
	if v, _ := db.Get(ctx, "k/c"); string(v) != "c" {
		t.Errorf("the op before the failure: %q; want it applied", v)
	}
	if _, err := db.Get(ctx, "k/d"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("the op after the failure: %v; want it not applied", err)
	}
}

// TestWriteBatchChecksEveryOpFirst: a bad op anywhere in the batch fails
// it before anything is written, whatever the backend.
func TestWriteBatchChecksEveryOpFirst(t *testing.T) {
	ctx := context.Background()
	store := memkv.NewStore()
	putOnly := mustNew(t, "putonly", kv.Funcs{Put: store.Put})
	full := mustNew(t, "mem", memkv.NewStore())
	if !full.Capabilities().Batch {
		t.Fatal("the memory driver does not report the batch capability")
	}
	for _, c := range []struct {
		name string
		db   *kv.DB
		op   kv.BatchOp
		want error
	}{
		{"an empty expected version", full, kv.BatchOp{Kind: kv.BatchPutIfVersion, Key: "x/v", Value: []byte("v")}, kv.ErrConflict},
		{"an invalid key", full, kv.BatchOp{Kind: kv.BatchPut, Key: "", Value: []byte("v")}, kv.ErrInvalidKey},
		{"a conditional write without the CAS group", putOnly, kv.BatchOp{Kind: kv.BatchPutIfAbsent, Key: "x/v"}, errors.ErrUnsupported},
		{"a delete without Delete", putOnly, kv.BatchOp{Kind: kv.BatchDelete, Key: "x/v"}, errors.ErrUnsupported},
		{"no kind", full, kv.BatchOp{Key: "x/v"}, nil},
	} {
		_, err := c.db.WriteBatch(ctx, []kv.BatchOp{{Kind: kv.BatchPut, Key: "x/first", Value: []byte("1")}, c.op})
		var be *kv.BatchError
		if err == nil || !errors.As(err, &be) || be.Index != 1 || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v; want an error naming op 1 (%v)", c.name, err, c.want)
		}
		if _, err := store.Get(ctx, "x/first"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("%s: the op before the bad one was written", c.name)
		}
		if v, _ := full.Get(ctx, "x/first"); v != nil {
			t.Errorf("%s: the op before the bad one was written", c.name)
		}
	}
	if vers, err := full.WriteBatch(ctx, nil); err != nil || vers != nil {
		t.Errorf("an empty batch: %v %v", vers, err)
	}
}
