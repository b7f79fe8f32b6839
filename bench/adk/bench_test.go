package adkbench

import (
	"fmt"
	"testing"

	"github.com/google/uuid"

	"agentkit/bench/pair"
)

// setup is one database configuration of the paired benchmarks.
type setup struct {
	name string
	db   string // "sqlite" or "postgres"
	mode string // ADK's SQLite journal setting (adkWAL, adkDefault)
}

// setups are the configurations every paired benchmark runs: ADK on
// SQLite with agentkit's durability (WAL, synchronous=FULL; the main
// comparison), ADK on SQLite with its defaults (rollback journal,
// synchronous=FULL), and both on PostgreSQL.
var setups = []setup{
	{"db=sqlite/adk=wal", "sqlite", adkWAL},
	{"db=sqlite/adk=default", "sqlite", adkDefault},
	{"db=postgres", "postgres", ""},
}

// loadSizes are the session lengths of BenchmarkLoadLast20.
var loadSizes = []int{1_000, 100_000}

// lastN is how many recent events the load benchmarks read.
const lastN = 20

// BenchmarkAppend alternates, in one loop, appending one event carrying a
// textSize-byte text to a session durably on each side, and reports
// adk-ns/op, agentkit-ns/op and adk/agentkit (how many times agentkit's
// append is faster).
//
//   - adk: session.Service.AppendEvent of ADK's database service: one
//     transaction that reads the session row and the app and user state
//     rows, inserts the event and updates the session row. On SQLite the
//     file is local; on PostgreSQL all of it goes to the server.
//   - agentkit: the runtime's per-event write (what turn.record does): the
//     event's JSON and the session row in one transaction of the local
//     session database (sessiondb.Record, WAL, synchronous=FULL). On
//     PostgreSQL the event is then also written through to the server (one
//     kv Put of a one-event batch through kv/pgkv), so that on that row
//     both sides have the event on the server when the append returns;
//     the runtime itself mirrors a turn's events in one batch at the
//     turn's end (BenchmarkTurn).
//
// On PostgreSQL it also reports adk-commits/op, the transactions ADK
// committed on the server per append (agentkit's is one Put).
func BenchmarkAppend(b *testing.B) {
	for _, c := range setups {
		b.Run(c.name, func(b *testing.B) {
			ctx := b.Context()
			dir := b.TempDir()
			s := newADK(b, c.db, c.mode, dir)
			sess, err := s.create(ctx, uuid.NewString())
			if err != nil {
				b.Fatal(err)
			}
			l := newAKLog(b, c.db, dir)
			c0 := s.commits.total()
			t := pair.Loop(b, []pair.Op{
				{Name: "adk", Run: func(i int) error { return s.appendEvent(ctx, sess, "inv", text(i+1)) }},
				{Name: "agentkit", Run: func(i int) error { return l.append(ctx, text(i+1)) }},
			}, pair.Ratio{Num: "adk", Den: "agentkit"})
			if s.commits != nil && t.Calls > 0 {
				b.ReportMetric(float64(s.commits.total()-c0)/float64(t.Calls), "adk-commits/op")
			}
		})
	}
}

