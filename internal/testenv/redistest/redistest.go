// Package redistest gives tests a Redis key prefix of their own: the test
// server's URL (from AGENTKIT_TEST_REDIS, with a local default) with a
// fresh prefix, skipped with a how-to on a laptop and failed in CI when the
// server does not answer, and every key under the prefix removed when the
// test ends.
//
//	db, err := kv.Open(ctx, redistest.URL(t, "ledger-")) // a store under a prefix of its own
//
// Every prefix is random, so tests of several packages and of other
// people's worktrees share one server without meeting.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"
	"time"

	"agentkit/internal/testenv"
	"agentkit/kv"
	_ "agentkit/kv/rediskv" // redis:// URLs
)

// DefaultURL is the server tests use when AGENTKIT_TEST_REDIS is unset.
const DefaultURL = "redis://127.0.0.1:6379/0"

// Howto says how to provide the server; skip messages end with it.
const Howto = "Start Redis and set AGENTKIT_TEST_REDIS to its URL (default " + DefaultURL + ")."

// URL returns the test server's URL with a fresh key prefix (prefix
// followed by 10 random hex digits and a colon; prefix "" means "test-").
// When the server does not answer it skips the test with a how-to, or
// fails it when CI is set. The keys under the prefix are removed when the
// test and its subtests end.
func URL(t testing.TB, prefix string) string {
	t.Helper()
	if prefix == "" {
		prefix = "test-"
	}
	u, err := url.Parse(testenv.Getenv("AGENTKIT_TEST_REDIS", DefaultURL))
	if err != nil {
		t.Fatalf("AGENTKIT_TEST_REDIS does not parse: %v", err)
	}
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	q := u.Query()
	q.Set("prefix", prefix+hex.EncodeToString(b)+":")
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	db, err := kv.Open(ctx, u.String())
	if err == nil {
		if _, err = db.Get(ctx, "probe"); errors.Is(err, kv.ErrNotFound) {
			err = nil
		}
	}
	if err != nil {
		testenv.Unavailable(t, "Redis", Howto, err)
	}
	t.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var keys []string
		for k, err := range db.ListKeys(ctx, "") {
			if err != nil {
				t.Errorf("redistest: clean up %s: %v", u.Redacted(), err)
				return
			}
			keys = append(keys, k)
		}
		for _, k := range keys {
			if err := db.Delete(ctx, k); err != nil {
				t.Errorf("redistest: clean up %s: %v", u.Redacted(), err)
				return
			}
		}
	})
	return u.String()
}
