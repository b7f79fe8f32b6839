package turnbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/keys"
	"agentkit/kv"
)

// turnsPerSession is how many turns BenchmarkTurn runs in a session before
// it starts the next, so the sessions stay short chats (bench/adk does the
// same on both sides).
const turnsPerSession = 16

// turner runs turns on a runtime: a new session every turnsPerSession
// turns (StartSession), follow-ups in between (Continue).
type turner struct {
	rt    *agent.Runtime
	count *storeCounter
	store *kv.DB // where the runtime mirrors
	token string
	n     int
}

// openTurner opens a runtime on a state root in dir mirroring to db
// ("sqlite": the embedded default store; "postgres": a fresh pgkv table).
func openTurner(ctx context.Context, tb testing.TB, dir, db string) (*turner, func(context.Context) error, error) {
	t := &turner{count: &storeCounter{}}
	var drop func(context.Context) error
	if db == "postgres" {
		var err error
		if t.store, _, drop, err = openPG(ctx, tb); err != nil {
			return nil, nil, err
		}
	}
	rt, err := openRuntime(ctx, dir+"/state", t.store, t.count)
	if err != nil {
		if drop != nil {
			err = errors.Join(err, drop(ctx))
		}
		return nil, nil, err
	}
	t.rt = rt
	if t.store == nil {
		t.store = rt.Store()
	}
	release := func(ctx context.Context) error {
		err := rt.Close()
		if drop != nil {
			err = errors.Join(err, drop(ctx))
		}
		return err
	}
	return t, release, nil
}

// turn runs the next turn and checks it completed with the echo answer.
func (t *turner) turn(ctx context.Context) (agent.TurnResult, error) {
	msg := text(t.n)
	var res agent.TurnResult
	var err error
	if t.n%turnsPerSession == 0 {
		res, err = t.rt.StartSession(ctx, agent.StartRequest{Message: msg})
		t.token = res.ContinuationToken
	} else {
		res, err = t.rt.Continue(ctx, agent.ContinueRequest{Token: t.token, Message: msg})
	}
	t.n++
	if err != nil {
		return res, err
	}
	if res.Turn.Status != agent.StatusCompleted || res.Turn.Result != echoPrefix+msg {
		return res, fmt.Errorf("turn %d ended %s: %.40q", t.n, res.Turn.Status, res.Turn.Result)
	}
	return res, nil
}

// BenchmarkTurn runs agentkit's full turn alone: Runtime.Continue (a
// StartSession every 16 turns) with the echo model and the memory journal
// off, mirroring to the embedded default store (store=sqlite: a sqlitekv
// file in the state root, WAL, synchronous=FULL) or to PostgreSQL
// (store=postgres, kv/pgkv). It reports the store writes a turn makes
// (store-writes/op). It is the benchmark to profile (go test -cpuprofile)
// and to run under strace to count a turn's fsyncs; bench/adk compares
// the same turn with ADK's.
func BenchmarkTurn(b *testing.B) {
	for _, db := range []string{"sqlite", "postgres"} {
		b.Run("store="+db, func(b *testing.B) {
			ctx := b.Context()
			t, release, err := openTurner(ctx, b, b.TempDir(), db)
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := release(context.Background()); err != nil {
					b.Error(err)
				}
			}()
			b.ReportAllocs()
			w0 := t.count.total()
			for b.Loop() {
				if _, err := t.turn(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(t.count.total()-w0)/float64(t.n), "store-writes/op")
			if n := t.rt.Info().MirrorDropped; n != 0 {
				b.Fatalf("%d mirror writes were dropped", n)
			}
		})
	}
}

// TestTurnMirrorsEveryTurn runs BenchmarkTurn's turns on both stores and
// checks that each turn reached the store it is meant to measure: the
// session's metadata there carries the last event, and store writes were
// counted.
func TestTurnMirrorsEveryTurn(t *testing.T) {
	dbs := []string{"sqlite", "postgres"}
	if testing.Short() {
		dbs = dbs[:1]
	}
	for _, db := range dbs {
		t.Run(db, func(t *testing.T) {
			ctx := t.Context()
			tr, release, err := openTurner(ctx, t, t.TempDir(), db)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := release(context.Background()); err != nil {
					t.Error(err)
				}
			}()
			var res agent.TurnResult
			for range 3 {
				if res, err = tr.turn(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if tr.count.total() == 0 {
				t.Error("three turns made no store writes; the Observer does not see the mirror")
			}
			scope, err := keys.Agent(agentName)
			if err != nil {
				t.Fatal(err)
			}
			key, err := scope.SessionMeta(res.SessionID)
			if err != nil {
				t.Fatal(err)
			}
			data, err := tr.store.Get(ctx, key)
			if err != nil {
				t.Fatalf("the session's metadata is not in the %s store: %v", db, err)
			}
			var meta struct {
				LastSeq int64 `json:"lastSeq"`
			}
			if err := json.Unmarshal(data, &meta); err != nil || meta.LastSeq != 9 {
				t.Errorf("the %s store's metadata has lastSeq %d (%v); want 9 after three turns", db, meta.LastSeq, err)
			}
		})
	}
}

// concurrentClients is how many goroutines BenchmarkConcurrentTurns runs
// turns from, each in a session of its own.
const concurrentClients = 16

// BenchmarkConcurrentTurns runs agentkit's full turn from 16 goroutines at
// once on one runtime (the embedded default store), each continuing a
// session of its own, in process: the load of bench/load without HTTP. It
// reports each turn's latency percentiles (p50-ns, p99-ns) and p99/p50
// (the target under 16 clients: at most 5); ns/op is the wall time
// per turn, the inverse of the throughput. Run it with -blockprofile to see
// where the turns wait (scripts/bench.sh profile).
func BenchmarkConcurrentTurns(b *testing.B) {
	ctx := b.Context()
	rt, err := openRuntime(ctx, b.TempDir()+"/state", nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := rt.Close(); err != nil {
			b.Error(err)
		}
	}()
	var mu sync.Mutex
	var lat []time.Duration
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((concurrentClients + procs - 1) / procs)
	b.RunParallel(func(pb *testing.PB) {
		res, err := rt.StartSession(ctx, agent.StartRequest{Message: text(0)})
		if err != nil {
			b.Error(err)
			return
		}
		var mine []time.Duration
		for i := 1; pb.Next(); i++ {
			t0 := time.Now()
			r, err := rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: text(i)})
			if err == nil && r.Turn.Status != agent.StatusCompleted {
				err = fmt.Errorf("turn ended %s: %.40q", r.Turn.Status, r.Turn.Result)
			}
			if err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(p99)/float64(p50), "p99/p50")
}
