package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"agentkit/internal/storetest"
	"agentkit/storage"
)

// counter is an update adding one to a JSON number (0 when absent).
func counter(old json.RawMessage) (json.RawMessage, error) {
	n := 0
	if old != nil {
		if err := json.Unmarshal(old, &n); err != nil {
			return nil, err
		}
	}
	return json.RawMessage(strconv.Itoa(n + 1)), nil
}

func TestUpdatesOnACASStoreNeverLoseAWrite(t *testing.T) {
	for _, s := range storetest.Stores(t) {
		t.Run(s.Name, func(t *testing.T) {
			const hosts, each = 6, 15
			var evalTables []*storage.EvalRuns
			var abTables []*storage.ABs
			for range hosts { // a store handle per host, as separate processes have
				b := define(t, storage.Config{Backend: storetest.Open(t, s.URL), Logger: slog.New(slog.DiscardHandler)})
				a := agent(t, b, "support")
				evalTables = append(evalTables, a.Evals())
				abTables = append(abTables, a.ABs())
			}
			var wg sync.WaitGroup
			errs := make(chan error, 2*hosts*each)
			for h := range hosts {
				wg.Go(func() {
					for range each {
						errs <- evalTables[h].Update(context.Background(), "run-1", counter)
						errs <- abTables[h].UpdateSnapshot(context.Background(), counter)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			runs := listRuns(t, evalTables[0])
			if len(runs) != 1 || string(runs[0].Snapshot) != strconv.Itoa(hosts*each) {
				t.Errorf("eval run after %d concurrent increments: %v; an update was lost", hosts*each, runs)
			}
			snap, err := abTables[0].GetSnapshot(context.Background())
			if err != nil || string(snap) != strconv.Itoa(hosts*each) {
				t.Errorf("A/B snapshot after %d concurrent increments: %s %v; an update was lost", hosts*each, snap, err)
			}
		})
	}
}

func TestUpdateSkipsAndWorksOnNativeTables(t *testing.T) {
	n := storetest.NewNative()
	b := define(t, storage.Config{Backend: newBackend().Core(), Evals: n, ABs: n})
	a := agent(t, b, "support")
	ctx := context.Background()
	for range 3 {
		if err := a.Evals().Update(ctx, "r", counter); err != nil {
			t.Fatal(err)
		}
		if err := a.ABs().UpdateSnapshot(ctx, counter); err != nil {
			t.Fatal(err)
		}
	}
	skip := func(json.RawMessage) (json.RawMessage, error) { return nil, storage.ErrSkip }
	if err := a.Evals().Update(ctx, "r", skip); err != nil {
		t.Fatal(err)
	}
	if err := a.ABs().UpdateSnapshot(ctx, skip); err != nil {
		t.Fatal(err)
	}
	if runs := listRuns(t, a.Evals()); len(runs) != 1 || string(runs[0].Snapshot) != "3" {
		t.Errorf("native run = %v, want 3", runs)
	}
	if snap, _ := a.ABs().GetSnapshot(ctx); string(snap) != "3" {
		t.Errorf("native snapshot = %s, want 3", snap)
	}
	failing := func(json.RawMessage) (json.RawMessage, error) { return nil, errors.New("no") }
	if err := a.Evals().Update(ctx, "r", failing); err == nil || err.Error() != "no" {
		t.Errorf("Update with a failing function = %v", err)
	}
}

func TestPruneSamplesKeepsTheNewerOnes(t *testing.T) {
	be := newBackend()
	b := define(t, storage.Config{Backend: be.Core()})
	abs := agent(t, b, "support").ABs()
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 4 {
		abs.PutSample(ctx, storage.ABSample{Experiment: "tone", Variant: "a", SessionID: "s1", At: t0.Add(time.Duration(i) * time.Second), Metrics: json.RawMessage(fmt.Sprint(i))})
	}
	abs.PutSample(ctx, storage.ABSample{Experiment: "tone", Variant: "a", SessionID: "s10", At: t0, Metrics: json.RawMessage(`0`)})
	n, err := abs.PruneSamples(ctx, "tone", "s1", t0.Add(3*time.Second))
	if err != nil || n != 3 {
		t.Fatalf("PruneSamples = %d, %v; want the 3 older samples", n, err)
	}
	var left []string
	for e, err := range be.store.List(ctx, "agentkit/v1/support/ab-samples/") {
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, e.Key)
	}
	if len(left) != 2 {
		t.Errorf("left %q: want s1's newest sample and s10's (another session sharing the prefix)", left)
	}
	nat := storetest.NewNative()
	nb := define(t, storage.Config{Backend: newBackend().Core(), ABs: nat})
	nabs := agent(t, nb, "support").ABs()
	nabs.PutSample(ctx, storage.ABSample{Experiment: "tone", SessionID: "s1", At: t0, Metrics: json.RawMessage(`1`)})
	if n, err := nabs.PruneSamples(ctx, "tone", "s1", t0.Add(time.Hour)); n != 0 || err != nil || len(nat.Samples()) != 1 {
		t.Errorf("PruneSamples on a native table deleted %d (%v); a native table keeps its own retention", n, err)
	}
}
