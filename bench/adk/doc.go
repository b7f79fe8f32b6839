// Package adkbench compares agentkit's session storage with the database
// session service of Google's Agent Development Kit for Go
// (google.golang.org/adk/v2/session/database, v2.2.0), side by side in one
// test binary so the ratios come from the same run on the same machine.
//
// It is a separate module (agentkit/bench/adk) so that the agentkit module
// never depends on ADK. It measures, on a SQLite file on local disk and on
// PostgreSQL:
//
//   - BenchmarkAppend: appending one event to a session;
//   - BenchmarkTurn: persisting one turn of three events, with agentkit's
//     mirror to its store included;
//   - BenchmarkLoadLast20: loading the last 20 events of a session holding
//     1,000 and 100,000 events.
//
// README.md says what each number includes and how to run them; the test
// file's smoke test checks that both sides store and load the same events.
package adkbench
