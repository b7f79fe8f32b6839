package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkFloor-2   	    2000	   1778447 ns/op	        66.72 agentkit-allocs/op	    388695 agentkit-ns/op	         2.169 agentkit/fsync
BenchmarkFloor-2   	    2000	   1763223 ns/op	        66.68 agentkit-allocs/op	    441013 agentkit-ns/op	         2.795 agentkit/fsync
--- BENCH: BenchmarkFloor-2
    floor_test.go:12: a log line
BenchmarkFloor-2   	    2000	   1509223 ns/op	        66.67 agentkit-allocs/op	    380338 agentkit-ns/op	         2.843 agentkit/fsync
BenchmarkTurn/store=sqlite-2         	     100	   2325824 ns/op	         4.000 store-writes/op
PASS
`

func TestSummarizeTakesEachMetricsMedianMinAndMax(t *testing.T) {
	var out bytes.Buffer
	if err := summarize(strings.NewReader(sample), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][]string{
		{"benchmark", "metric", "median", "min", "max", "runs"},
		{"BenchmarkFloor-2", "ns/op", "1.763ms", "1.509ms", "1.778ms", "3"},
		{"agentkit-allocs/op", "66.68", "66.67", "66.72", "3"},
		{"agentkit-ns/op", "388.7µs", "380.3µs", "441.0µs", "3"},
		{"agentkit/fsync", "2.795", "2.169", "2.843", "3"},
		{"BenchmarkTurn/store=sqlite-2", "ns/op", "2.326ms", "2.326ms", "2.326ms", "1"},
		{"store-writes/op", "4", "4", "4", "1"},
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		if got := strings.Fields(lines[i]); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Errorf("line %d = %q; want %q", i, got, w)
		}
	}
}

func TestMedianOfAnEvenCountIsTheMean(t *testing.T) {
	if got := median([]float64{1, 2, 4, 10}); got != 3 {
		t.Errorf("median(1, 2, 4, 10) = %v; want 3", got)
	}
}

func TestTimesAreScaled(t *testing.T) {
	for v, want := range map[float64]string{950: "950.0ns", 1500: "1.500µs", 2.5e7: "25.00ms", 3.2e9: "3.200s"} {
		if got := format(v, "adk-ns/op"); got != want {
			t.Errorf("format(%v ns) = %s; want %s", v, got, want)
		}
	}
	if got := format(2.5e7, "allocs/op"); got != "2.5e+07" {
		t.Errorf("a count is formatted %s; want 2.5e+07", got)
	}
}
