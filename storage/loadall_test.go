package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"reflect"
	"strings"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/record"
	"agentkit/storage"
)

// TestLoadAllReadsWhatLoadReads: one List over a session's folder gives
// the same session as Load's reads one by one: chained batches with an
// unlinked one among them, a batch in parts, a session from before heads,
// a deleted one, a missing one; and a batch the listing missed is read on
// its own.
func TestLoadAllReadsWhatLoadReads(t *testing.T) {
	ctx := context.Background()
	store := limited{memkv.NewStore(), 64 << 10}
	b := define(t, storage.Config{Backend: store})
	s := agent(t, b, "a").Sessions()
	put := func(k, v string) {
		if err := store.Store.Put(ctx, "agentkit/v1/a/sessions/"+k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// chained: three batches, the second in parts, an unlinked one.
	var base storage.BatchRef
	for i, ev := range []string{`{"seq":1}`, fmt.Sprintf(`{"seq":2,"output":%q}`, strings.Repeat("x", 200<<10)), `{"seq":3}`} {
		req := storage.CommitRequest{Writer: "A", Base: base, BatchID: storage.NewBatchID(), Meta: storage.SessionMeta{ID: "chained", LastSeq: int64(i + 1)}, Events: []json.RawMessage{json.RawMessage(ev)}}
		res, err := s.Commit(ctx, req)
		if err != nil || res.Outcome != storage.Committed {
			t.Fatalf("commit %d: %+v %v", i, res, err)
		}
		base = res.Batch
		if i == 1 {
			dead, _ := record.Marshal(storage.KindEventBatch, storage.Batch{SessionID: "chained", Number: base.Number + 1, ID: "dead", Prev: base.Number, PrevID: base.ID, Events: []json.RawMessage{json.RawMessage(`{"seq":3,"by":"dead"}`)}})
			put(fmt.Sprintf("chained/events/%020d", base.Number+1), string(dead))
		}
	}
	put("legacy/meta", `{"v":1,"id":"legacy","channelId":"http","createdAt":"2026-01-01T00:00:00Z","updatedAt":"2026-01-01T00:00:00Z","turns":2,"lastSeq":2,"batches":3,"continuationToken":"t"}`)
	put("legacy/events/00000000000000000001", `{"v":1,"sessionId":"legacy","batch":1,"events":[{"seq":1}]}`)
	put("legacy/events/00000000000000000003", `{"v":1,"sessionId":"legacy","batch":3,"events":[{"seq":2}]}`)
	if _, err := s.Commit(ctx, storage.CommitRequest{Writer: "A", BatchID: storage.NewBatchID(), Meta: storage.SessionMeta{ID: "gone", LastSeq: 1}, Events: []json.RawMessage{json.RawMessage(`{"seq":1}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, storage.Head{SessionMeta: storage.SessionMeta{ID: "gone"}, Writer: "A"}, ""); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"chained", "legacy", "gone", "missing"} {
		want, werr := s.Load(ctx, id, storage.BatchRef{})
		got, gerr := s.LoadAll(ctx, id)
		if !sameErr(werr, gerr) {
			t.Errorf("%s: LoadAll: %v; Load: %v", id, gerr, werr)
			continue
		}
		if werr == nil && (!reflect.DeepEqual(got.Head, want.Head) || !reflect.DeepEqual(got.Batches, want.Batches)) {
			t.Errorf("%s: LoadAll read %d batches, head %+v; Load %d batches, head %+v", id, len(got.Batches), got.Head, len(want.Batches), want.Head)
		}
	}
	// A batch the listing missed: LoadAll of a store whose List leaves
	// out batch 1 still reads it.
	hiding := kv.Funcs{
		Put: store.Put, Get: store.Get, Delete: store.Delete,
		List: func(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
			return func(yield func(kv.Entry, error) bool) {
				for e, err := range store.Store.List(ctx, p) {
					if strings.HasSuffix(e.Key, "/events/00000000000000000001") {
						continue
					}
					if !yield(e, err) {
						return
					}
				}
			}
		},
	}
	hs := agent(t, define(t, storage.Config{Backend: hiding}), "a").Sessions()
	got, err := hs.LoadAll(ctx, "chained")
	if err != nil || len(got.Batches) != 3 {
		t.Errorf("LoadAll with a batch missing from the listing: %d batches, %v", len(got.Batches), err)
	}
}

func sameErr(a, b error) bool {
	switch {
	case a == nil || b == nil:
		return a == nil && b == nil
	case errors.Is(a, storage.ErrSessionDeleted):
		return errors.Is(b, storage.ErrSessionDeleted)
	case errors.Is(a, kv.ErrNotFound):
		return errors.Is(b, kv.ErrNotFound)
	}
	return a.Error() == b.Error()
}
