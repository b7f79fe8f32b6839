package abtest_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/abtest"
)

// latencies draws n latencies spread over seven orders of magnitude (log
// uniform from 0 to about 3 hours), with repeats, as turns of real agents
// have.
func latencies(rng *rand.Rand, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		switch rng.IntN(4) {
		case 0:
			out[i] = int64(rng.IntN(300)) // the exact range and just past it
		case 1:
			out[i] = out[max(i-1, 0)] // a repeat
		default:
			out[i] = int64(math.Exp(rng.Float64() * math.Log(1e7)))
		}
	}
	return out
}

func sketchOf(vals []int64) abtest.LatencySketch {
	var s abtest.LatencySketch
	for _, v := range vals {
		s = s.Add(v)
	}
	return s
}

// TestSketchPercentilesAreWithinTheStatedError checks every percentile a
// report reads (and more) against the exact nearest-rank value of the same
// latencies, for many sizes and draws.
func TestSketchPercentilesAreWithinTheStatedError(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 10, 99, 1000, 5000} {
		for range 5 {
			vals := latencies(rng, n)
			s := sketchOf(vals)
			if s.Count() != int64(n) {
				t.Fatalf("n=%d: the sketch counts %d latencies", n, s.Count())
			}
			sorted := slices.Clone(vals)
			slices.Sort(sorted)
			for _, p := range []float64{0.1, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100} {
				exact := abtest.Percentile(sorted, p)
				got := s.Percentile(p)
				limit := int64(float64(exact) * abtest.SketchRelativeError)
				if exact < abtest.SketchExactBelow {
					limit = 0
				}
				if d := got - exact; d < -limit || d > limit {
					t.Fatalf("n=%d p%v: the sketch reads %d ms, the exact value is %d ms: off by %d, more than %d", n, p, got, exact, d, limit)
				}
			}
		}
	}
	if got := (abtest.LatencySketch{}).Percentile(50); got != 0 {
		t.Errorf("the empty sketch's p50 = %d, want 0", got)
	}
}

// TestSketchMergeIsTheSketchOfAllTheLatencies: hosts and variants merge
// sketches, so merging in any grouping gives the sketch of the union, and
// Add and Merge never change a sketch another copy shares.
func TestSketchMergeIsTheSketchOfAllTheLatencies(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	vals := latencies(rng, 3000)
	whole := sketchOf(vals)
	a, b, c := sketchOf(vals[:1000]), sketchOf(vals[1000:1700]), sketchOf(vals[1700:])
	for name, m := range map[string]abtest.LatencySketch{
		"(a+b)+c": a.Merge(b).Merge(c),
		"a+(b+c)": a.Merge(b.Merge(c)),
		"c+b+a":   c.Merge(b).Merge(a),
	} {
		if j, w := encode(t, m), encode(t, whole); j != w {
			t.Errorf("%s differs from the sketch of all the latencies", name)
		}
	}
	before := encode(t, a)
	_ = a.Add(5)
	_ = a.Add(1 << 20)
	_ = a.Merge(b)
	if encode(t, a) != before {
		t.Error("Add or Merge changed the sketch it was called on")
	}
}

// TestSketchSizeDoesNotGrowWithTheTurns: a session of 30,000 turns keeps
// a sample of a few kilobytes, where format 1 listed every latency (about
// 180 KB of them).
func TestSketchSizeDoesNotGrowWithTheTurns(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m := abtest.SessionMetrics{Variant: "plain"}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sizes := map[int]int{}
	for i := 1; i <= 30_000; i++ {
		ms := int64(math.Exp(rng.Float64() * math.Log(600_000))) // up to 10 minutes
		m = m.AddTurn(abtest.Turn{Latency: time.Duration(ms) * time.Millisecond, At: at})
		if i == 1000 || i == 30_000 {
			doc, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			sizes[i] = len(doc)
		}
	}
	// 256 exact buckets and 128 per power of two from 256 ms to 10
	// minutes (12 of them): at most 1,792 buckets, whatever the turns.
	if m.Latency.Buckets() > 256+12*128 || m.Latency.Count() != 30_000 {
		t.Errorf("30,000 turns: %d buckets holding %d latencies", m.Latency.Buckets(), m.Latency.Count())
	}
	if sizes[30_000] > 25_000 || sizes[30_000] > 4*sizes[1000] {
		t.Errorf("a sample is %d bytes after 1,000 turns and %d after 30,000: it grows with the turns", sizes[1000], sizes[30_000])
	}
	t.Logf("a sample is %d bytes after 1,000 turns, %d after 30,000 (%d buckets)", sizes[1000], sizes[30_000], m.Latency.Buckets())
}

