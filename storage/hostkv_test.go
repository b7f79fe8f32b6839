package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/storage"
)

func listKV(t *testing.T, h *storage.HostKV, prefix string) []string {
	t.Helper()
	var out []string
	for e, err := range h.List(context.Background(), prefix) {
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		out = append(out, e.Key+"="+string(e.Value))
	}
	return out
}

func TestHostKV(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	h := agent(t, define(t, storage.Config{Backend: be.Core()}), "support").KV()

	if err := h.Put(ctx, "alert-memory/abc", map[string]string{"updated": "now"}); err != nil {
		t.Fatal(err)
	}
	// The key of 02-keys.md, holding a versioned record.
	raw, err := be.store.Get(ctx, "agentkit/v1/support/kv/alert-memory%2Fabc")
	if err != nil {
		t.Fatalf("not stored at the spec's key: %v", err)
	}
	if string(raw) != `{"v":1,"key":"alert-memory/abc","value":{"updated":"now"}}` {
		t.Errorf("stored %s", raw)
	}
	got, err := h.Get(ctx, "alert-memory/abc")
	if err != nil || string(got) != `{"updated":"now"}` {
		t.Errorf("Get = %s, %v", got, err)
	}
	if err := h.Put(ctx, "raw", json.RawMessage(`[1, 2]`)); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.Get(ctx, "raw"); string(got) != `[1,2]` {
		t.Errorf("raw JSON round trip: %s", got)
	}
	if _, err := h.Get(ctx, "missing"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get(missing): %v, want kv.ErrNotFound", err)
	}
	if err := h.Delete(ctx, "raw"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Get(ctx, "raw"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get after Delete: %v", err)
	}
	if err := h.Delete(ctx, "raw"); err != nil {
		t.Errorf("Delete of a missing key: %v", err)
	}
}

func TestHostKVList(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	h := agent(t, define(t, storage.Config{Backend: be.Core()}), "support").KV()
	long := "alert-memory/" + strings.Repeat("z", 300) // stored under a digest
	longSha := "sha256" + strings.Repeat("y", 300)     // encodes with the digest prefix's letters
	for i, k := range []string{"alert-memory/b", "alert-memory/a", "alert-memoryx", "other", long, longSha, "sha256", "sha256:x"} {
		if err := h.Put(ctx, k, i); err != nil {
			t.Fatal(err)
		}
	}
	// Another agent's keys are never listed.
	if err := agent(t, define(t, storage.Config{Backend: be.Core()}), "support2").KV().Put(ctx, "alert-memory/c", 0); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		prefix string
		want   []string
	}{
		{"alert-memory/", []string{"alert-memory/a=1", "alert-memory/b=0", long + "=4"}},
		{"alert-memory", []string{"alert-memory/a=1", "alert-memory/b=0", "alert-memoryx=2", long + "=4"}},
		{"sha256", []string{"sha256=6", "sha256:x=7", longSha + "=5"}},
		{"nothing", nil},
	} {
		if got := listKV(t, h, tt.prefix); !slices.Equal(got, tt.want) {
			t.Errorf("List(%q) = %q, want %q", tt.prefix, got, tt.want)
		}
	}
	all := listKV(t, h, "")
	if len(all) != 8 {
		t.Errorf("List(\"\") = %q, want all 8 keys", all)
	}
	// A prefix too long to encode can only match digests.
	longPrefix := "alert-memory/" + strings.Repeat("z", 250)
	if got := listKV(t, h, longPrefix); !slices.Equal(got, []string{long + "=4"}) {
		t.Errorf("List(long prefix) = %q", got)
	}
	// A digest is found again by Get.
	if got, err := h.Get(ctx, long); err != nil || string(got) != "4" {
		t.Errorf("Get(long) = %s, %v", got, err)
	}
}

func TestHostKVErrors(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	h := agent(t, define(t, storage.Config{Backend: be.Core()}), "support").KV()

	// Awaited: the store's error comes back to the handler.
	boom := errors.New("connection reset")
	be.FailPut(boom)
	err := h.Put(ctx, "k", 1)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "agentkit/v1/support/kv/k") {
		t.Errorf("Put with a failing store: %v, want the store's error naming the key", err)
	}
	be.FailPut(nil)

	if err := h.Put(ctx, "", 1); !errors.Is(err, keys.ErrEmptySegment) || !strings.Contains(err.Error(), "host KV key is empty") {
		t.Errorf("Put(\"\"): %v", err)
	}
	if err := h.Put(ctx, "k", func() {}); err == nil || !strings.Contains(err.Error(), "does not encode as JSON") {
		t.Errorf("Put(func): %v", err)
	}
	if err := h.Put(ctx, "k", json.RawMessage(`{bad`)); err == nil {
		t.Error("Put of invalid raw JSON succeeded")
	}

	// A record under the wrong key is refused rather than misread.
	if err := be.store.Put(ctx, "agentkit/v1/support/kv/a", []byte(`{"v":1,"key":"b","value":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Get(ctx, "a"); !errors.Is(err, storage.ErrBadRecord) {
		t.Errorf("Get of a misplaced record: %v", err)
	}
	var listErr error
	for _, err := range h.List(ctx, "") {
		listErr = err
	}
	if !errors.Is(listErr, storage.ErrBadRecord) {
		t.Errorf("List over a misplaced record: %v", listErr)
	}

	// Missing capabilities are explained.
	putOnly := agent(t, define(t, storage.Config{Backend: be.Funcs("put"), Name: "putter"}), "support").KV()
	_, err = putOnly.Get(ctx, "k")
	checkUnsupported(t, "Get", err)
	checkUnsupported(t, "Delete", putOnly.Delete(ctx, "k"))
	for _, err := range putOnly.List(ctx, "") {
		checkUnsupported(t, "List", err)
	}
}

func checkUnsupported(t *testing.T, method string, err error) {
	t.Helper()
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "needs a backend with "+method) || !strings.Contains(err.Error(), `"putter"`) {
		t.Errorf("%s on a put-only backend: %v", method, err)
	}
}
