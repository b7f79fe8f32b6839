// Package sqlite stands in for github.com/glebarez/go-sqlite in the ADK
// benchmark module (bench/adk's go.mod replaces that module with this
// folder).
//
// ADK's SQLite dialector, github.com/glebarez/sqlite, imports
// glebarez/go-sqlite, a fork of modernc.org/sqlite that registers the same
// database/sql driver name ("sqlite"). agentkit's session database links
// modernc.org/sqlite itself, and one binary cannot register the name
// twice, so the benchmark gives the dialector upstream modernc.org/sqlite
// instead: the same engine agentkit runs on, at the same version. The
// dialector uses one thing from the fork, its error type (to translate
// constraint violations), which is the same type upstream.
//
// The fork also runs "PRAGMA busy_timeout(5000)" on every new connection;
// the benchmark's ADK DSN asks for the same with _pragma=busy_timeout(5000).
package sqlite

import msqlite "modernc.org/sqlite"

// Error is the engine's error, with the Code method the dialector reads.
type Error = msqlite.Error