// BenchmarkTurn alternates, in one loop, one full turn with an echo model
// on each side, starting a new session every turnsPerSession turns on
// both, and reports adk-ns/op, agentkit-ns/op and adk/agentkit.
//
//   - adk: ADK's runner (runner.Run) with an LLM agent (llmagent) on an
//     echo model (echoLLM), over the database session service: it gets
//     the session with all its events, appends the user's message, calls
//     the model with the conversation and appends the answer (one Get, two
//     AppendEvents; a Create every turnsPerSession turns).
//   - agentkit: Runtime.Continue (StartSession every turnsPerSession turns)
//     with its echo model and the memory journal off: the token looked up,
//     the session's row and head read, the kept conversation extended,
//     three events recorded and written durably with their commit to the
//     store. db=sqlite commits to the embedded default store, whose tables
//     are in the session database, in the events' own transaction (WAL,
//     synchronous=FULL); db=postgres commits to kv/pgkv in one batch at
//     the same time as the local write of the events.
//
// It also reports agentkit-store-writes/op, the store writes of a turn,
// and on PostgreSQL adk-commits/op.
func BenchmarkTurn(b *testing.B) {
	for _, c := range setups {
		b.Run(c.name, func(b *testing.B) {
			ctx := b.Context()
			dir := b.TempDir()
			s := newADK(b, c.db, c.mode, dir)
			r, err := newADKRunner(s)
			if err != nil {
				b.Fatal(err)
			}
			a := newAK(b, c.db, dir)
			ak := &akTurner{a: a}
			var adkSession string
			c0, w0 := s.commits.total(), a.writes.total()
			t := pair.Loop(b, []pair.Op{
				{Name: "adk", Run: func(i int) error {
					if i%turnsPerSession == 0 {
						sess, err := s.create(ctx, uuid.NewString())
						if err != nil {
							return err
						}
						adkSession = sess.ID()
					}
					msg := text(i)
					answer, err := r.turn(ctx, adkSession, msg)
					if err == nil && answer != echoPrefix+msg {
						err = fmt.Errorf("ADK answered %q; want the echo of %q", shorten(answer), shorten(msg))
					}
					return err
				}},
				{Name: "agentkit", Run: func(i int) error {
					msg := text(i)
					res, err := ak.turn(ctx, msg)
					if err == nil && res.Turn.Result != echoPrefix+msg {
						err = fmt.Errorf("agentkit answered %q; want the echo of %q", shorten(res.Turn.Result), shorten(msg))
					}
					return err
				}},
			}, pair.Ratio{Num: "adk", Den: "agentkit"})
			if t.Calls == 0 {
				return
			}
			b.ReportMetric(float64(a.writes.total()-w0)/float64(t.Calls), "agentkit-store-writes/op")
			if s.commits != nil {
				b.ReportMetric(float64(s.commits.total()-c0)/float64(t.Calls), "adk-commits/op")
			}
			if n := a.rt.Info().MirrorDropped; n != 0 {
				b.Fatalf("%d agentkit mirror writes were dropped", n)
			}
		})
	}
}

// BenchmarkLoadLast20 alternates, in one loop, loading the last lastN
// events of a session holding 1,000 or 100,000 events, decoded, on local
// SQLite files, and reports adk/agentkit.
//
//   - adk: session.Service.Get with NumRecentEvents: the session row, the
//     events (ORDER BY timestamp DESC LIMIT 20), the app and user state
//     rows. Each session length has a database of its own (WAL).
//   - agentkit: Runtime.LastEvents, the runtime's public path: the session
//     row and the last events from the local session database (one index
//     range), decoded.
//
// On PostgreSQL agentkit reads the same local file (a runtime serves its
// sessions from local disk whatever its store), so the figure would be
// ADK's server read against agentkit's local one; it is not run.
func BenchmarkLoadLast20(b *testing.B) {
	for _, n := range loadSizes {
		b.Run(fmt.Sprintf("events=%d/db=sqlite", n), func(b *testing.B) {
			ctx := b.Context()
			af := adkLoad(b, "sqlite", n)
			kf := akLoad(b, "sqlite", n)
			check := func(who string, got int) error {
				if got != lastN {
					return fmt.Errorf("%s loaded %d events, want %d", who, got, lastN)
				}
				return nil
			}
			pair.Loop(b, []pair.Op{
				{Name: "adk", Run: func(int) error {
					evs, err := af.side.lastEvents(ctx, af.id, lastN)
					if err != nil {
						return err
					}
					return check("ADK", len(evs))
				}},
				{Name: "agentkit", Run: func(int) error {
					evs, err := kf.side.rt.LastEvents(ctx, kf.id, lastN)
					if err != nil {
						return err
					}
					return check("agentkit", len(evs))
				}},
			}, pair.Ratio{Num: "adk", Den: "agentkit"})
		})
	}
}
