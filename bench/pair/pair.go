// Package pair times two or more operations alternated inside one
// benchmark loop, so that whatever drifts while a benchmark runs (the
// disk's fsync latency, the other work on a shared machine, a server's
// warm-up) hits every side alike, and reports each side's time and the
// ratios between them as custom metrics of the one benchmark.
//
// A paired benchmark reads:
//
//	func BenchmarkAppend(b *testing.B) {
//		pair.Loop(b, []pair.Op{
//			{Name: "adk", Run: func(i int) error { return adkAppend(i) }},
//			{Name: "agentkit", Run: func(i int) error { return akAppend(i) }},
//		}, pair.Ratio{Num: "adk", Den: "agentkit"})
//	}
//
// and reports adk-ns/op, agentkit-ns/op, adk-allocs/op, agentkit-allocs/op
// and adk/agentkit (the ratio of the two mean times), beside the usual
// ns/op, which is the sum of one op of every side. Medians over -count runs,
// with benchstat, then compare the sides of the same runs.
//
// Each iteration runs every op once, rotating which goes first (with two
// ops: A B, B A, A B, ...), so neither side always runs right after the
// other. Each op's time is its own wall-clock time; allocations are the
// heap objects the process allocated while it ran (runtime.MemStats, read
// outside the timed span, as testing's own ReportAllocs does), which
// includes any background goroutine's.
package pair

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Op is one side of a paired benchmark.
type Op struct {
	// Name prefixes the side's metrics (Name-ns/op, Name-allocs/op) and
	// names it in Ratio. It must not contain white space.
	Name string
	// Run performs the operation once. i counts this side's calls from 0.
	// An error fails the benchmark.
	Run func(i int) error
	// Before and After, when set, run right before and right after each
	// Run, untimed: preparing a fresh folder, closing what Run opened,
	// checking its result. An error fails the benchmark.
	Before, After func(i int) error
}

// Ratio asks Loop to report the mean time of one side divided by the mean
// time of another, as the metric "Num/Den".
type Ratio struct {
	Num, Den string
}

// now is the clock; tests replace it.
var now = time.Now

// Totals are what Loop measured: per side, the summed time and allocations
// and the number of calls.
type Totals struct {
	Names  []string
	Time   []time.Duration
	Allocs []uint64
	Calls  int
}

// Mean returns the mean time per call of the named side.
func (t Totals) Mean(name string) time.Duration {
	for i, n := range t.Names {
		if n == name && t.Calls > 0 {
			return t.Time[i] / time.Duration(t.Calls)
		}
	}
	return 0
}

// Loop runs ops alternated in b.Loop, then reports each side's mean time
// and allocations per call, and each ratio, as custom metrics. It returns
// the totals, for callers that report more.
func Loop(b *testing.B, ops []Op, ratios ...Ratio) Totals {
	b.Helper()
	index := map[string]int{}
	for i, op := range ops {
		if op.Name == "" || op.Run == nil {
			b.Fatalf("pair: op %d has no Name or no Run", i)
		}
		if _, dup := index[op.Name]; dup {
			b.Fatalf("pair: two ops are named %q", op.Name)
		}
		index[op.Name] = i
	}
	for _, r := range ratios {
		if _, ok := index[r.Num]; !ok {
			b.Fatalf("pair: ratio %s/%s names no op %q", r.Num, r.Den, r.Num)
		}
		if _, ok := index[r.Den]; !ok {
			b.Fatalf("pair: ratio %s/%s names no op %q", r.Num, r.Den, r.Den)
		}
	}
	t := Totals{Names: make([]string, len(ops)), Time: make([]time.Duration, len(ops)), Allocs: make([]uint64, len(ops))}
	for i, op := range ops {
		t.Names[i] = op.Name
	}
	var ms runtime.MemStats
	allocs := func() uint64 {
		runtime.ReadMemStats(&ms)
		return ms.Mallocs
	}
	untimed := func(name, what string, f func(int) error) {
		if f == nil {
			return
		}
		b.StopTimer()
		defer b.StartTimer()
		if err := f(t.Calls); err != nil {
			b.Fatalf("%s, %s call %d: %v", name, what, t.Calls, err)
		}
	}
	for b.Loop() {
		for k := range ops {
			j := (t.Calls + k) % len(ops)
			op := ops[j]
			untimed(op.Name, "before", op.Before)
			a0 := allocs()
			start := now()
			err := op.Run(t.Calls)
			t.Time[j] += now().Sub(start)
			t.Allocs[j] += allocs() - a0 // read after the clock: untimed
			if err != nil {
				b.Fatalf("%s, call %d: %v", op.Name, t.Calls, err)
			}
			untimed(op.Name, "after", op.After)
		}
		t.Calls++
	}
	if t.Calls == 0 {
		return t
	}
	n := float64(t.Calls)
	for i, op := range ops {
		b.ReportMetric(float64(t.Time[i].Nanoseconds())/n, op.Name+"-ns/op")
		b.ReportMetric(float64(t.Allocs[i])/n, op.Name+"-allocs/op")
	}
	for _, r := range ratios {
		den := t.Time[index[r.Den]]
		if den <= 0 {
			continue
		}
		b.ReportMetric(float64(t.Time[index[r.Num]])/float64(den), fmt.Sprintf("%s/%s", r.Num, r.Den))
	}
	return t
}
