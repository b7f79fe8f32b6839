// Package pgtest gives tests a PostgreSQL table of their own: the test
// server's URL (from AGENTKIT_TEST_POSTGRES, with a local default), skipped
// with a how-to on a laptop and failed in CI when the server does not
// answer, and a fresh table name that is dropped when the test ends.
//
//	db, err := kv.Open(ctx, pgtest.TableURL(t)) // a store in a table of its own
//
// Every table name is random, so tests of several packages and of other
// people's worktrees share one server without meeting.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/internal/testenv"
)

// DefaultURL is the server tests use when AGENTKIT_TEST_POSTGRES is unset:
// the local one, trust authentication, database test.
const DefaultURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// Howto says how to provide the server; skip messages end with it.
const Howto = "Start PostgreSQL and set AGENTKIT_TEST_POSTGRES to its URL (default " + DefaultURL + ")."

var (
	probeMu  sync.Mutex
	probed   = map[string]error{}
	probeFor = 5 * time.Second
)

// URL returns the test server's connection URL. When the server does not
// answer it skips the test with a how-to, or fails it when CI is set.
func URL(t testing.TB) string {
	t.Helper()
	raw := testenv.Getenv("AGENTKIT_TEST_POSTGRES", DefaultURL)
	probeMu.Lock()
	err, done := probed[raw]
	if !done {
		err = ping(raw)
		probed[raw] = err
	}
	probeMu.Unlock()
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", Howto, err)
	}
	return raw
}

func ping(raw string) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeFor)
	defer cancel()
	conn, err := pgx.Connect(ctx, raw)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// Table returns a fresh table name, prefix followed by 12 random hex
// digits (prefix "" means "test_"), and drops the table when the test and
// its subtests end, whoever created it. prefix must be lower-case letters,
// digits and underscores.
func Table(t testing.TB, prefix string) string {
	t.Helper()
	raw := URL(t)
	if prefix == "" {
		prefix = "test_"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := prefix + hex.EncodeToString(b)
	t.Cleanup(func() { Drop(t, raw, table) })
	return table
}

// Drop drops table on the server at raw, reporting a failure to the test.
func Drop(t testing.TB, raw, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, raw)
	if err != nil {
		t.Errorf("pgtest: drop table %s: %v", table, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()); err != nil {
		t.Errorf("pgtest: drop table %s: %v", table, err)
	}
}

// TableURL returns the server's URL with table=NAME set to a fresh table
// (see Table): a store URL for kv.Open with the PostgreSQL driver.
func TableURL(t testing.TB) string {
	t.Helper()
	raw := URL(t)
	table := Table(t, "")
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		t.Fatalf("pgtest: AGENTKIT_TEST_POSTGRES must be a postgres:// URL to add a table to (it does not parse as one)")
	}
	q := u.Query()
	q.Set("table", table)
	u.RawQuery = q.Encode()
	return u.String()
}
