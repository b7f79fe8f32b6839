// Package turnbench measures agentkit's turn path against its floors, in
// benchmarks that alternate the thing measured and its reference inside one
// loop (package agentkit/bench/pair), so a ratio comes from one run:
//
//   - BenchmarkFloor: the runtime's single event append beside the disk's
//     floors: the same record written in place and fsynced (and
//     fdatasynced), appended and fdatasynced, and inserted into SQLite
//     with agentkit's durability (WAL, synchronous=FULL).
//   - BenchmarkSessionLength: a full turn (echo model) in a session of
//     1,002 events beside one in a session of 100,002 events.
//   - BenchmarkRestore: a runtime's start-up restore of 1,000 sessions
//     beside raw reads of exactly the keys it needs (the session-index
//     entries, then each session's metadata and event batches, one range
//     read per session), on the embedded SQLite store and on PostgreSQL.
//   - BenchmarkTurn: agentkit's turn alone, for CPU profiles and for
//     counting its fsyncs and store writes;
//   - BenchmarkConcurrentTurns: 16 turns at once on one runtime, in
//     process, with their p50, p99 and p99/p50, and a block profile of
//     where they wait.
//
// The package holds only tests and benchmarks. Its tests run every
// benchmark's body on small fixtures and check what it measures (the turn
// sees the session's history, restore loads every session, the raw reads
// return the keys restore needs); scripts/bench.sh turn runs the
// benchmarks and docs/benchmarks.md records their figures.
package turnbench
