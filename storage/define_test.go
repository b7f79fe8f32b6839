package storage_test

import (
	"context"
	"encoding/json"
	"iter"
	"reflect"
	"strings"
	"testing"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

// onlyGet is a backend with Get and no Put.
type onlyGet struct{}

func (onlyGet) Get(context.Context, string) ([]byte, error) { return nil, kv.ErrNotFound }

// halfCAS has Put and half of the CAS group.
type halfCAS struct{ onlyGet }

func (halfCAS) Put(context.Context, string, []byte) error { return nil }
func (halfCAS) GetWithVersion(context.Context, string) ([]byte, kv.Version, error) {
	return nil, "", kv.ErrNotFound
}
func (halfCAS) PutIfAbsent(context.Context, string, []byte) (kv.Version, error) { return "1", nil }

// TestDefineErrors covers every error Define returns, checking that each
// message names what to fix.
func TestDefineErrors(t *testing.T) {
	mem := memkv.NewStore()
	tests := []struct {
		name string
		cfg  storage.Config
		want []string // substrings of the message
	}{
		{"nil backend", storage.Config{},
			[]string{"Config.Backend is nil", "kv.Open", "kv.Funcs", "Put(ctx, key, value) error"}},
		{"typed nil backend", storage.Config{Backend: (*memkv.Store)(nil)},
			[]string{"Config.Backend is a nil *memkv.Store", "opened store"}},
		{"nil *kv.DB", storage.Config{Backend: (*kv.DB)(nil)},
			[]string{"Config.Backend is a nil *kv.DB"}},
		{"no Put method", storage.Config{Backend: onlyGet{}},
			[]string{"storage_test.onlyGet", "has no Put method", "Put(ctx context.Context, key string, value []byte) error"}},
		{"kv.Funcs without Put", storage.Config{Backend: kv.Funcs{Get: mem.Get}},
			[]string{"kv.Funcs whose Put field is nil", "set Put"}},
		{"partial CAS methods", storage.Config{Backend: halfCAS{}},
			[]string{"partial CAS group", "missing PutIfVersion, ListKeys", "set all four methods", "or none"}},
		{"partial CAS fields", storage.Config{Backend: kv.Funcs{Put: mem.Put, CAS: kv.CASFuncs{PutIfVersion: mem.PutIfVersion}}},
			[]string{"missing GetWithVersion, PutIfAbsent, ListKeys", "fields of kv.Funcs.CAS"}},
		{"negative debounce", storage.Config{Backend: mem, Policy: storage.Policy{Debounce: -time.Second}},
			[]string{"Policy.Debounce is -1s", "use 0", "positive duration"}},
		{"negative max sessions", storage.Config{Backend: mem, Policy: storage.Policy{Restore: storage.RestorePolicy{MaxSessions: -1}}},
			[]string{"Policy.Restore.MaxSessions is -1", "default (1000)", "Restore.Off"}},
		{"negative max age", storage.Config{Backend: mem, Policy: storage.Policy{Restore: storage.RestorePolicy{MaxAge: -time.Hour}}},
			[]string{"Policy.Restore.MaxAge is -1h0m0s", "default (30 days)"}},
		{"negative max bytes", storage.Config{Backend: mem, Policy: storage.Policy{Restore: storage.RestorePolicy{MaxTotalBytes: -5}}},
			[]string{"Policy.Restore.MaxTotalBytes is -5", "default (1 GiB)"}},
		{"nil native evals", storage.Config{Backend: mem, Evals: (*nativeEvals)(nil)},
			[]string{"Config.Evals is a nil *storage_test.nativeEvals", "leave Config.Evals unset"}},
		{"nil native abs", storage.Config{Backend: mem, ABs: (*nativeABs)(nil)},
			[]string{"Config.ABs is a nil *storage_test.nativeABs", "leave Config.ABs unset"}},
		{"several problems at once", storage.Config{Backend: onlyGet{}, Policy: storage.Policy{Debounce: -1}},
			[]string{"has no Put method", "Policy.Debounce"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := storage.Define(tt.cfg)
			if err == nil {
				t.Fatalf("Define succeeded: %+v", b.Report())
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestDefineBackendKinds(t *testing.T) {
	db := memkv.New()
	for _, tt := range []struct {
		name     string
		backend  any
		wantName string
		wantCaps string
	}{
		{"*kv.DB", db, "mem", "put,get,delete,list,list-after,cas"},
		{"driver value", memkv.NewStore(), "custom", "put,get,delete,list,list-after,cas"},
		{"kv.Funcs", newBackend().Funcs("put", "get"), "custom", "put,get"},
		{"*kv.Funcs", &kv.Funcs{Put: db.Put}, "custom", "put"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := define(t, storage.Config{Backend: tt.backend})
			if b.Name() != tt.wantName || b.Capabilities().String() != tt.wantCaps {
				t.Errorf("name %q caps %s, want %q %s", b.Name(), b.Capabilities(), tt.wantName, tt.wantCaps)
			}
		})
	}
	if b := define(t, storage.Config{Backend: db, Name: "billing-db"}); b.Name() != "billing-db" || b.DB() != db {
		t.Errorf("Name = %q, DB = %p, want billing-db and the given *kv.DB", b.Name(), b.DB())
	}
}

func TestPolicyDefaults(t *testing.T) {
	b := define(t, storage.Config{Backend: memkv.NewStore()})
	want := storage.Policy{Restore: storage.RestorePolicy{
		MaxSessions: 1000, MaxAge: 30 * 24 * time.Hour, MaxTotalBytes: 1 << 30,
	}}
	if got := b.Policy(); got != want {
		t.Errorf("default policy %+v, want %+v", got, want)
	}
	if !b.RestoreAtStart() {
		t.Error("memory store with defaults should restore at start")
	}

	custom := storage.Policy{Debounce: 30 * time.Second, Restore: storage.RestorePolicy{MaxSessions: 500}}
	b = define(t, storage.Config{Backend: memkv.NewStore(), Policy: custom})
	got := b.Policy()
	if got.Debounce != 30*time.Second || got.Restore.MaxSessions != 500 || got.Restore.MaxAge != storage.DefaultRestoreMaxAge || got.Restore.MaxTotalBytes != storage.DefaultRestoreMaxTotalBytes {
		t.Errorf("policy %+v: set fields must be kept, zero fields defaulted", got)
	}

	b = define(t, storage.Config{Backend: memkv.NewStore(), Policy: storage.Policy{Restore: storage.RestorePolicy{Off: true}}})
	if b.RestoreAtStart() {
		t.Error("Restore.Off must disable restore at start")
	}
	b = define(t, storage.Config{Backend: newBackend().Funcs("put", "get")})
	if b.RestoreAtStart() {
		t.Error("a backend without List cannot restore at start")
	}
}

func TestReportJSON(t *testing.T) {
	b := define(t, storage.Config{Backend: memkv.New(), Policy: storage.Policy{Debounce: 1500 * time.Millisecond}})
	data, err := json.Marshal(b.Report())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"name": "mem", "put": true, "get": true, "delete": true, "list": true, "cas": true,
		"processLocal": true, "evals": "derived", "abs": "derived", "abSnapshot": "derived",
		"debounceMs": 1500.0,
		"restore": map[string]any{
			"off": false, "atStart": true, "maxSessions": 1000.0,
			"maxAgeMs": float64((30 * 24 * time.Hour).Milliseconds()), "maxTotalBytes": float64(1 << 30),
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("report JSON\n got %s\nwant %v", data, want)
	}
}

// nativeEvals is a stand-in native table that records what it is given.
type nativeEvals struct{ runs []storage.EvalRun }

func (n *nativeEvals) PutRun(_ context.Context, r storage.EvalRun) error {
	n.runs = append(n.runs, r)
	return nil
}
func (n *nativeEvals) DeleteRun(context.Context, string, string) error { return nil }
func (n *nativeEvals) ListRuns(_ context.Context, agent string) iter.Seq2[storage.EvalRun, error] {
	return func(yield func(storage.EvalRun, error) bool) {
		for _, r := range n.runs {
			if r.Agent == agent && !yield(r, nil) {
				return
			}
		}
	}
}

type nativeABs struct{ samples []storage.ABSample }

func (n *nativeABs) PutSample(_ context.Context, s storage.ABSample) error {
	n.samples = append(n.samples, s)
	return nil
}

type nativeABsWithSnapshot struct {
	nativeABs
	snap map[string]json.RawMessage
}

func (n *nativeABsWithSnapshot) PutSnapshot(_ context.Context, agent string, s json.RawMessage) error {
	n.snap[agent] = s
	return nil
}
func (n *nativeABsWithSnapshot) GetSnapshot(_ context.Context, agent string) (json.RawMessage, error) {
	s, ok := n.snap[agent]
	if !ok {
		return nil, kv.ErrNotFound
	}
	return s, nil
}

func TestModes(t *testing.T) {
	be := newBackend()
	for _, tt := range []struct {
		name                  string
		cfg                   storage.Config
		evals, abs, abSnap    storage.Mode
		logsMemoryEvalWarning bool
	}{
		{"full core", storage.Config{Backend: be.Core()}, "derived", "derived", "derived", false},
		{"no list", storage.Config{Backend: be.Funcs("put", "get", "delete")}, "memory", "derived", "derived", true},
		{"no delete", storage.Config{Backend: be.Funcs("put", "get", "list")}, "memory", "derived", "derived", true},
		{"put only", storage.Config{Backend: be.Funcs("put")}, "memory", "derived", "derived", true},
		{"native evals on put only", storage.Config{Backend: be.Funcs("put"), Evals: &nativeEvals{}}, "native", "derived", "derived", false},
		{"native abs", storage.Config{Backend: be.Core(), ABs: &nativeABs{}}, "derived", "native", "derived", false},
		{"native abs with snapshot", storage.Config{Backend: be.Core(), ABs: &nativeABsWithSnapshot{}}, "derived", "native", "native", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs logBuffer
			tt.cfg.Logger = logs.Logger()
			r := define(t, tt.cfg).Report()
			if r.Evals != tt.evals || r.ABs != tt.abs || r.ABSnapshot != tt.abSnap {
				t.Errorf("modes evals=%s abs=%s abSnapshot=%s, want %s %s %s", r.Evals, r.ABs, r.ABSnapshot, tt.evals, tt.abs, tt.abSnap)
			}
			warned := strings.Contains(logs.String(), "lost on restart")
			if warned != tt.logsMemoryEvalWarning {
				t.Errorf("memory-eval warning logged = %v, want %v (log: %s)", warned, tt.logsMemoryEvalWarning, logs.String())
			}
		})
	}
}

func TestAgentName(t *testing.T) {
	b := define(t, storage.Config{Backend: memkv.NewStore()})
	if _, err := b.Agent(""); err == nil || !strings.Contains(err.Error(), "agent name is empty") {
		t.Errorf("Agent(\"\") error = %v", err)
	}
	a := agent(t, b, "support")
	if a.Name() != "support" || a.Keys().Prefix() != "agentkit/v1/support/" || a.Binding() != b {
		t.Errorf("AgentStore: name %q prefix %q", a.Name(), a.Keys().Prefix())
	}
}
