// Package natstest gives tests a NATS JetStream key-value bucket of their
// own: the test server's URL (from AGENTKIT_TEST_NATS, with a local
// default) naming a fresh bucket, skipped with a how-to on a laptop and
// failed in CI when the server does not answer, and the bucket deleted
// when the test ends.
//
//	db, err := kv.Open(ctx, natstest.URL(t, "evals_")) // a bucket of its own
//
// Every bucket name is random, so tests of several packages and of other
// people's worktrees share one server without meeting.
package natstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentkit/internal/testenv"
)

// DefaultURL is the server tests use when AGENTKIT_TEST_NATS is unset.
const DefaultURL = "nats://127.0.0.1:4222"

// Howto says how to provide the server; skip messages end with it.
const Howto = "Start nats-server -js and set AGENTKIT_TEST_NATS to its URL (default " + DefaultURL + ")."

// URL returns the test server's URL naming a fresh bucket (prefix followed
// by 10 random hex digits; prefix "" means "test_"), for a natskv store
// that creates it. When the server does not answer it skips the test with
// a how-to, or fails it when CI is set. The bucket is deleted when the
// test and its subtests end.
func URL(t testing.TB, prefix string) string {
	t.Helper()
	if prefix == "" {
		prefix = "test_"
	}
	raw := testenv.Getenv("AGENTKIT_TEST_NATS", DefaultURL)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("AGENTKIT_TEST_NATS does not parse: %v", err)
	}
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	bucket := prefix + hex.EncodeToString(b)
	nc, err := nats.Connect(raw, nats.Timeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS JetStream at "+raw, Howto, err)
		return ""
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		testenv.Unavailable(t, "NATS JetStream at "+raw, Howto, err)
		return ""
	}
	t.Cleanup(func() {
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteKeyValue(ctx, bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Errorf("natstest: deleting bucket %s: %v", bucket, err)
		}
	})
	q := u.Query()
	q.Set("bucket", bucket)
	u.RawQuery = q.Encode()
	return u.String()
}
