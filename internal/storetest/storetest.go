// Package storetest opens the real stores that table tests (package evals,
// package abtest) run on: a fresh SQLite file, and a fresh table on the test
// PostgreSQL, dropped when the test ends. PostgreSQL is found through
// AGENTKIT_TEST_POSTGRES (default postgres://root@127.0.0.1:5432/test); when
// it is unreachable the test skips with a how-to, or fails under CI
// (package testenv).
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/internal/testenv"
	"agentkit/kv"
	_ "agentkit/kv/pgkv"     // postgres:// URLs
	_ "agentkit/kv/sqlitekv" // sqlite: URLs
)

// DefaultPostgres is the test PostgreSQL used when AGENTKIT_TEST_POSTGRES
// is unset.
const DefaultPostgres = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

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
	base := testenv.Getenv("AGENTKIT_TEST_POSTGRES", DefaultPostgres)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err == nil {
		err = conn.Ping(ctx)
	}
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", "Start one and set AGENTKIT_TEST_POSTGRES to its URL (default "+DefaultPostgres+").", err)
		return ""
	}
	b := make([]byte, 6)
	rand.Read(b)
	table := "agentkit_tables_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		conn.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("AGENTKIT_TEST_POSTGRES %q: %v", base, err)
	}
	q := u.Query()
	q.Set("table", table)
	u.RawQuery = q.Encode()
	return u.String()
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
