package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

func listRuns(t *testing.T, e *storage.EvalRuns) []storage.EvalRun {
	t.Helper()
	var runs []storage.EvalRun
	for r, err := range e.List(context.Background()) {
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		runs = append(runs, r)
	}
	return runs
}

func runIDs(runs []storage.EvalRun) []string {
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestDerivedEvals(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Core()})
	a := agent(t, b, "support")
	e := a.Evals()
	if e.Mode() != storage.ModeDerived {
		t.Fatalf("mode %s", e.Mode())
	}
	for _, id := range []string{"run-2", "run-1", "run/3"} {
		if err := e.Put(ctx, id, json.RawMessage(`{"status":"running"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Upsert replaces.
	if err := e.Put(ctx, "run-1", json.RawMessage(`{"status":"finished"}`)); err != nil {
		t.Fatal(err)
	}

	// Exactly one key per run, at the key of 02-keys.md, as a versioned
	// record.
	var stored []string
	for ent, err := range be.store.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, ent.Key)
		var rec map[string]any
		if err := json.Unmarshal(ent.Value, &rec); err != nil || rec["v"] != 1.0 {
			t.Errorf("record at %s: %s (v must be 1)", ent.Key, ent.Value)
		}
	}
	want := []string{
		"agentkit/v1/support/eval-runs/run%2F3",
		"agentkit/v1/support/eval-runs/run-1",
		"agentkit/v1/support/eval-runs/run-2",
	}
	if !slices.Equal(stored, want) {
		t.Errorf("stored keys %q, want %q", stored, want)
	}

	runs := listRuns(t, e)
	if got := runIDs(runs); !slices.Equal(got, []string{"run/3", "run-1", "run-2"}) {
		t.Errorf("List ids %q", got)
	}
	if string(runs[1].Snapshot) != `{"status":"finished"}` || runs[1].Agent != "support" {
		t.Errorf("run-1 = %+v", runs[1])
	}

	// History survives a new binding over the same store (a restart), and
	// another agent's runs stay apart.
	b2 := define(t, storage.Config{Backend: be.Core()})
	if got := runIDs(listRuns(t, agent(t, b2, "support").Evals())); len(got) != 3 {
		t.Errorf("after restart: %q", got)
	}
	if got := listRuns(t, agent(t, b2, "support2").Evals()); len(got) != 0 {
		t.Errorf("another agent sees %d runs", len(got))
	}

	if err := e.Delete(ctx, "run-2"); err != nil {
		t.Fatal(err)
	}
	if err := e.Delete(ctx, "never-existed"); err != nil {
		t.Errorf("deleting a missing run: %v", err)
	}
	if got := runIDs(listRuns(t, e)); !slices.Equal(got, []string{"run/3", "run-1"}) {
		t.Errorf("after delete: %q", got)
	}
}

func TestEvalsInputErrors(t *testing.T) {
	ctx := context.Background()
	e := agent(t, define(t, storage.Config{Backend: memkv.NewStore()}), "a").Evals()
	for _, tt := range []struct {
		err  error
		want string
	}{
		{e.Put(ctx, "", json.RawMessage(`{}`)), "eval run id is empty"},
		{e.Put(ctx, "r", nil), "eval run snapshot is empty"},
		{e.Put(ctx, "r", json.RawMessage(`{"x":`)), "not valid JSON"},
		{e.Delete(ctx, ""), "eval run id is empty"},
	} {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("error %v, want one containing %q", tt.err, tt.want)
		}
	}
}

func TestMemoryEvals(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Funcs("put", "get")})
	e := agent(t, b, "a").Evals()
	if e.Mode() != storage.ModeMemory {
		t.Fatalf("mode %s, want memory", e.Mode())
	}
	snap := json.RawMessage(`{"n":1}`)
	if err := e.Put(ctx, "r2", snap); err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, "r1", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	snap[5] = '9' // the table keeps its own copy
	runs := listRuns(t, e)
	if got := runIDs(runs); !slices.Equal(got, []string{"r1", "r2"}) || string(runs[1].Snapshot) != `{"n":1}` {
		t.Errorf("runs %+v", runs)
	}
	if err := e.Delete(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if got := runIDs(listRuns(t, e)); !slices.Equal(got, []string{"r2"}) {
		t.Errorf("after delete %q", got)
	}
	if calls := be.Calls(); len(calls) != 0 {
		t.Errorf("memory eval table touched the backend: %q", calls)
	}
	// Lost on restart.
	if got := listRuns(t, agent(t, define(t, storage.Config{Backend: be.Funcs("put", "get")}), "a").Evals()); len(got) != 0 {
		t.Errorf("a new binding sees %d runs", len(got))
	}
	// Agents stay apart.
	if got := listRuns(t, agent(t, b, "b").Evals()); len(got) != 0 {
		t.Errorf("agent b sees %d runs", len(got))
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.Put(canceled, "r3", json.RawMessage(`{}`)); !errors.Is(err, context.Canceled) {
		t.Errorf("Put with a canceled context: %v", err)
	}
}

func TestNativeEvals(t *testing.T) {
	ctx := context.Background()
	native := &nativeEvals{}
	be := newBackend()
	e := agent(t, define(t, storage.Config{Backend: be.Core(), Evals: native}), "support").Evals()
	if err := e.Put(ctx, "r1", json.RawMessage(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	if len(native.runs) != 1 || native.runs[0].Agent != "support" || native.runs[0].ID != "r1" {
		t.Errorf("native table got %+v", native.runs)
	}
	if got := runIDs(listRuns(t, e)); !slices.Equal(got, []string{"r1"}) {
		t.Errorf("List %q", got)
	}
	if calls := be.Calls(); len(calls) != 0 {
		t.Errorf("native eval table: the core was used too: %q", calls)
	}
}

// TestNewerFormatRefused writes records of a format version newer than
// this build's where each derived table reads, and checks every reader
// refuses them clearly.
func TestNewerFormatRefused(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	a := agent(t, define(t, storage.Config{Backend: db}), "support")
	for key, v := range map[string]int{
		"agentkit/v1/support/eval-runs/r": 3, // 2 is a run with case pages
		"agentkit/v1/support/ab-snapshot": 2,
		"agentkit/v1/support/kv/k":        2,
	} {
		newer := fmt.Appendf(nil, `{"v":%d,"runId":"r","snapshot":{},"key":"k","value":1}`, v)
		if err := db.Put(ctx, key, newer); err != nil {
			t.Fatal(err)
		}
	}
	checkV := func(what string, v int, err error) {
		t.Helper()
		if !errors.Is(err, storage.ErrNewerFormat) || !strings.Contains(err.Error(), fmt.Sprintf("format version %d", v)) || !strings.Contains(err.Error(), "upgrade agentkit") {
			t.Errorf("%s: error %v, want ErrNewerFormat saying to upgrade", what, err)
		}
	}
	check := func(what string, err error) { t.Helper(); checkV(what, 2, err) }
	var listErr error
	for _, err := range a.Evals().List(ctx) {
		listErr = err
	}
	checkV("eval List", 3, listErr)
	_, err := a.ABs().GetSnapshot(ctx)
	check("GetSnapshot", err)
	_, err = a.KV().Get(ctx, "k")
	check("host KV Get", err)
	for _, err := range a.KV().List(ctx, "") {
		listErr = err
	}
	check("host KV List", listErr)
}

func TestBadRecords(t *testing.T) {
	ctx := context.Background()
	db := memkv.New()
	a := agent(t, define(t, storage.Config{Backend: db}), "a")
	for _, tt := range []struct{ value, want string }{
		{`not json`, "not a JSON object"},
		{`{"runId":"r"}`, `no format version ("v")`},
		{`{"v":0}`, "format version 0"},
		{`{"v":1,"snapshot":5,"runId":7}`, "does not decode"},
	} {
		if err := db.Put(ctx, "agentkit/v1/a/eval-runs/r", []byte(tt.value)); err != nil {
			t.Fatal(err)
		}
		var got error
		for _, err := range a.Evals().List(ctx) {
			got = err
		}
		if !errors.Is(got, storage.ErrBadRecord) || !strings.Contains(got.Error(), tt.want) || !strings.Contains(got.Error(), "agentkit/v1/a/eval-runs/r") {
			t.Errorf("record %s: error %v, want ErrBadRecord naming the key and %q", tt.value, got, tt.want)
		}
	}
}

func TestDerivedABSamplesAreBlindPuts(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Core()})
	abs := agent(t, b, "support").ABs()
	at := time.Date(2024, 5, 1, 12, 30, 0, 123_456_789, time.UTC)
	abs.PutSample(ctx, storage.ABSample{Experiment: "tone", Variant: "warm", SessionID: "C1/t 1", At: at, Metrics: json.RawMessage(`{"turns":1}`)})
	abs.PutSample(ctx, storage.ABSample{Experiment: "tone", Variant: "warm", SessionID: "C1/t 1", At: at.Add(time.Second), Metrics: json.RawMessage(`{"turns":2}`)})

	want := []string{
		"put agentkit/v1/support/ab-samples/tone/C1%2Ft%201/2024-05-01T12%3A30%3A00.123Z",
		"put agentkit/v1/support/ab-samples/tone/C1%2Ft%201/2024-05-01T12%3A30%3A01.123Z",
	}
	if got := be.Calls(); !slices.Equal(got, want) {
		t.Errorf("backend calls %q, want exactly the two blind puts %q", got, want)
	}
	if b.DroppedMirrorWrites() != 0 {
		t.Errorf("dropped %d", b.DroppedMirrorWrites())
	}
	raw, err := be.store.Get(ctx, strings.TrimPrefix(want[0], "put "))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	wantRec := map[string]any{"v": 1.0, "agent": "support", "experiment": "tone", "variant": "warm",
		"sessionId": "C1/t 1", "at": "2024-05-01T12:30:00.123Z", "metrics": map[string]any{"turns": 1.0}}
	for k, v := range wantRec {
		if got, _ := json.Marshal(rec[k]); string(got) != string(must(json.Marshal(v))) {
			t.Errorf("record field %s = %s, want %v", k, got, v)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestABSampleFailuresAreDropped(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	var logs logBuffer
	b := define(t, storage.Config{Backend: be.Core(), Logger: logs.Logger()})
	abs := agent(t, b, "support").ABs()
	be.FailPut(errors.New("disk on fire"))
	abs.PutSample(ctx, storage.ABSample{Experiment: "e", SessionID: "s", At: time.Unix(0, 0), Metrics: json.RawMessage(`{}`)})
	abs.PutSample(ctx, storage.ABSample{Experiment: "", SessionID: "s", At: time.Unix(0, 0), Metrics: json.RawMessage(`{}`)})
	abs.PutSample(ctx, storage.ABSample{Experiment: "e", SessionID: "s", Metrics: json.RawMessage(`{}`)})
	abs.PutSample(ctx, storage.ABSample{Experiment: "e", At: time.Unix(0, 0), Metrics: json.RawMessage(`{}`)})
	abs.PutSample(ctx, storage.ABSample{Experiment: "e", SessionID: "s", At: time.Unix(0, 0)})
	if n := b.DroppedMirrorWrites(); n != 5 {
		t.Errorf("dropped %d, want 5", n)
	}
	out := logs.String()
	for _, w := range []string{
		"disk on fire", "agentkit/v1/support/ab-samples/e/s/1970-01-01T00%3A00%3A00.000Z",
		"has no Experiment", "has no At time", "has no SessionID", "metrics is empty",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s", w, out)
		}
	}
}

func TestDerivedABSnapshot(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	abs := agent(t, define(t, storage.Config{Backend: be.Core()}), "support").ABs()
	if _, err := abs.GetSnapshot(ctx); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("GetSnapshot before any Put: %v, want kv.ErrNotFound", err)
	}
	for _, s := range []string{`{"variants":1}`, `{"variants":2}`} {
		if err := abs.PutSnapshot(ctx, json.RawMessage(s)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := abs.GetSnapshot(ctx)
	if err != nil || string(got) != `{"variants":2}` {
		t.Errorf("GetSnapshot = %s, %v; want the last write", got, err)
	}
	if err := abs.PutSnapshot(ctx, nil); err == nil || !strings.Contains(err.Error(), "A/B snapshot is empty") {
		t.Errorf("PutSnapshot(nil): %v", err)
	}
	calls := be.Calls()
	if calls[1] != "put agentkit/v1/support/ab-snapshot" {
		t.Errorf("calls %q: snapshot must be a Put of ab-snapshot", calls)
	}

	// Put-only backends can write the snapshot but not read it.
	putOnly := agent(t, define(t, storage.Config{Backend: be.Funcs("put")}), "support").ABs()
	if err := putOnly.PutSnapshot(ctx, json.RawMessage(`{}`)); err != nil {
		t.Errorf("PutSnapshot on a put-only backend: %v", err)
	}
	if _, err := putOnly.GetSnapshot(ctx); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "needs a backend with Get") {
		t.Errorf("GetSnapshot without Get: %v", err)
	}
}

func TestNativeABs(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	plain := &nativeABs{}
	abs := agent(t, define(t, storage.Config{Backend: be.Core(), ABs: plain}), "support").ABs()
	at := time.Now()
	abs.PutSample(ctx, storage.ABSample{Agent: "ignored", Experiment: "e", SessionID: "s", At: at, Metrics: json.RawMessage(`{}`)})
	if len(plain.samples) != 1 || plain.samples[0].Agent != "support" || !plain.samples[0].At.Equal(at) {
		t.Errorf("native table got %+v", plain.samples)
	}
	// Without native snapshot methods the snapshot is stored over the core.
	if err := abs.PutSnapshot(ctx, json.RawMessage(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if got := be.Calls(); !slices.Equal(got, []string{"put agentkit/v1/support/ab-snapshot"}) {
		t.Errorf("calls %q", got)
	}

	full := &nativeABsWithSnapshot{snap: map[string]json.RawMessage{}}
	abs = agent(t, define(t, storage.Config{Backend: be.Core(), ABs: full}), "support").ABs()
	if err := abs.PutSnapshot(ctx, json.RawMessage(`{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := abs.GetSnapshot(ctx); err != nil || string(got) != `{"b":2}` || string(full.snap["support"]) != `{"b":2}` {
		t.Errorf("native snapshot: %s, %v", got, err)
	}
	if abs.Mode() != storage.ModeNative {
		t.Errorf("mode %s", abs.Mode())
	}
}

func TestStoreErrorsReachCallers(t *testing.T) {
	ctx := context.Background()
	be := newBackend()
	f := be.Core()
	boom := errors.New("list timed out")
	f.List = func(context.Context, string) iter.Seq2[kv.Entry, error] {
		return func(yield func(kv.Entry, error) bool) { yield(kv.Entry{}, boom) }
	}
	a := agent(t, define(t, storage.Config{Backend: f}), "a")
	var got error
	for _, err := range a.Evals().List(ctx) {
		got = err
	}
	if !errors.Is(got, boom) || !strings.Contains(got.Error(), "agentkit/v1/a/eval-runs/") {
		t.Errorf("eval List over a failing store: %v, want the store's error naming the prefix", got)
	}
	for _, err := range a.KV().List(ctx, "") {
		got = err
	}
	if !errors.Is(got, boom) {
		t.Errorf("host KV List over a failing store: %v", got)
	}
	be.FailPut(boom)
	if err := a.Evals().Put(ctx, "r", json.RawMessage(`{}`)); !errors.Is(err, boom) {
		t.Errorf("eval Put over a failing store: %v", err)
	}
	if err := a.ABs().PutSnapshot(ctx, json.RawMessage(`{}`)); !errors.Is(err, boom) {
		t.Errorf("PutSnapshot over a failing store: %v", err)
	}
}
