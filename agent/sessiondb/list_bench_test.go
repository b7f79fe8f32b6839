package sessiondb_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"agentkit/agent/sessiondb"
)

// BenchmarkListPage measures a page of 50 of serving mode local's session
// listing (Runtime.ListSessions reads this database) with 1,000 and with
// 1,000,000 sessions: the first page, and a page from a cursor in the
// middle, alternated in one loop. The rows are written 10,000 to a
// transaction (the fill only):
//
//	go test -run '^$' -bench ListPage -benchtime 2000x ./agent/sessiondb/
func BenchmarkListPage(b *testing.B) {
	for _, n := range []int{1000, 1_000_000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			ctx := context.Background()
			db, err := sessiondb.Open(ctx, filepath.Join(b.TempDir(), "sessions.db"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for from := 0; from < n; from += 10_000 {
				err := db.Write(ctx, func(tx *sessiondb.Tx) error {
					for i := from; i < min(from+10_000, n); i++ {
						at := t0.Add(time.Duration(i) * time.Millisecond)
						m := sessiondb.Meta{ID: fmt.Sprintf("s-%08d", i), ChannelID: "http", CreatedAt: at, UpdatedAt: at, Turns: 1, LastSeq: 3}
						if err := tx.Put(m); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			mid := &sessiondb.Cursor{UpdatedAt: t0.Add(time.Duration(n/2) * time.Millisecond), ID: fmt.Sprintf("s-%08d", n/2)}
			var first, middle []time.Duration
			round := 0
			for b.Loop() {
				round++
				for k := range 2 {
					var after *sessiondb.Cursor
					if (round+k)%2 == 1 {
						after = mid
					}
					start := time.Now()
					rows, err := db.List(ctx, 50, after)
					d := time.Since(start)
					if err != nil || len(rows) != 50 {
						b.Fatalf("a page: %d rows, %v", len(rows), err)
					}
					if after == nil {
						first = append(first, d)
					} else {
						middle = append(middle, d)
					}
				}
			}
			med := func(d []time.Duration) time.Duration {
				slices.Sort(d)
				return d[len(d)/2]
			}
			b.ReportMetric(float64(med(first).Microseconds()), "first-p50-µs")
			b.ReportMetric(float64(med(middle).Microseconds()), "middle-p50-µs")
		})
	}
}
