package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

func TestDroppedSamplesCountedConcurrently(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Core()})
	be.FailPut(errors.New("down"))
	a := agent(t, b, "a")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				a.ABs().PutSample(ctx, storage.ABSample{Experiment: "e", SessionID: fmt.Sprintf("s%d", i), At: time.Unix(int64(j), 0), Metrics: json.RawMessage(`{}`)})
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

func TestTokenErrorsHideTheToken(t *testing.T) {
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Core()})
	be.FailPut(errors.New("connection refused"))
	err := agent(t, b, "a").Sessions().PutToken(context.Background(), "tok-s3cr3t", "s1")
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "continuations/REDACTED") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("PutToken error %v: want the key named with the token redacted, and the cause", err)
	}
}
