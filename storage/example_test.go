package storage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

// quietLogger logs to stdout without timestamps, so examples have stable
// output.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
}

func ExampleDefine() {
	b, err := storage.Define(storage.Config{
		Backend: memkv.New(), // in production: kv.Open(ctx, "postgres://…")
		Policy: storage.Policy{
			Debounce: 30 * time.Second,
			Restore:  storage.RestorePolicy{MaxSessions: 500},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	info, _ := json.MarshalIndent(b.Report(), "", "  ")
	fmt.Println(string(info))
	// Output:
	// {
	//   "name": "mem",
	//   "put": true,
	//   "get": true,
	//   "delete": true,
	//   "list": true,
	//   "cas": true,
	//   "processLocal": true,
	//   "evals": "derived",
	//   "abs": "derived",
	//   "abSnapshot": "derived",
	//   "debounceMs": 30000,
	//   "restore": {
	//     "off": false,
	//     "atStart": true,
	//     "maxSessions": 500,
	//     "maxAgeMs": 2592000000,
	//     "maxTotalBytes": 1073741824
	//   }
	// }
}

func ExampleDefine_funcs() {
	// Wrapping an existing client in a few lines: here only Put and Get.
	client := memkv.NewStore()
	_, err := storage.Define(storage.Config{
		Backend: kv.Funcs{
			Put: client.Put,
			Get: client.Get,
			CAS: kv.CASFuncs{PutIfAbsent: client.PutIfAbsent}, // a partial group
		},
	})
	fmt.Println(err)
	// Output:
	// storage: Config.Backend has a partial CAS group: missing GetWithVersion, PutIfVersion, ListKeys; set all four fields of kv.Funcs.CAS (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys) to use compare-and-set (session heads, reminder claims), or none to run without them
}

func ExampleABs_PutSample_dropped() {
	flaky := kv.Funcs{Put: func(context.Context, string, []byte) error {
		return errors.New("connection refused")
	}}
	b, _ := storage.Define(storage.Config{Backend: flaky, Name: "flaky", Logger: quietLogger()})
	support, _ := b.Agent("support")

	// The turn goes on: an A/B sample that fails is logged, counted and
	// dropped (the one record written at most once).
	support.ABs().PutSample(context.Background(), storage.ABSample{
		Experiment: "tone", Variant: "warm", SessionID: "s1",
		At: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), Metrics: json.RawMessage(`{"turns":1}`),
	})
	fmt.Println("dropped:", b.DroppedMirrorWrites())
	// Output:
	// level=WARN msg="storage: eval history is kept in process memory and lost on restart; the derived eval table needs Delete and List, or set Config.Evals" store=flaky capabilities=put
	// level=WARN msg="storage: A/B sample dropped" store=flaky key=agentkit/v1/support/ab-samples/tone/s1/2026-05-01T12%3A00%3A00.000Z err="flaky: put \"agentkit/v1/support/ab-samples/tone/s1/2026-05-01T12%3A00%3A00.000Z\": connection refused" dropped_total=1
	// dropped: 1
}

func ExampleBinding_RequireCoordination() {
	durable := memkv.NewStore() // stands in for a durable store below
	plain := kv.Funcs{Put: durable.Put, Get: durable.Get, Delete: durable.Delete, List: durable.List}

	// The whole memory driver is fine for tests.
	b, _ := storage.Define(storage.Config{Backend: memkv.New()})
	fmt.Println(b.RequireCoordination())

	// No CAS group: ledger mode cannot start.
	b, _ = storage.Define(storage.Config{Backend: plain, Name: "files"})
	fmt.Println(errors.Is(b.RequireCoordination(), storage.ErrNoCAS))

	// A durable store beside the memory driver's CAS group is refused.
	plain.CAS = kv.CASFuncsOf(memkv.NewStore())
	b, _ = storage.Define(storage.Config{Backend: plain, Name: "files"})
	fmt.Println(errors.Is(b.RequireCoordination(), storage.ErrSplitCAS))

	// So is another store's CAS group that does not say where it keeps its
	// data: the start-up probe writes through each half and reads through
	// the other.
	other := memkv.NewStore()
	plain.CAS = kv.CASFuncs{GetWithVersion: other.GetWithVersion, PutIfAbsent: other.PutIfAbsent, PutIfVersion: other.PutIfVersion, ListKeys: other.ListKeys}
	b, _ = storage.Define(storage.Config{Backend: plain, Name: "files"})
	fmt.Println(errors.Is(b.RequireCoordination(), storage.ErrSplitCAS))

	// The CAS group of the store the plain methods use passes.
	plain.CAS = kv.CASFuncs{GetWithVersion: durable.GetWithVersion, PutIfAbsent: durable.PutIfAbsent, PutIfVersion: durable.PutIfVersion, ListKeys: durable.ListKeys}
	b, _ = storage.Define(storage.Config{Backend: plain, Name: "files"})
	fmt.Println(b.RequireCoordination())
	// Output:
	// <nil>
	// true
	// true
	// true
	// <nil>
}

func ExampleHostKV() {
	ctx := context.Background()
	b, _ := storage.Define(storage.Config{Backend: memkv.New()})
	support, _ := b.Agent("support")
	hostKV := support.KV()

	if err := hostKV.Put(ctx, "alert-memory/abc", map[string]any{"seen": 3}); err != nil {
		fmt.Println(err) // awaited: the handler sees store errors
		return
	}
	v, _ := hostKV.Get(ctx, "alert-memory/abc")
	fmt.Println(string(v))
	for e, err := range hostKV.List(ctx, "alert-memory/") {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(e.Key)
	}
	raw, _ := b.DB().Get(ctx, "agentkit/v1/support/kv/alert-memory%2Fabc")
	fmt.Println(string(raw))
	// Output:
	// {"seen":3}
	// alert-memory/abc
	// {"v":1,"key":"alert-memory/abc","value":{"seen":3}}
}

func ExampleABs_PutSample() {
	ctx := context.Background()
	db := memkv.New()
	b, _ := storage.Define(storage.Config{Backend: db})
	support, _ := b.Agent("support")

	support.ABs().PutSample(ctx, storage.ABSample{
		Experiment: "tone",
		Variant:    "warm",
		SessionID:  "s1",
		At:         time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC),
		Metrics:    json.RawMessage(`{"turns":1,"failures":0}`),
	})
	for key := range db.ListKeys(ctx, "agentkit/v1/support/ab-samples/") {
		fmt.Println(key)
	}
	// Output:
	// agentkit/v1/support/ab-samples/tone/s1/2024-05-01T12%3A30%3A00.000Z
}

func ExampleEvalRuns() {
	ctx := context.Background()
	b, _ := storage.Define(storage.Config{Backend: memkv.New()})
	support, _ := b.Agent("support")
	runs := support.Evals()

	_ = runs.Put(ctx, "run-1", json.RawMessage(`{"status":"running"}`))
	_ = runs.Put(ctx, "run-1", json.RawMessage(`{"status":"finished"}`))
	for run, err := range runs.List(ctx) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(runs.Mode(), run.ID, string(run.Snapshot))
	}
	// Output:
	// derived run-1 {"status":"finished"}
}
