package actor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The benchmarks measure ratios inside one loop: each iteration does the
// same operation on a small and on a large actor, alternately, and
// reports each side's time and their ratio, so machine noise hits both
// sides alike. Fixtures are built only when a benchmark runs (go test
// -bench), never by the tests.

// benchPayload is the JSON of one appended message (about 200 bytes).
var benchPayload = json.RawMessage(`{"role":"user","text":"` + strings.Repeat("lorem ipsum ", 16) + `"}`)

// fillMessages gives a's message log n records, written in one
// transaction straight into its database.
func fillMessages(b *testing.B, a *Ref, n int) {
	b.Helper()
	ctx := context.Background()
	e, err := a.acquireWrite(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer a.h.pool.release(e)
	_, err = e.db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO messages (seq, at, type, data) SELECT i, i, 'user', ? FROM n`, n, []byte(benchPayload))
	if err != nil {
		b.Fatal(err)
	}
}

// flatFixture opens a Host (synchronous=full, as served) with a small
// actor of 1,000 messages and a large one of 1,000,000.
func flatFixture(b *testing.B) (small, large *Ref) {
	b.Helper()
	h := openHost(b, Options{})
	c := defineStatus(b, h)
	start := time.Now()
	small, large = actorOf(b, c, "small").Ref, actorOf(b, c, "large").Ref
	fillMessages(b, small, 1_000)
	fillMessages(b, large, 1_000_000)
	b.Logf("fixture: 1,000 and 1,000,000 messages in %v", time.Since(start).Round(time.Millisecond))
	return small, large
}

// BenchmarkAppendFlat appends one message (about 200 bytes, durable:
// WAL, synchronous=full) to an actor with 1,000 messages and to one with
// 1,000,000, alternately. ratio is the large actor's time over the small
// one's.
func BenchmarkAppendFlat(b *testing.B) {
	small, large := flatFixture(b)
	ctx := context.Background()
	b.Run("at=1k-vs-1M", func(b *testing.B) {
		var ts, tl time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := small.Messages().Append(ctx, "user", benchPayload); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := large.Messages().Append(ctx, "user", benchPayload); err != nil {
				b.Fatal(err)
			}
			ts, tl = ts+t1.Sub(t0), tl+time.Since(t1)
		}
		reportRatio(b, ts, tl)
	})
}

// BenchmarkLast20Flat reads the last 20 messages of an actor with 1,000
// messages and of one with 1,000,000, alternately.
func BenchmarkLast20Flat(b *testing.B) {
	small, large := flatFixture(b)
	ctx := context.Background()
	b.Run("at=1k-vs-1M", func(b *testing.B) {
		var ts, tl time.Duration
		for b.Loop() {
			t0 := time.Now()
			if recs, err := small.Messages().Last(ctx, 20); err != nil || len(recs) != 20 {
				b.Fatal(err)
			}
			t1 := time.Now()
			if recs, err := large.Messages().Last(ctx, 20); err != nil || len(recs) != 20 {
				b.Fatal(err)
			}
			ts, tl = ts+t1.Sub(t0), tl+time.Since(t1)
		}
		reportRatio(b, ts, tl)
	})
}

func reportRatio(b *testing.B, small, large time.Duration) {
	n := float64(b.N)
	b.ReportMetric(float64(small.Nanoseconds())/n, "ns/op-1k")
	b.ReportMetric(float64(large.Nanoseconds())/n, "ns/op-1M")
	b.ReportMetric(float64(large)/float64(small), "ratio")
}

// BenchmarkIdleActorMemory measures the memory each open, idle actor costs
// with 10,000 of them: every actor has a database (state written once),
// all 10,000 handles are kept and each was read in the last minute, and the
// pool (MaxOpen 128) keeps the least recently used closed. It reports the
// Go heap and the process's resident memory added per actor (SQLite's own
// memory is outside the Go heap, so RSS is the honest figure), and the
// databases left open.
func BenchmarkIdleActorMemory(b *testing.B) {
	const actors = 10_000
	ctx := context.Background()
	dir := filepath.Join(b.TempDir(), "actors")
	{
		// The fixture: 10,000 actor databases, written by a Host that is
		// closed before measuring.
		h := openHost(b, Options{Dir: dir, Synchronous: "normal"})
		c := defineStatus(b, h)
		start := time.Now()
		for i := range actors {
			if _, err := actorOf(b, c, "a"+strconv.Itoa(i)).SetState(ctx, []byte(`{"status":"processing"}`)); err != nil {
				b.Fatal(err)
			}
		}
		b.Logf("fixture: %d actor databases in %v", actors, time.Since(start).Round(time.Millisecond))
		h.Close()
	}
	for b.Loop() {
		heap0, rss0 := memNow(b)
		h, err := Open(Options{Dir: dir})
		if err != nil {
			b.Fatal(err)
		}
		c := defineStatus(b, h)
		handles := make([]*Actor[Status], actors)
		for i := range handles {
			handles[i] = actorOf(b, c, "a"+strconv.Itoa(i))
			if st, err := handles[i].State(ctx); err != nil || st.Status != "processing" {
				b.Fatal(st, err)
			}
		}
		heap1, rss1 := memNow(b)
		b.ReportMetric(float64(heap1-heap0)/actors, "heap-B/actor")
		b.ReportMetric(float64(rss1-rss0)/actors, "rss-B/actor")
		b.ReportMetric(float64(h.OpenDatabases()), "open-dbs")
		runtime.KeepAlive(handles)
		h.Close()
	}
}

// memNow returns the Go heap in use and the resident set size, in bytes,
// after a collection.
func memNow(b *testing.B) (heap, rss int64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return int64(ms.HeapInuse), pages * int64(os.Getpagesize())
}
