package pair_test

import (
	"errors"
	"flag"
	"os"
	"slices"
	"testing"
	"time"

	"agentkit/bench/pair"
)

// TestMain runs testing.Benchmark for 200 iterations rather than a second.
func TestMain(m *testing.M) {
	flag.Parse()
	if err := flag.Set("test.benchtime", "200x"); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// sink keeps allocations from being optimized away.
var sink [][]byte

func TestLoopAlternatesAndReportsEverySide(t *testing.T) {
	var order []string
	var totals pair.Totals
	res := testing.Benchmark(func(b *testing.B) {
		order = order[:0]
		totals = pair.Loop(b, []pair.Op{
			{Name: "a", Run: func(i int) error { order = append(order, "a"); return nil }},
			{Name: "b", Run: func(i int) error { order = append(order, "b"); return nil }},
		}, pair.Ratio{Num: "a", Den: "b"})
	})
	if res.N == 0 || totals.Calls != res.N {
		t.Fatalf("the benchmark ran %d iterations and Loop counted %d calls", res.N, totals.Calls)
	}
	// Each iteration runs both, the first side rotating: a b, b a, a b, ...
	for i := 0; i+1 < len(order); i += 2 {
		want := []string{"a", "b"}
		if (i/2)%2 == 1 {
			want = []string{"b", "a"}
		}
		if got := order[i : i+2]; !slices.Equal(got, want) {
			t.Fatalf("iteration %d ran %v; want %v (the order alternates)", i/2, got, want)
		}
	}
	if len(order) != 2*res.N {
		t.Errorf("%d ops ran in %d iterations; want 2 per iteration", len(order), res.N)
	}
	for _, m := range []string{"a-ns/op", "b-ns/op", "a-allocs/op", "b-allocs/op", "a/b"} {
		if _, ok := res.Extra[m]; !ok {
			t.Errorf("metric %s is missing; got %v", m, res.Extra)
		}
	}
	want := float64(totals.Time[0]) / float64(totals.Time[1])
	if got := res.Extra["a/b"]; got != want {
		t.Errorf("a/b = %v; want the ratio of the measured totals, %v", got, want)
	}
}

func TestLoopRotatesThreeSides(t *testing.T) {
	var order []string
	testing.Benchmark(func(b *testing.B) {
		order = order[:0]
		op := func(name string) pair.Op {
			return pair.Op{Name: name, Run: func(int) error { order = append(order, name); return nil }}
		}
		pair.Loop(b, []pair.Op{op("x"), op("y"), op("z")})
	})
	if len(order) < 9 {
		t.Fatalf("only %d ops ran", len(order))
	}
	for i, want := range [][]string{{"x", "y", "z"}, {"y", "z", "x"}, {"z", "x", "y"}} {
		if got := order[3*i : 3*i+3]; !slices.Equal(got, want) {
			t.Errorf("iteration %d ran %v; want %v (each side goes first in turn)", i, got, want)
		}
	}
}

func TestLoopCountsEachSidesAllocations(t *testing.T) {
	res := testing.Benchmark(func(b *testing.B) {
		pair.Loop(b, []pair.Op{
			{Name: "none", Run: func(int) error { return nil }},
			{Name: "many", Run: func(int) error {
				for range 100 {
					sink = append(sink, make([]byte, 64))
				}
				sink = sink[:0]
				return nil
			}},
		})
	})
	if got := res.Extra["many-allocs/op"]; got < 100 || got > 102 {
		t.Errorf("the side allocating 100 objects per call reports %v allocs/op", got)
	}
	if got := res.Extra["none-allocs/op"]; got > 1 {
		t.Errorf("the side allocating nothing reports %v allocs/op; allocations leak across sides", got)
	}
}

func TestMeanIsPerCall(t *testing.T) {
	tot := pair.Totals{Names: []string{"a", "b"}, Time: []time.Duration{10 * time.Second, 4 * time.Second}, Calls: 4}
	if got := tot.Mean("a"); got != 2500*time.Millisecond {
		t.Errorf("Mean(a) = %v; want 2.5s", got)
	}
	if got := tot.Mean("missing"); got != 0 {
		t.Errorf("Mean of an unknown side = %v; want 0", got)
	}
}

func TestLoopFailsOnAnOpError(t *testing.T) {
	res := testing.Benchmark(func(b *testing.B) {
		pair.Loop(b, []pair.Op{
			{Name: "ok", Run: func(int) error { return nil }},
			{Name: "bad", Run: func(i int) error { return errors.New("broken") }},
		})
	})
	if res.N != 0 {
		t.Errorf("a benchmark whose op fails reported %d iterations; want a failure (N=0)", res.N)
	}
}

// fakeClock is a clock that moves only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestBeforeAndAfterAreUntimedAndSurroundRun(t *testing.T) {
	clock := &fakeClock{t: time.Unix(0, 0)}
	defer pair.SetClock(clock.now)()
	var order []string
	res := testing.Benchmark(func(b *testing.B) {
		order = order[:0]
		pair.Loop(b, []pair.Op{
			{
				Name:   "a",
				Before: func(int) error { order = append(order, "before"); clock.advance(time.Hour); return nil },
				Run:    func(int) error { order = append(order, "run"); clock.advance(time.Millisecond); return nil },
				After:  func(int) error { order = append(order, "after"); clock.advance(time.Hour); return nil },
			},
		})
	})
	if got := res.Extra["a-ns/op"]; got != float64(time.Millisecond) {
		t.Errorf("a-ns/op = %v; want exactly Run's 1ms, without Before's and After's hours", got)
	}
	for i := 0; i < len(order); i += 3 {
		if got := order[i : i+3]; !slices.Equal(got, []string{"before", "run", "after"}) {
			t.Fatalf("call %d ran %v; want before, run, after", i/3, got)
		}
	}
}
