package abtest

import (
	"math"
	"slices"
	"sort"
)

// ConfidenceLevel is the level of the failure-rate intervals.
const ConfidenceLevel = 0.95

// z95 is the standard normal quantile for a two-sided 95% interval.
const z95 = 1.959963984540054

// IntervalMethod names how Comparison intervals are computed.
const IntervalMethod = "newcombe-hybrid-score"

// ExperimentFigures are the per-variant aggregates of one experiment and
// the comparison of each variant with the control (the first variant).
type ExperimentFigures struct {
	// Name is the experiment's name.
	Name string `json:"name"`
	// Configured is true when the experiment is in the agent's definition
	// on the host that computed the figures; an experiment that was
	// removed keeps its figures, with Configured false.
	Configured bool `json:"configured"`
	// Variants are the variants in definition order, then variants seen in
	// the samples but no longer defined, by name.
	Variants []VariantFigures `json:"variants"`
	// Comparisons compare each variant with the control, over sessions.
	Comparisons []Comparison `json:"comparisons"`
}

// VariantFigures aggregate the sessions enrolled in one variant.
type VariantFigures struct {
	Name string `json:"name"`
	// Weight is the configured weight (0 when no longer defined).
	Weight float64 `json:"weight"`
	// Changes lists what the variant changes (Variant.Changes).
	Changes []string `json:"changes"`
	// Sessions counts the enrolled sessions with at least one turn.
	Sessions int64 `json:"sessions"`
	// Turns and FailedTurns count the sessions' turns.
	Turns       int64 `json:"turns"`
	FailedTurns int64 `json:"failedTurns"`
	// FailureRate is FailedTurns / Turns (0 without turns).
	FailureRate float64 `json:"failureRate"`
	// FailedSessions counts sessions with at least one failed turn, and
	// SessionFailureRate is FailedSessions / Sessions: the rate the
	// comparisons use, since the turns of one session are not independent.
	FailedSessions     int64   `json:"failedSessions"`
	SessionFailureRate float64 `json:"sessionFailureRate"`
	// MeanTokensPerTurn is (input + output tokens) / Turns.
	MeanTokensPerTurn float64 `json:"meanTokensPerTurn"`
	// P50Ms and P95Ms are percentiles of the turns' latencies, in
	// milliseconds, by the nearest-rank method (the smallest latency with
	// at least 50% (95%) of the turns at or below it), read from the
	// sessions' latency sketches: exact under SketchExactBelow, within
	// SketchRelativeError of the exact value above. 0 without turns.
	P50Ms int64 `json:"p50Ms"`
	P95Ms int64 `json:"p95Ms"`
}

// Comparison is the difference in session failure rate between a variant
// and the control, with its confidence interval.
type Comparison struct {
	Variant string `json:"variant"`
	Control string `json:"control"`
	// Difference is the variant's session failure rate minus the
	// control's.
	Difference float64 `json:"difference"`
	// Low and High bound the interval; Defined is false (and they are 0)
	// when either side has no sessions.
	Low     float64 `json:"low"`
	High    float64 `json:"high"`
	Defined bool    `json:"defined"`
	// Level is the confidence level, ConfidenceLevel.
	Level float64 `json:"level"`
	// Method is IntervalMethod: Newcombe's hybrid score interval for a
	// difference of independent proportions (method 10 of Newcombe,
	// Statistics in Medicine 1998), built from Wilson score intervals.
	Method string `json:"method"`
	// Significant is true when the interval excludes zero: the difference
	// is unlikely to be noise at this level.
	Significant bool `json:"significant"`
}

