package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

func TestMirrorWrites(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	b := define(t, storage.Config{Backend: db})
	b.Mirror(ctx, "agentkit/v1/a/sessions/s/meta", []byte(`{"v":1}`))
	got, err := db.Get(ctx, "agentkit/v1/a/sessions/s/meta")
	if err != nil || string(got) != `{"v":1}` {
		t.Errorf("mirrored value %s, %v", got, err)
	}
	if b.DroppedMirrorWrites() != 0 {
		t.Errorf("dropped %d", b.DroppedMirrorWrites())
	}
}

func TestMirrorDropsFailures(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	var logs logBuffer
	b := define(t, storage.Config{Backend: be.Core(), Name: "flaky", Logger: logs.Logger()})
	be.FailPut(errors.New("503 from upstream"))

	b.Mirror(ctx, "agentkit/v1/a/sessions/s/events/00000000000000000001", []byte("x"))
	b.Mirror(ctx, "", []byte("x")) // an invalid key is dropped the same way
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	be.FailPut(nil)
	b.Mirror(canceled, "agentkit/v1/a/continuations/t", []byte("s"))

	if n := b.DroppedMirrorWrites(); n != 3 {
		t.Fatalf("DroppedMirrorWrites = %d, want 3", n)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3: %s", len(lines), logs.String())
	}
	first := lines[0]
	if first["level"] != "WARN" || first["store"] != "flaky" ||
		first["key"] != "agentkit/v1/a/sessions/s/events/00000000000000000001" ||
		!strings.Contains(fmt.Sprint(first["err"]), "503 from upstream") || first["dropped_total"] != 1.0 {
		t.Errorf("log line %v: want a warning with store, key, error and count", first)
	}
	if !strings.Contains(fmt.Sprint(lines[1]["err"]), "key is empty") {
		t.Errorf("invalid key log %v", lines[1])
	}
	if !strings.Contains(fmt.Sprint(lines[2]["err"]), "context canceled") {
		t.Errorf("canceled log %v", lines[2])
	}
}

func TestMirrorConcurrent(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Core()})
	be.FailPut(errors.New("down"))
	a := agent(t, b, "a")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				b.Mirror(ctx, fmt.Sprintf("agentkit/v1/a/sessions/s%d/meta", i), nil)
				_ = a.Evals().Put(ctx, fmt.Sprintf("r%d-%d", i, j), json.RawMessage(`{}`))
			}
		})
	}
	wg.Wait()
	if n := b.DroppedMirrorWrites(); n != 400 {
		t.Errorf("DroppedMirrorWrites = %d, want 400", n)
	}
}

func TestRequireCoordination(t *testing.T) {
	durable := newBackend() // plain methods that do not claim process-local storage
	withCAS := func(f kv.Funcs, cas kv.CASFuncs) kv.Funcs { f.CAS = cas; return f }
	memStore := memkv.NewStore()

	tests := []struct {
		name    string
		backend any
		is      error
		want    []string
	}{
		{"memory driver whole (tests)", memkv.New(), nil, nil},
		{"memory store value", memkv.NewStore(), nil, nil},
		{"durable plain and CAS on the same store", withCAS(durable.Core(), kv.CASFuncs{
			GetWithVersion: memStore.GetWithVersion, PutIfAbsent: memStore.PutIfAbsent,
			PutIfVersion: memStore.PutIfVersion, ListKeys: memStore.ListKeys,
		}), nil, nil},
		{"no CAS", durable.Core(), storage.ErrNoCAS,
			[]string{"CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys)", "has none of them", "implement all four"}},
		{"CAS without Delete", withCAS(durable.Funcs("put", "get", "list"), kv.CASFuncsOf(durable.store)), storage.ErrNoCAS,
			[]string{"inbox payloads", "lacks Delete"}},
		{"durable plain beside memory CAS", withCAS(durable.Core(), kv.CASFuncsOf(memkv.NewStore())), storage.ErrSplitCAS,
			[]string{"process memory", "restart", "acknowledged events", "same durable store", "for tests"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := define(t, storage.Config{Backend: tt.backend, Name: "primary"})
			err := b.RequireCoordination()
			if tt.is == nil {
				if err != nil {
					t.Fatalf("RequireCoordination: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.is) {
				t.Fatalf("error %v, want %v", err, tt.is)
			}
			for _, w := range append(tt.want, `"primary"`) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}

	// Process-local plain methods beside a durable-looking CAS group.
	f := durable.Core()
	f.ProcessLocal = true
	f.CAS = kv.CASFuncsOf(durable.store)
	f.CAS.ProcessLocal = false
	err := define(t, storage.Config{Backend: f}).RequireCoordination()
	if !errors.Is(err, storage.ErrSplitCAS) || !strings.Contains(err.Error(), "inbox payloads they point to") {
		t.Errorf("process-local plain beside durable CAS: %v", err)
	}
}

func TestCheckCoordination(t *testing.T) {
	if err := storage.CheckCoordination(memkv.New()); err != nil {
		t.Errorf("memory store: %v", err)
	}
	for _, b := range []any{nil, (*kv.DB)(nil)} {
		if err := storage.CheckCoordination(b); !errors.Is(err, storage.ErrNoCAS) || !strings.Contains(err.Error(), "nil") {
			t.Errorf("CheckCoordination(%v): %v", b, err)
		}
	}
	db, err := kv.New("override", newBackend().Core())
	if err != nil {
		t.Fatal(err)
	}
	if err := storage.CheckCoordination(db); !errors.Is(err, storage.ErrNoCAS) || !strings.Contains(err.Error(), `"override"`) {
		t.Errorf("override without CAS: %v", err)
	}
}

func TestMirrorDropLogHidesContinuationTokens(t *testing.T) {
	be := newBackend()
	var logs logBuffer
	b := define(t, storage.Config{Backend: be.Core(), Logger: logs.Logger()})
	be.FailPut(errors.New("connection refused"))
	b.Mirror(context.Background(), "agentkit/v1/a/continuations/tok-s3cr3t", []byte("s"))
	if b.DroppedMirrorWrites() != 1 {
		t.Fatalf("dropped %d writes, want 1", b.DroppedMirrorWrites())
	}
	out := logs.String()
	if strings.Contains(out, "s3cr3t") || !strings.Contains(out, "continuations/REDACTED") {
		t.Errorf("the drop log must name the key with the token redacted; got %s", out)
	}
}
