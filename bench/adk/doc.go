// Package adkbench compares agentkit with Google's Agent Development Kit for
// Go (google.golang.org/adk/v2, v2.2.0: its database session service and
// its runner) in benchmarks that alternate the two sides inside one loop
// (package agentkit/bench/pair), so a ratio comes from one run and the
// disk's drift hits both sides alike.
//
// It is a separate module (agentkit/bench/adk) so that the agentkit module
// never depends on ADK. It measures, with ADK's SQLite file in WAL mode
// with synchronous=FULL (agentkit's durability), in its default
// rollback-journal mode, and on PostgreSQL:
//
//   - BenchmarkAppend: appending one event to a session durably;
//   - BenchmarkTurn: one full turn with an echo model, through ADK's
//     runner and through agentkit's Runtime.Continue;
//   - BenchmarkLoadLast20: loading the last 20 events of a session holding
//     1,000 and 100,000 events (SQLite).
//
// README.md says what each number includes and how to run them;
// TestSameEvents checks that both sides store and load what the
// benchmarks say they do.
package adkbench
