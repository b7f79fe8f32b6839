package abtest_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"agentkit/abtest"
)

func TestPercentileIsNearestRank(t *testing.T) {
	vals := []int64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100}
	for _, c := range []struct {
		p    float64
		want int64
	}{{50, 50}, {95, 100}, {90, 90}, {10, 10}, {1, 10}, {100, 100}} {
		if got := abtest.Percentile(vals, c.p); got != c.want {
			t.Errorf("p%v of 10..100 = %d, want %d (nearest rank: ceil(p/100·n))", c.p, got, c.want)
		}
	}
	if got := abtest.Percentile([]int64{7}, 95); got != 7 {
		t.Errorf("p95 of one value = %d", got)
	}
	if got := abtest.Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %d", got)
	}
}

// Newcombe, "Interval estimation for the difference between independent
// proportions: comparison of eleven methods", Statistics in Medicine 17
// (1998), table II: method 10 (the hybrid score interval) gives these
// bounds for the worked examples.
func TestCompareMatchesNewcombesPublishedIntervals(t *testing.T) {
	for _, c := range []struct {
		k1, n1, k2, n2 int64
		low, high      float64
	}{
		{56, 70, 48, 80, 0.0524, 0.3339},
		{9, 10, 3, 10, 0.1705, 0.8090},
		{6, 7, 2, 7, 0.0582, 0.8062},
		{5, 56, 0, 29, -0.0381, 0.1926},
	} {
		got := abtest.Compare("b", c.k1, c.n1, "a", c.k2, c.n2)
		if !got.Defined || math.Abs(got.Low-c.low) > 0.00005 || math.Abs(got.High-c.high) > 0.00005 {
			t.Errorf("Compare(%d/%d vs %d/%d) = [%.4f, %.4f], Newcombe's method 10 gives [%.4f, %.4f]",
				c.k1, c.n1, c.k2, c.n2, got.Low, got.High, c.low, c.high)
		}
		if got.Significant != (c.low > 0 || c.high < 0) {
			t.Errorf("Compare(%d/%d vs %d/%d): significant = %v, but the interval [%.4f, %.4f] %s zero",
				c.k1, c.n1, c.k2, c.n2, got.Significant, c.low, c.high, map[bool]string{true: "excludes", false: "holds"}[c.low > 0 || c.high < 0])
		}
		if got.Method != abtest.IntervalMethod || got.Level != 0.95 {
			t.Errorf("method %q level %v", got.Method, got.Level)
		}
	}
	if c := abtest.Compare("b", 0, 0, "a", 3, 10); c.Defined {
		t.Errorf("an interval over a variant without sessions: %+v", c)
	}
}

func metrics(variant string, failed []bool, lat ...int64) abtest.SessionMetrics {
	m := abtest.SessionMetrics{Variant: variant}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, l := range lat {
		m = m.AddTurn(abtest.Turn{Failed: i < len(failed) && failed[i], InputTokens: 10, OutputTokens: 5, Latency: time.Duration(l) * time.Millisecond, At: at.Add(time.Duration(i) * time.Second)})
	}
	return m
}

func TestFiguresAggregatePerVariant(t *testing.T) {
	exp := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "plain", Weight: 2}, {Name: "friendly", Instructions: "be warm"}}}
	s := abtest.State{"tone": {
		"s1": metrics("plain", nil, 100, 200),
		"s2": metrics("plain", []bool{false, true}, 300, 400),
		"s3": metrics("friendly", nil, 50),
		"s4": metrics("gone", nil, 10), // a variant no longer defined
	}, "old": {"s5": metrics("x", nil, 1)}}
	figs := abtest.Figures([]abtest.Experiment{exp}, s)
	if len(figs) != 2 || figs[0].Name != "tone" || !figs[0].Configured || figs[1].Name != "old" || figs[1].Configured {
		t.Fatalf("figures %+v: want the configured experiment, then the stored one marked not configured", figs)
	}
	v := figs[0].Variants
	if len(v) != 3 || v[0].Name != "plain" || v[1].Name != "friendly" || v[2].Name != "gone" {
		t.Fatalf("variants %+v: defined ones in order, then the ones only in samples", v)
	}
	p := v[0]
	if p.Sessions != 2 || p.Turns != 4 || p.FailedTurns != 1 || p.FailureRate != 0.25 || p.FailedSessions != 1 || p.SessionFailureRate != 0.5 ||
		p.MeanTokensPerTurn != 15 || p.P50Ms != 200 || p.P95Ms != 401 || p.Weight != 2 { // 400 ms: the middle of [400, 402)
		t.Errorf("plain: %+v", p)
	}
	if f := v[1]; f.Sessions != 1 || f.Turns != 1 || f.P50Ms != 50 || f.P95Ms != 50 || len(f.Changes) != 1 || f.Changes[0] != "instructions" {
		t.Errorf("friendly: %+v", f)
	}
	if len(figs[0].Comparisons) != 2 || figs[0].Comparisons[0].Variant != "friendly" || figs[0].Comparisons[0].Control != "plain" {
		t.Errorf("comparisons %+v: each other variant against the first", figs[0].Comparisons)
	}
}

// randomState draws sessions over a few experiments, with overlapping
// session ids at different turn counts.
func randomState(r *rand.Rand) abtest.State {
	s := abtest.State{}
	for range r.IntN(20) {
		exp := fmt.Sprintf("e%d", r.IntN(3))
		if s[exp] == nil {
			s[exp] = map[string]abtest.SessionMetrics{}
		}
		lat := make([]int64, 1+r.IntN(4))
		for i := range lat {
			lat[i] = int64(r.IntN(1000))
		}
		s[exp][fmt.Sprintf("s%d", r.IntN(8))] = metrics("v", nil, lat...)
	}
	return s
}

func TestJoinIsCommutativeAssociativeAndIdempotent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		a, b, c := randomState(r), randomState(r), randomState(r)
		ab := a.Clone()
		ab.Join(b)
		ba := b.Clone()
		ba.Join(a)
		if !same(ab, ba) {
			t.Fatalf("a⊔b ≠ b⊔a:\n%v\n%v", ab, ba)
		}
		abc := ab.Clone()
		abc.Join(c)
		bc := b.Clone()
		bc.Join(c)
		abc2 := a.Clone()
		abc2.Join(bc)
		if !same(abc, abc2) {
			t.Fatal("(a⊔b)⊔c ≠ a⊔(b⊔c)")
		}
		again := abc.Clone()
		if again.Join(a) || again.Join(abc) || !same(again, abc) {
			t.Fatal("joining a state already included changed it")
		}
		if !abc.Includes(a) || !abc.Includes(b) || !abc.Includes(c) {
			t.Fatal("a join does not include its parts")
		}
		// Each session counts once, with its longest history.
		for exp, sessions := range abc {
			for id, m := range sessions {
				for _, part := range []abtest.State{a, b, c} {
					if p, ok := part[exp][id]; ok && p.Turns > m.Turns {
						t.Fatalf("session %s/%s kept %d turns though a part had %d", exp, id, m.Turns, p.Turns)
					}
				}
			}
		}
	}
}

func same(a, b abtest.State) bool {
	if len(a) != len(b) {
		return false
	}
	for exp, sa := range a {
		sb := b[exp]
		if len(sa) != len(sb) {
			return false
		}
		for id, m := range sa {
			o, ok := sb[id]
			if !ok || m.Turns != o.Turns || !sameSketch(m.Latency, o.Latency) || !m.UpdatedAt.Equal(o.UpdatedAt) {
				return false
			}
		}
	}
	return true
}

func sameSketch(a, b abtest.LatencySketch) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
