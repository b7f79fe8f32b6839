// Package storetest opens the real stores that table tests (package evals,
// package abtest) run on: a fresh SQLite file, and a fresh table on the test
// PostgreSQL, dropped when the test ends. PostgreSQL is found through
// AGENTKIT_TEST_POSTGRES (default postgres://root@127.0.0.1:5432/test); when
// it is unreachable the test skips with a how-to, or fails under CI
// (package testenv).
package storetest

import (
	"context"
	"path/filepath"
	"testing"

	"agentkit/internal/testenv/pgtest"
	"agentkit/kv"
	_ "agentkit/kv/pgkv"     // postgres:// URLs
	_ "agentkit/kv/sqlitekv" // sqlite: URLs
)

// Store is one store a table test runs on.
type Store struct {
	// Name labels the subtest: "sqlite" or "postgres".
	Name string
	// URL opens the store with kv.Open; every Open of the same URL reaches
	// the same data, as two hosts would.
	URL string
}

// Stores returns a fresh SQLite store and a fresh PostgreSQL table.
func Stores(t *testing.T) []Store {
	t.Helper()
	return []Store{{"sqlite", SQLite(t)}, {"postgres", Postgres(t)}}
}

// SQLite returns the URL of a new SQLite file in the test's folder.
func SQLite(t *testing.T) string {
	t.Helper()
	return "sqlite:" + filepath.Join(t.TempDir(), "kv.db")
}

// Postgres returns the URL of a new, uniquely named table on the test
// PostgreSQL, dropped when the test ends.
func Postgres(t *testing.T) string {
	t.Helper()
	return pgtest.TableURL(t)
}

// Open opens storeURL and closes the store when the test ends.
func Open(t *testing.T, storeURL string) *kv.DB {
	t.Helper()
	db, err := kv.Open(context.Background(), storeURL)
	if err != nil {
		t.Fatalf("opening the test store: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