// TestFormatOneSamplesAreRead: a sample or snapshot written before the
// sketch, which listed every latency, reads as the same sketch; a
// snapshot of format 1 is read and rewritten as format 2.
func TestFormatOneSamplesAreRead(t *testing.T) {
	var m abtest.SessionMetrics
	doc := `{"variant":"plain","turns":4,"failedTurns":1,"inputTokens":3,"outputTokens":4,"latenciesMs":[120,80,900,80],"updatedAt":"2026-01-02T03:04:05Z"}`
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	if m.Turns != 4 || m.Latency.Count() != 4 || m.Latency.Percentile(50) != 80 || m.Latency.Percentile(75) != 120 || m.Latency.Percentile(100) != 902 {
		t.Errorf("format 1 read as %+v (p50 %d, p75 %d, p100 %d)", m, m.Latency.Percentile(50), m.Latency.Percentile(75), m.Latency.Percentile(100))
	}
	out, _ := json.Marshal(m)
	if strings.Contains(string(out), "latenciesMs") || !strings.Contains(string(out), `"latency":[[80,2],[120,1],[900,1]]`) {
		t.Errorf("rewritten as %s; want the sketch only", out)
	}
	snap, err := abtest.DecodeSnapshot([]byte(`{"v":1,"sessions":{"tone":{"s1":` + doc + `}}}`))
	if err != nil {
		t.Fatalf("a format 1 snapshot: %v", err)
	}
	if got := snap.Sessions["tone"]["s1"]; got.Latency.Count() != 4 {
		t.Errorf("the format 1 snapshot's session: %+v", got)
	}
}

// TestSketchRefusesWhatNoSketchWrites: bucket lows that start no bucket,
// out of order or repeated, counts below one, and a sketch that holds a
// different number of latencies than the session has turns.
func TestSketchRefusesWhatNoSketchWrites(t *testing.T) {
	for _, doc := range []string{
		`[[257,1]]`,         // 257 ms lies in the bucket [256, 258)
		`[[-1,1]]`,          // negative
		`[[5,1],[5,1]]`,     // repeated
		`[[9,1],[5,1]]`,     // out of order
		`[[5,0]]`,           // an empty bucket
		`{"5":1}`,           // not pairs
		`[[5,1,2]]`,         // not a pair
		`[["5",1]]`,         // not a number
		`[[5,1.5]]`,         // not a count
		`[[1024,-3],[2,1]]`, // several faults
	} {
		var s abtest.LatencySketch
		if err := json.Unmarshal([]byte(doc), &s); err == nil {
			t.Errorf("the sketch %s was accepted", doc)
		}
	}
	_, err := abtest.DecodeSnapshot([]byte(`{"v":2,"sessions":{"tone":{"s1":{"variant":"plain","turns":3,"latency":[[80,2]]}}}}`))
	if err == nil || !strings.Contains(err.Error(), "2 latencies for 3 turns") {
		t.Errorf("a session with 3 turns and 2 latencies: %v", err)
	}
}

// TestTheSameSampleMergedTwiceCountsOnce: samples are cumulative, so a
// session's latest metrics replace its earlier ones; merging one sample
// twice, or an earlier one after it, adds no turn and no latency.
func TestTheSameSampleMergedTwiceCountsOnce(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m1 := abtest.SessionMetrics{Variant: "plain"}.AddTurn(abtest.Turn{Latency: 300 * time.Millisecond, At: at})
	m2 := m1.AddTurn(abtest.Turn{Latency: 40 * time.Millisecond, At: at.Add(time.Second)})
	s := abtest.State{}
	for _, m := range []abtest.SessionMetrics{m2, m2, m1, m2} {
		s.Join(abtest.State{"tone": {"s1": m}})
	}
	got := s["tone"]["s1"]
	if got.Turns != 2 || got.Latency.Count() != 2 || encode(t, got.Latency) != encode(t, m2.Latency) {
		t.Errorf("after merging one sample twice and an earlier one: %+v", got)
	}
	f := abtest.Figures(nil, s)[0].Variants[0]
	if f.Turns != 2 || f.P50Ms != 40 || f.P95Ms != 301 {
		t.Errorf("figures %+v: want 2 turns, p50 40 ms, p95 301 ms (the middle of [300, 302))", f)
	}
}

func encode(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
