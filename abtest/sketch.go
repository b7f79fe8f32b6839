package abtest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// SketchExactBelow is the latency, in milliseconds, under which a
// LatencySketch counts every value exactly.
const SketchExactBelow = 256

// SketchRelativeError bounds how far a percentile read from a
// LatencySketch lies from the exact one (nearest rank over the same
// latencies): at most this fraction of the exact value, and zero under
// SketchExactBelow.
const SketchRelativeError = 1.0 / 256

// sketchSubBucketBits is log2 of how many buckets split each power of two
// from SketchExactBelow up (128).
const sketchSubBucketBits = 7

// LatencySketch is a bounded histogram of turn latencies in
// milliseconds, the latency record of an A/B sample. A latency under
// SketchExactBelow has a bucket of its own; a larger one falls in one of
// 128 equal buckets of its power of two ([256, 512) in buckets 2 ms wide,
// [512, 1024) 4 ms, and so on). So a sketch holds at most a few thousand
// buckets whatever the number of turns (a few dozen for one session), two
// sketches merge by adding counts, and a percentile read from one is
// within SketchRelativeError of the exact value.
//
// It is a value: Add and Merge return a new sketch and never change the
// receiver's buckets, so copies of a SessionMetrics may share them. In
// JSON it is an array of [low, count] pairs, ascending by low, where low
// is the smallest latency of the bucket (the bucket of a latency l ≥ 256
// starts at l rounded down to a multiple of its width).
type LatencySketch struct {
	buckets []sketchBucket
}

type sketchBucket struct {
	low, count int64
}

// sketchLow returns the lowest latency of ms's bucket and the bucket's
// width. Negative latencies count as 0.
func sketchLow(ms int64) (low, width int64) {
	if ms < SketchExactBelow {
		return max(ms, 0), 1
	}
	shift := bits.Len64(uint64(ms)) - 1 - sketchSubBucketBits // 2^e ≤ ms < 2^(e+1), 128 buckets per e
	return ms >> shift << shift, 1 << shift
}

// Add returns the sketch with one more latency of ms milliseconds.
func (s LatencySketch) Add(ms int64) LatencySketch {
	return s.add(ms, 1)
}

func (s LatencySketch) add(ms, n int64) LatencySketch {
	low, _ := sketchLow(ms)
	i, found := slices.BinarySearchFunc(s.buckets, low, func(b sketchBucket, low int64) int {
		switch {
		case b.low < low:
			return -1
		case b.low > low:
			return 1
		}
		return 0
	})
	out := make([]sketchBucket, len(s.buckets), len(s.buckets)+1)
	copy(out, s.buckets)
	if found {
		out[i].count += n
	} else {
		out = slices.Insert(out, i, sketchBucket{low, n})
	}
	return LatencySketch{out}
}

// Merge returns the sketch of both sketches' latencies.
func (s LatencySketch) Merge(o LatencySketch) LatencySketch {
	out := make([]sketchBucket, 0, len(s.buckets)+len(o.buckets))
	i, j := 0, 0
	for i < len(s.buckets) || j < len(o.buckets) {
		switch {
		case j == len(o.buckets) || i < len(s.buckets) && s.buckets[i].low < o.buckets[j].low:
			out = append(out, s.buckets[i])
			i++
		case i == len(s.buckets) || o.buckets[j].low < s.buckets[i].low:
			out = append(out, o.buckets[j])
			j++
		default:
			out = append(out, sketchBucket{s.buckets[i].low, s.buckets[i].count + o.buckets[j].count})
			i, j = i+1, j+1
		}
	}
	return LatencySketch{out}
}

// Count is how many latencies the sketch holds.
func (s LatencySketch) Count() int64 {
	var n int64
	for _, b := range s.buckets {
		n += b.count
	}
	return n
}

// Buckets is how many buckets the sketch holds (what its size grows
// with).
func (s LatencySketch) Buckets() int { return len(s.buckets) }

// Percentile returns the p-th percentile (0 < p <= 100) by the nearest
// rank method, as Percentile does over the exact latencies: the middle of
// the bucket holding the value at rank ceil(p/100 × n), which is that
// value exactly under SketchExactBelow and within SketchRelativeError of
// it above. It returns 0 for an empty sketch.
func (s LatencySketch) Percentile(p float64) int64 {
	n := s.Count()
	if n == 0 {
		return 0
	}
	rank := int64(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	var seen int64
	for _, b := range s.buckets {
		seen += b.count
		if seen >= rank {
			_, width := sketchLow(b.low)
			return b.low + width/2
		}
	}
	return 0 // unreachable: the counts add up to n
}

// MarshalJSON writes the sketch as [[low, count], …].
func (s LatencySketch) MarshalJSON() ([]byte, error) {
	pairs := make([][2]int64, len(s.buckets))
	for i, b := range s.buckets {
		pairs[i] = [2]int64{b.low, b.count}
	}
	return json.Marshal(pairs)
}

// UnmarshalJSON reads [[low, count], …] and refuses a document no sketch
// writes: a low that starts no bucket, lows out of order or repeated, or
// a count below 1.
func (s *LatencySketch) UnmarshalJSON(data []byte) error {
	var pairs [][]int64
	if err := json.Unmarshal(data, &pairs); err != nil {
		return fmt.Errorf("a latency sketch is an array of [low, count] pairs: %w", err)
	}
	out := make([]sketchBucket, 0, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return fmt.Errorf("latency sketch bucket %d has %d numbers; a bucket is [low, count]", i, len(p))
		}
		low, count := p[0], p[1]
		if l, _ := sketchLow(low); l != low || low < 0 {
			return fmt.Errorf("latency sketch bucket %d: %d ms starts no bucket", i, low)
		}
		if i > 0 && low <= out[i-1].low {
			return fmt.Errorf("latency sketch bucket %d: %d ms is not after %d ms", i, low, out[i-1].low)
		}
		if count < 1 {
			return fmt.Errorf("latency sketch bucket %d: count %d is below 1", i, count)
		}
		out = append(out, sketchBucket{low, count})
	}
	s.buckets = out
	return nil
}

// sketchOf returns the sketch of exact latencies (format 1 of a sample).
func sketchOf(latencies []int64) LatencySketch {
	var s LatencySketch
	for _, l := range latencies {
		s = s.add(l, 1)
	}
	return s
}
