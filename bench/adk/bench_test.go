package adkbench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"google.golang.org/adk/v2/session"

	"agentkit/agent"
)

// The databases every benchmark runs on: a SQLite file on local disk and
// the PostgreSQL server of pgServer.
var databases = []string{"sqlite", "postgres"}

// loadSizes are the session lengths of BenchmarkLoadLast20.
var loadSizes = []int{1_000, 100_000}

// lastN is how many recent events the load benchmarks read.
const lastN = 20

// turnsPerSession is how many turns BenchmarkTurn runs in one session
// before starting the next, on both sides, so that agentkit's history read
// (every turn rebuilds the conversation from the session's events) stays
// that of a short chat however many iterations run.
const turnsPerSession = 16

// BenchmarkAppend appends one event carrying a textSize-byte text to a
// session, durably.
//
//   - impl=adk: session.Service.AppendEvent of ADK's database service on a
//     fresh database (one transaction: read the session row, the app and
//     user state rows, insert the event, update the session row).
//   - impl=agentkit: the runtime's per-event write (what turn.record does):
//     the event's JSON and the session row in one transaction of the local
//     session database (sessiondb.Record, WAL, synchronous=FULL). It is
//     the same on both db rows: agentkit writes no store per event; its
//     mirror to the store runs once per turn and is in BenchmarkTurn.
func BenchmarkAppend(b *testing.B) {
	for _, db := range databases {
		b.Run("db="+db, func(b *testing.B) {
			b.Run("impl=adk", func(b *testing.B) {
				s := newADK(b, db, b.TempDir())
				ctx := b.Context()
				sess, err := s.create(ctx, uuid.NewString())
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					if err := s.appendEvent(ctx, sess, "inv", text(i)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("impl=agentkit", func(b *testing.B) {
				l, err := openAKLog(b.Context(), filepath.Join(b.TempDir(), sessionsFile))
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				ctx := b.Context()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					if err := l.append(ctx, text(i)); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkTurn persists one turn of three events (the user's message, the
// model's answer, the turn's end; textSize-byte texts) per op, starting a
// new session every turnsPerSession turns (inside the timed loop, on both
// sides). It also reports ns/event, a third of ns/op.
//
//   - impl=adk: three AppendEvent calls (and, every turnsPerSession turns,
//     a Create).
//   - impl=agentkit: the runtime's public path, Runtime.Continue (every
//     turnsPerSession turns, StartSession) with the echo model and the
//     memory journal off: resolving the token, rebuilding the history from
//     the session's events, three durable local writes, and the turn-end
//     mirror flush to the store (the event batch, the session metadata,
//     the session-index entry and the deletion of the previous one; the
//     continuation token on a session's first turn) plus recording what
//     was mirrored. db=sqlite mirrors to the default store (kv/sqlitekv
//     file, WAL, synchronous=FULL), db=postgres to kv/pgkv.
func BenchmarkTurn(b *testing.B) {
	for _, db := range databases {
		b.Run("db="+db, func(b *testing.B) {
			b.Run("impl=adk", func(b *testing.B) {
				s := newADK(b, db, b.TempDir())
				ctx := b.Context()
				b.ReportAllocs()
				var sess session.Session
				i := 0
				for b.Loop() {
					if i%turnsPerSession == 0 {
						var err error
						if sess, err = s.create(ctx, uuid.NewString()); err != nil {
							b.Fatal(err)
						}
					}
					if err := s.turn(ctx, sess, fmt.Sprintf("inv-%d", i), text(i)); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(3*i), "ns/event")
			})
			b.Run("impl=agentkit", func(b *testing.B) {
				a := newAK(b, db, b.TempDir())
				ctx := b.Context()
				b.ReportAllocs()
				var token string
				i := 0
				for b.Loop() {
					var res agent.TurnResult
					var err error
					if i%turnsPerSession == 0 {
						res, err = a.rt.StartSession(ctx, agent.StartRequest{Message: text(i)})
						token = res.ContinuationToken
					} else {
						res, err = a.rt.Continue(ctx, agent.ContinueRequest{Token: token, Message: text(i)})
					}
					if err != nil {
						b.Fatal(err)
					}
					if res.Turn.Status != agent.StatusCompleted {
						b.Fatalf("turn %d ended %s: %s", i, res.Turn.Status, res.Turn.Result)
					}
					i++
				}
				b.StopTimer()
				if n := a.rt.Info().MirrorDropped; n != 0 {
					b.Fatalf("%d mirror writes were dropped", n)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(3*i), "ns/event")
			})
		})
	}
}

// BenchmarkLoadLast20 loads the last lastN events of a session holding
// 1,000 or 100,000 events, decoded.
//
//   - impl=adk: session.Service.Get with NumRecentEvents: the session row,
//     the events (ORDER BY timestamp DESC LIMIT 20), the app and user
//     state rows. Each session length has a database of its own.
//   - impl=agentkit: Runtime.LastEvents, the runtime's public path: the
//     session row and the last events from the local session database
//     (one index range), decoded. The store is not read, so db=postgres
//     measures the same local read as db=sqlite, with the runtime
//     configured on PostgreSQL.
func BenchmarkLoadLast20(b *testing.B) {
	for _, n := range loadSizes {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			for _, db := range databases {
				b.Run("db="+db, func(b *testing.B) {
					b.Run("impl=adk", func(b *testing.B) {
						f := adkLoad(b, db, n)
						ctx := b.Context()
						b.ReportAllocs()
						for b.Loop() {
							evs, err := f.side.lastEvents(ctx, f.id, lastN)
							if err != nil {
								b.Fatal(err)
							}
							if len(evs) != lastN {
								b.Fatalf("loaded %d events, want %d", len(evs), lastN)
							}
						}
					})
					b.Run("impl=agentkit", func(b *testing.B) {
						f := akLoad(b, db, n)
						ctx := b.Context()
						b.ReportAllocs()
						for b.Loop() {
							evs, err := f.side.rt.LastEvents(ctx, f.id, lastN)
							if err != nil {
								b.Fatal(err)
							}
							if len(evs) != lastN {
								b.Fatalf("loaded %d events, want %d", len(evs), lastN)
							}
						}
					})
				})
			}
		})
	}
}
