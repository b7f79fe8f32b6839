package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/internal/testenv/pgtest"
	"agentkit/kv"
	"agentkit/ledger"
)

// BenchmarkLedgerListingPage measures a page of 50 sessions of serving
// mode ledger's listing on PostgreSQL, from the session index and, in the
// same loop, alternated with it, from every control record (the listing
// before the index), at two numbers of sessions:
//
//	go test -run '^$' -bench LedgerListingPage -benchtime 200x ./agent/
//
// The table is filled with synchronous_commit off (the fill only: the
// listing reads). Each side reports its median.
func BenchmarkLedgerListingPage(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			ctx := context.Background()
			db, err := kv.Open(ctx, pgtest.TableURL(b)+"&synchronous_commit=off")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { db.Close() })
			rt := open(b, agent.Config{
				Agent:   agent.Agent{Name: "ledger-agent", Model: echoModel(b), NoWorkspaceTools: true},
				Store:   db,
				Serving: agent.ServingLedger,
				Ledger:  agent.LedgerOptions{Tuning: ledger.Tuning{Lease: time.Minute}},
				Logger:  slog.New(slog.DiscardHandler),
			})
			if err := agent.BuildLedgerIndex(rt); err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < n; i += 16 {
						if _, err := rt.StartSession(ctx, agent.StartRequest{Message: "hi"}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for deadline := time.Now().Add(time.Minute); ; {
				ok, err := agent.LedgerIndexSettled(rt)
				if err != nil {
					b.Fatal(err)
				}
				if ok {
					break
				}
				if time.Now().After(deadline) {
					b.Fatal("the index does not settle")
				}
				time.Sleep(10 * time.Millisecond)
			}
			var idx, scan []time.Duration
			round := 0
			for b.Loop() {
				round++
				for k := range 2 {
					start := time.Now()
					var page agent.SessionPage
					if (round+k)%2 == 0 {
						page, err = rt.ListSessions(ctx, 50, "")
					} else {
						page, err = agent.ListLedgerSessionsByScan(rt, 50)
					}
					if err != nil || len(page.Sessions) != 50 {
						b.Fatalf("a page: %d sessions, %v", len(page.Sessions), err)
					}
					if (round+k)%2 == 0 {
						idx = append(idx, time.Since(start))
					} else {
						scan = append(scan, time.Since(start))
					}
				}
			}
			med := func(d []time.Duration) time.Duration {
				slices.Sort(d)
				return d[len(d)/2]
			}
			b.ReportMetric(float64(med(idx).Microseconds()), "index-p50-µs")
			b.ReportMetric(float64(med(scan).Microseconds()), "scan-p50-µs")
		})
	}
}
