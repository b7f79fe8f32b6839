package abtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/abtest"
	"agentkit/internal/storetest"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

const agentName = "ab-agent"

var tone = abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "plain"}, {Name: "friendly", Instructions: "be warm"}}}

// tables is one way of storing A/B data: host() returns a new host's view
// of the same table, as a second process on the same store would have.
type tables struct {
	name    string
	derived bool
	host    func(t *testing.T) (*storage.ABs, *kv.DB)
	native  *storetest.Native
}

func allTables(t *testing.T) []tables {
	var out []tables
	for _, s := range storetest.Stores(t) {
		out = append(out, tables{name: s.Name, derived: true, host: func(t *testing.T) (*storage.ABs, *kv.DB) {
			db := storetest.Open(t, s.URL)
			return bind(t, storage.Config{Backend: db}), db
		}})
	}
	n := storetest.NewNative()
	out = append(out, tables{name: "native", native: n, host: func(t *testing.T) (*storage.ABs, *kv.DB) {
		db := memkv.New()
		return bind(t, storage.Config{Backend: db, ABs: n}), db
	}})
	return out
}

func bind(t *testing.T, cfg storage.Config) *storage.ABs {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	b, err := storage.Define(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Agent(agentName)
	if err != nil {
		t.Fatal(err)
	}
	return a.ABs()
}

func recorder(t *testing.T, table *storage.ABs, host string) *abtest.Recorder {
	t.Helper()
	r, err := abtest.NewRecorder(table, abtest.RecorderOptions{HostID: host, Experiments: []abtest.Experiment{tone}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// turns records n turns of a session on r, one sample each, with latencies
// base, base+1, …
func turns(r *abtest.Recorder, session, variant string, n int, base int64, failEvery int) abtest.SessionMetrics {
	m, _ := r.Metrics("tone", session)
	m.Variant = variant
	at := time.Now().UTC()
	for i := range n {
		m = m.AddTurn(abtest.Turn{Failed: failEvery > 0 && (i+1)%failEvery == 0, InputTokens: 7, OutputTokens: 3,
			Latency: time.Duration(base+int64(i)) * time.Millisecond, At: at.Add(time.Duration(i+1) * time.Millisecond)})
		r.Record(context.Background(), "tone", session, m)
	}
	return m
}

// derivedSamples lists the derived sample keys of a session.
func derivedSamples(t *testing.T, db *kv.DB, session string) []string {
	t.Helper()
	k, _ := keys.Agent(agentName)
	prefix, err := k.ABSessionPrefix("tone", session)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for key, err := range db.ListKeys(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, key)
	}
	return out
}

func variantOf(t *testing.T, rep abtest.Report, name string) abtest.VariantFigures {
	t.Helper()
	for _, e := range rep.Experiments {
		if e.Name == "tone" {
			for _, v := range e.Variants {
				if v.Name == name {
					return v
				}
			}
		}
	}
	t.Fatalf("no variant %q in %+v", name, rep.Experiments)
	return abtest.VariantFigures{}
}

func TestSamplesAreCumulativeBlindAppendsPrunedOnceInTheSnapshot(t *testing.T) {
	for _, tb := range allTables(t) {
		t.Run(tb.name, func(t *testing.T) {
			table, db := tb.host(t)
			r := recorder(t, table, "host-a")
			turns(r, "s1", "plain", 3, 100, 0)

			var metrics []abtest.SessionMetrics
			if tb.derived {
				sampleKeys := derivedSamples(t, db, "s1")
				if len(sampleKeys) != 3 {
					t.Fatalf("%d sample keys after 3 turns, want one per turn: %q", len(sampleKeys), sampleKeys)
				}
				for _, key := range sampleKeys {
					data, err := db.Get(context.Background(), key)
					if err != nil {
						t.Fatal(err)
					}
					var rec struct{ Metrics abtest.SessionMetrics }
					if err := json.Unmarshal(data, &rec); err != nil {
						t.Fatal(err)
					}
					metrics = append(metrics, rec.Metrics)
				}
			} else {
				for _, s := range tb.native.Samples() {
					var m abtest.SessionMetrics
					if err := json.Unmarshal(s.Metrics, &m); err != nil {
						t.Fatal(err)
					}
					metrics = append(metrics, m)
				}
				if c := tb.native.Calls(); c["GetSnapshot"] != 0 || c["PutSnapshot"] != 0 {
					t.Errorf("recording samples read or wrote the snapshot: %v; a sample is a blind append", c)
				}
			}
			if len(metrics) != 3 {
				t.Fatalf("%d samples, want 3", len(metrics))
			}
			for i, m := range metrics {
				if m.Turns != int64(i+1) || m.Latency.Count() != int64(i+1) || m.Latency.Percentile(100) != int64(100+i) || m.Variant != "plain" {
					t.Errorf("sample %d = %+v: each sample carries the session's turns so far, every latency included", i+1, m)
				}
			}

			if err := r.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tb.derived {
				left := derivedSamples(t, db, "s1")
				if len(left) != 1 || !strings.Contains(left[0], "ab-samples/tone/s1/") {
					t.Errorf("after the flush the derived table keeps %q; want only the latest sample, which holds the others", left)
				}
			} else if n := len(tb.native.Samples()); n != 3 {
				t.Errorf("the native table has %d samples after the flush; a native table is never pruned", n)
			}
			v := variantOf(t, recorder(t, table, "replacement").Report(context.Background()), "plain")
			if v.Sessions != 1 || v.Turns != 3 || v.P50Ms != 101 || v.P95Ms != 102 || v.MeanTokensPerTurn != 10 {
				t.Errorf("a host with no sessions reports %+v from the snapshot", v)
			}
		})
	}
}

func TestHostsNeverOverwriteEachOthersState(t *testing.T) {
	for _, tb := range allTables(t) {
		t.Run(tb.name, func(t *testing.T) {
			const hosts, sessions = 4, 8
			recs := make([]*abtest.Recorder, hosts)
			for h := range hosts {
				table, _ := tb.host(t)
				recs[h] = recorder(t, table, fmt.Sprintf("host-%d", h))
			}
			// Every host records its own sessions and flushes after each,
			// all at once.
			var wg sync.WaitGroup
			errs := make(chan error, hosts*sessions)
			for h, r := range recs {
				wg.Go(func() {
					for s := range sessions {
						turns(r, fmt.Sprintf("h%d-s%d", h, s), "plain", 2, int64(10*h+s), 0)
						errs <- r.Flush(context.Background())
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
			if !tb.derived {
				// Without compare-and-set a write can land on a snapshot read
				// before another host's verified write; the periodic flush
				// (Run) repairs it, as one more round does here.
				for _, r := range recs {
					if err := r.Flush(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
			}
			table, _ := tb.host(t)
			rep := recorder(t, table, "replacement").Report(context.Background())
			if v := variantOf(t, rep, "plain"); v.Sessions != hosts*sessions || v.Turns != 2*hosts*sessions {
				t.Errorf("the snapshot holds %d sessions and %d turns, want %d and %d: a host's flush erased another's state",
					v.Sessions, v.Turns, hosts*sessions, 2*hosts*sessions)
			}
			if len(rep.Hosts) != hosts+1 {
				t.Errorf("hosts %+v: want the %d writers and the replacement", rep.Hosts, hosts)
			}
		})
	}
}

func TestASessionSeenByTwoHostsCountsOnce(t *testing.T) {
	for _, tb := range allTables(t) {
		t.Run(tb.name, func(t *testing.T) {
			ta, _ := tb.host(t)
			tbl, _ := tb.host(t)
			a, b := recorder(t, ta, "host-a"), recorder(t, tbl, "host-b")
			ctx := context.Background()
			// Host a serves turns 1-2 of "moved" and flushes; the session
			// then moves to host b, which rebuilds its history (as the
			// runtime does from the event log) and runs turn 3.
			m := turns(a, "moved", "friendly", 2, 100, 0)
			if err := a.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			at := m.UpdatedAt
			m = m.AddTurn(abtest.Turn{Failed: true, Latency: 900 * time.Millisecond, At: at.Add(time.Second)})
			b.Record(ctx, "tone", "moved", m)
			turns(b, "other", "friendly", 2, 10, 0)
			if err := b.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			// Host a flushes again, with its stale copy of "moved".
			turns(a, "third", "friendly", 1, 500, 0)
			if err := a.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for _, r := range []*abtest.Recorder{a, b, recorder(t, ta, "replacement")} {
				v := variantOf(t, r.Report(ctx), "friendly")
				// Latencies: moved 100 101 900, other 10 11, third 500:
				// sorted 10 11 100 101 500 900. 900 is read as the middle
				// of its sketch bucket, [900, 904).
				if v.Sessions != 3 || v.Turns != 6 || v.FailedTurns != 1 || v.FailedSessions != 1 || v.P50Ms != 100 || v.P95Ms != 902 {
					t.Errorf("figures %+v: want 3 sessions, 6 turns, 1 failed, p50 100 ms, p95 902 ms (a moved session counts once, with its longest history)", v)
				}
			}
		})
	}
}

func TestASnapshotOfANewerFormatIsNotOverwritten(t *testing.T) {
	table := bind(t, storage.Config{Backend: memkv.New()})
	newer := json.RawMessage(`{"v":3,"sessions":{}}`)
	if err := table.PutSnapshot(context.Background(), newer); err != nil {
		t.Fatal(err)
	}
	r := recorder(t, table, "old-build")
	turns(r, "s", "plain", 1, 5, 0)
	err := r.Flush(context.Background())
	if err == nil || !strings.Contains(err.Error(), "format version 3") {
		t.Errorf("Flush over a newer snapshot: %v, want an error naming the version", err)
	}
	got, _ := table.GetSnapshot(context.Background())
	if string(got) != string(newer) {
		t.Errorf("the newer snapshot was replaced by %s", got)
	}
	if rep := r.Report(context.Background()); rep.SnapshotError == "" || variantOf(t, rep, "plain").Sessions != 1 {
		t.Errorf("Report over an unreadable snapshot: %+v; want this host's figures and the reason", rep)
	}
}

// TestReportComparesTheVariantWithTheControl: with arms of different
// failure rates, the comparison the server and the CLI show (Recorder.Report)
// is the variant's rate minus the control's, with the interval of that
// order, not its mirror image. The figures below are worked out by hand
// from the formulas in Compare's doc (z = 1.959964, z² = 3.841459):
//
// Control "plain", 10 of 100 sessions failed: p = 0.1; Wilson's
// denominator 1 + z²/n = 1.038415, centre (0.1 + 0.019207)/1.038415 =
// 0.114797, half-width 1.959964·√(0.0009 + 0.000096)/1.038415 = 0.059568:
// [0.0552, 0.1744].
//
// Variant "friendly", 40 of 100: p = 0.4; centre (0.4 + 0.019207)/1.038415
// = 0.403699, half-width 1.959964·√(0.0024 + 0.000096)/1.038415 = 0.094298:
// [0.3094, 0.4980].
//
// d = 0.4 − 0.1 = +0.30; low = 0.30 − √((0.4 − 0.3094)² + (0.1744 − 0.1)²)
// = 0.30 − 0.1172 = 0.1828; high = 0.30 + √((0.4980 − 0.4)² + (0.1 −
// 0.0552)²) = 0.30 + 0.1078 = 0.4078. The variant fails more, and the
// interval excludes zero.
//
// With arms of different sizes (variant 30 of 60: p = 0.5, Wilson
// [0.3774, 0.6226]) a swap of the sessions counts shows too: d = +0.40,
// low = 0.40 − √(0.1226² + 0.0744²) = 0.40 − 0.1434 = 0.2566, high =
// 0.40 + √(0.1226² + 0.0448²) = 0.40 + 0.1305 = 0.5305.
func TestReportComparesTheVariantWithTheControl(t *testing.T) {
	for _, c := range []struct {
		name                     string
		controlFailed, controlN  int
		variantFailed, variantN  int
		difference, low, high    float64
		controlRate, variantRate float64
	}{
		{"same sizes", 10, 100, 40, 100, 0.30, 0.1828, 0.4078, 0.1, 0.4},
		{"different sizes", 10, 100, 30, 60, 0.40, 0.2566, 0.5305, 0.1, 0.5},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := recorder(t, bind(t, storage.Config{Backend: memkv.New()}), "h1")
			arm := func(variant string, failed, n int) {
				for i := range n {
					failEvery := 0 // a session's one turn succeeds
					if i < failed {
						failEvery = 1 // or fails
					}
					turns(r, fmt.Sprintf("%s-%d", variant, i), variant, 1, 100, failEvery)
				}
			}
			arm("plain", c.controlFailed, c.controlN)
			arm("friendly", c.variantFailed, c.variantN)
			if err := r.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			rep := r.Report(context.Background())
			if p := variantOf(t, rep, "plain"); p.Sessions != int64(c.controlN) || p.FailedSessions != int64(c.controlFailed) || p.SessionFailureRate != c.controlRate {
				t.Errorf("control: %d sessions, %d failed, rate %v; want %d, %d, %v", p.Sessions, p.FailedSessions, p.SessionFailureRate, c.controlN, c.controlFailed, c.controlRate)
			}
			if v := variantOf(t, rep, "friendly"); v.Sessions != int64(c.variantN) || v.FailedSessions != int64(c.variantFailed) || v.SessionFailureRate != c.variantRate {
				t.Errorf("variant: %d sessions, %d failed, rate %v; want %d, %d, %v", v.Sessions, v.FailedSessions, v.SessionFailureRate, c.variantN, c.variantFailed, c.variantRate)
			}
			var cmp []abtest.Comparison
			for _, e := range rep.Experiments {
				if e.Name == "tone" {
					cmp = e.Comparisons
				}
			}
			if len(cmp) != 1 {
				t.Fatalf("comparisons %+v; want one, friendly against plain", cmp)
			}
			got := cmp[0]
			if got.Variant != "friendly" || got.Control != "plain" {
				t.Errorf("compared %q against %q; want friendly against the control plain", got.Variant, got.Control)
			}
			if !got.Defined || math.Abs(got.Difference-c.difference) > 1e-9 || math.Abs(got.Low-c.low) > 0.0005 || math.Abs(got.High-c.high) > 0.0005 {
				t.Errorf("difference %.4f in [%.4f, %.4f]; want %+.4f in [%.4f, %.4f] (the variant's failure rate minus the control's)",
					got.Difference, got.Low, got.High, c.difference, c.low, c.high)
			}
			if !got.Significant {
				t.Error("the interval excludes zero but the comparison is not marked significant")
			}
		})
	}
}