// Figures computes the figures of every experiment in exps and every
// experiment found in s, in that order (found ones by name).
func Figures(exps []Experiment, s State) []ExperimentFigures {
	var out []ExperimentFigures
	seen := map[string]bool{}
	for _, e := range exps {
		seen[e.Name] = true
		out = append(out, experimentFigures(e, true, s[e.Name]))
	}
	var extra []string
	for name := range s {
		if !seen[name] {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		out = append(out, experimentFigures(Experiment{Name: name}, false, s[name]))
	}
	return out
}

func experimentFigures(e Experiment, configured bool, sessions map[string]SessionMetrics) ExperimentFigures {
	f := ExperimentFigures{Name: e.Name, Configured: configured, Variants: []VariantFigures{}, Comparisons: []Comparison{}}
	index := map[string]int{}
	for _, v := range e.Variants {
		index[v.Name] = len(f.Variants)
		f.Variants = append(f.Variants, VariantFigures{Name: v.Name, Weight: v.weight(), Changes: nonNil(v.Changes())})
	}
	var extra []string
	for _, m := range sessions {
		if _, ok := index[m.Variant]; !ok && !slices.Contains(extra, m.Variant) {
			extra = append(extra, m.Variant)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		index[name] = len(f.Variants)
		f.Variants = append(f.Variants, VariantFigures{Name: name, Changes: []string{}})
	}
	latencies := make([]LatencySketch, len(f.Variants))
	tokens := make([]int64, len(f.Variants))
	for _, m := range sessions {
		if m.Turns == 0 {
			continue
		}
		i := index[m.Variant]
		v := &f.Variants[i]
		v.Sessions++
		v.Turns += m.Turns
		v.FailedTurns += m.FailedTurns
		if m.FailedTurns > 0 {
			v.FailedSessions++
		}
		tokens[i] += m.InputTokens + m.OutputTokens
		latencies[i] = latencies[i].Merge(m.Latency)
	}
	for i := range f.Variants {
		v := &f.Variants[i]
		if v.Turns > 0 {
			v.FailureRate = float64(v.FailedTurns) / float64(v.Turns)
			v.MeanTokensPerTurn = float64(tokens[i]) / float64(v.Turns)
		}
		if v.Sessions > 0 {
			v.SessionFailureRate = float64(v.FailedSessions) / float64(v.Sessions)
		}
		v.P50Ms = latencies[i].Percentile(50)
		v.P95Ms = latencies[i].Percentile(95)
	}
	if len(f.Variants) > 0 {
		c := f.Variants[0]
		for _, v := range f.Variants[1:] {
			f.Comparisons = append(f.Comparisons, Compare(v.Name, v.FailedSessions, v.Sessions, c.Name, c.FailedSessions, c.Sessions))
		}
	}
	return f
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted values by
// the nearest-rank method: the value at rank ceil(p/100 × n), always one
// of the values. It is the exact value LatencySketch.Percentile comes
// within SketchRelativeError of. It returns 0 for no values.
func Percentile(sorted []int64, p float64) int64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Wilson returns the Wilson score interval of k successes in n trials at
// the 95% level; ok is false when n is 0.
func Wilson(k, n int64) (low, high float64, ok bool) {
	if n <= 0 || k < 0 || k > n {
		return 0, 0, false
	}
	nf := float64(n)
	p := float64(k) / nf
	z2 := z95 * z95
	denom := 1 + z2/nf
	center := (p + z2/(2*nf)) / denom
	half := z95 * math.Sqrt(p*(1-p)/nf+z2/(4*nf*nf)) / denom
	return max(0, center-half), min(1, center+half), true
}

// Compare returns the difference between the failure proportions k1/n1
// (variant) and k2/n2 (control) with Newcombe's hybrid score interval at
// the 95% level: with Wilson intervals (l1, u1) and (l2, u2) and
// d = p1 − p2, the interval is
// [d − √((p1−l1)² + (u2−p2)²), d + √((u1−p1)² + (p2−l2)²)].
func Compare(variant string, k1, n1 int64, control string, k2, n2 int64) Comparison {
	c := Comparison{Variant: variant, Control: control, Level: ConfidenceLevel, Method: IntervalMethod}
	l1, u1, ok1 := Wilson(k1, n1)
	l2, u2, ok2 := Wilson(k2, n2)
	if !ok1 || !ok2 {
		return c
	}
	p1, p2 := float64(k1)/float64(n1), float64(k2)/float64(n2)
	c.Difference = p1 - p2
	c.Low = c.Difference - math.Sqrt((p1-l1)*(p1-l1)+(u2-p2)*(u2-p2))
	c.High = c.Difference + math.Sqrt((u1-p1)*(u1-p1)+(p2-l2)*(p2-l2))
	c.Defined = true
	c.Significant = c.Low > 0 || c.High < 0
	return c
}
