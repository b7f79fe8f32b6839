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

	"agentkit/internal/storetest"
	"agentkit/keys"
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
	// casOf is a store's CAS group with no word on where it keeps its data,
	// as a user wiring methods by hand writes it.
	casOf := func(s *memkv.Store) kv.CASFuncs {
		return kv.CASFuncs{GetWithVersion: s.GetWithVersion, PutIfAbsent: s.PutIfAbsent, PutIfVersion: s.PutIfVersion, ListKeys: s.ListKeys}
	}

	tests := []struct {
		name    string
		backend any
		is      error
		want    []string
	}{
		{"memory driver whole (tests)", memkv.New(), nil, nil},
		{"memory store value", memkv.NewStore(), nil, nil},
		{"durable plain and CAS on the same store", withCAS(durable.Core(), casOf(durable.store)), nil, nil},
		// Another store's CAS methods, not marked process-local: only the
		// probe can tell.
		{"durable plain beside another store's CAS methods", withCAS(durable.Core(), casOf(memkv.NewStore())), storage.ErrSplitCAS,
			[]string{"the plain methods (Put, Get, Delete, List)", "the CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys)", "are not one store",
				"a key written with Put was not found by GetWithVersion", "a key written with PutIfAbsent was not found by Get", "same durable store"}},
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
	err := agent(t, b, "a").Sessions().PutToken(context.Background(), keys.TokenDigest("tok-s3cr3t"), "s1")
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "continuations/REDACTED") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("PutToken error %v: want the key named with the token redacted, and the cause", err)
	}
}

// TestCoordinationProbe: the start-up probe writes through each half and
// reads through the other, names the direction that failed, and leaves no
// probe key behind in a store that passes.
func TestCoordinationProbe(t *testing.T) {
	ctx := context.Background()
	a, b := memkv.NewStore(), memkv.NewStore()
	plainOf := func(s *memkv.Store) kv.Funcs {
		return kv.Funcs{Put: s.Put, Get: s.Get, Delete: s.Delete, List: s.List}
	}
	probeKeys := func(s *memkv.Store) []string {
		var out []string
		for k, err := range s.ListKeys(ctx, keys.ProbePrefix) {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, k)
		}
		return out
	}

	// One store: passes, and its probe keys are gone.
	same := plainOf(a)
	same.CAS = kv.CASFuncs{GetWithVersion: a.GetWithVersion, PutIfAbsent: a.PutIfAbsent, PutIfVersion: a.PutIfVersion, ListKeys: a.ListKeys}
	be := newBackend()
	recorded := be.Core()
	recorded.CAS = kv.CASFuncs{GetWithVersion: be.store.GetWithVersion, PutIfAbsent: be.store.PutIfAbsent, PutIfVersion: be.store.PutIfVersion, ListKeys: be.store.ListKeys}
	for name, backend := range map[string]kv.Funcs{"one store": same, "recorded": recorded} {
		if err := define(t, storage.Config{Backend: backend}).RequireCoordination(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := storage.CheckCoordination(backend); err != nil {
			t.Fatalf("%s, CheckCoordination: %v", name, err)
		}
	}
	if left := probeKeys(a); len(left) > 0 {
		t.Errorf("probe keys left behind: %v", left)
	}
	var probed []string
	for _, c := range be.Calls() {
		if strings.Contains(c, keys.ProbePrefix) {
			probed = append(probed, strings.Fields(c)[0])
		}
	}
	if strings.Join(probed, " ") != "put get delete delete put get delete delete" {
		t.Errorf("the plain calls of two probes on probe keys: %v; want put, get and two deletes each", probed)
	}

	// Each direction alone.
	for _, tc := range []struct {
		name         string
		cas          kv.CASFuncs
		want, reject string
	}{
		{"the CAS group writes elsewhere", kv.CASFuncs{GetWithVersion: a.GetWithVersion, PutIfAbsent: b.PutIfAbsent, PutIfVersion: b.PutIfVersion, ListKeys: a.ListKeys},
			"a key written with PutIfAbsent was not found by Get", "written with Put was not found"},
		{"the CAS group reads elsewhere", kv.CASFuncs{GetWithVersion: b.GetWithVersion, PutIfAbsent: a.PutIfAbsent, PutIfVersion: a.PutIfVersion, ListKeys: a.ListKeys},
			"a key written with Put was not found by GetWithVersion", "written with PutIfAbsent was not found"},
	} {
		f := plainOf(a)
		f.CAS = tc.cas
		for check, err := range map[string]error{
			"RequireCoordination": define(t, storage.Config{Backend: f, Name: "split"}).RequireCoordination(),
			"CheckCoordination":   storage.CheckCoordination(f),
		} {
			if !errors.Is(err, storage.ErrSplitCAS) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.reject) {
				t.Errorf("%s, %s: %v; want ErrSplitCAS saying %q only", tc.name, check, err, tc.want)
			}
		}
	}

	// A store that fails is reported as failing, not as split.
	be.FailPut(errors.New("connection refused"))
	err := define(t, storage.Config{Backend: recorded, Name: "down"}).RequireCoordination()
	if err == nil || errors.Is(err, storage.ErrSplitCAS) || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), `"down"`) {
		t.Errorf("a store whose Put fails: %v; want its error, naming the store", err)
	}
}

// TestCoordinationProbeOnRealStores: SQLite and PostgreSQL pass the probe,
// as a binding and as a separate coordination store, and keep no probe key.
func TestCoordinationProbeOnRealStores(t *testing.T) {
	for _, s := range storetest.Stores(t) {
		t.Run(s.Name, func(t *testing.T) {
			db := storetest.Open(t, s.URL)
			if err := define(t, storage.Config{Backend: db}).RequireCoordination(); err != nil {
				t.Fatal(err)
			}
			if err := storage.CheckCoordination(db); err != nil {
				t.Fatal(err)
			}
			for k, err := range db.ListKeys(context.Background(), keys.ProbePrefix) {
				if err != nil {
					t.Fatal(err)
				}
				t.Errorf("probe key left behind: %s", k)
			}
		})
	}
}
