package natskv_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/kvtest"
	"agentkit/kv/natskv"
)

const howto = "Start a NATS server with JetStream (nats-server -js) and set AGENTKIT_TEST_NATS=nats://host:4222 (default nats://127.0.0.1:4222)."

// serverURL returns the test server's URL, skipping (failing in CI) when
// it does not answer.
func serverURL(t testing.TB) string {
	t.Helper()
	raw := testenv.Getenv("AGENTKIT_TEST_NATS", "nats://127.0.0.1:4222")
	nc, err := nats.Connect(raw, nats.Timeout(2*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS at "+raw, howto, err)
	}
	nc.Close()
	return raw
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// withBucket returns url with ?bucket=bucket added.
func withBucket(t testing.TB, raw, bucket string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("bucket", bucket)
	u.RawQuery = q.Encode()
	return u.String()
}

// deleteBucket removes a test bucket.
func deleteBucket(t testing.TB, raw, bucket string) {
	nc, err := nats.Connect(raw)
	if err != nil {
		t.Logf("clean-up: connect: %v", err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Logf("clean-up: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteKeyValue(ctx, bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("clean-up: delete bucket %s: %v", bucket, err)
	}
}

// namespace makes a fresh bucket on the test server, deleted when the test
// ends, and returns an opener that connects a new client to it on every
// call.
func namespace(t testing.TB) kvtest.Opener {
	return namespaceOn(t, serverURL(t))
}

func namespaceOn(t testing.TB, raw string) kvtest.Opener {
	bucket := randomName("kvtest_")
	t.Cleanup(func() { deleteBucket(t, raw, bucket) })
	u := withBucket(t, raw, bucket)
	return func(t testing.TB) *kv.DB {
		t.Helper()
		db, err := kv.Open(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
}

// harness is the suite's harness for the test server.
func harness(t testing.TB) kvtest.Harness { return harnessOn(t, serverURL(t)) }

// harnessOn is the harness for the server at raw, with the value limit a
// client of it reports.
func harnessOn(t testing.TB, raw string) kvtest.Harness {
	db := namespaceOn(t, raw)(t)
	defer db.Close()
	return kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener { return namespaceOn(t, raw) },
		Shared:       true,
		MaxValueSize: db.Backend().(*natskv.Store).MaxValueSize(),
	}
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, harness(t))
}

// The suite again on the current server release (in process), whose
// JetStream differs from the packaged 2.9 in places the driver touches
// (delete markers, error codes, direct gets).
func TestConformanceCurrentServer(t *testing.T) {
	kvtest.Run(t, harnessOn(t, runServer(t, "", "")))
}

func TestServerVersion(t *testing.T) {
	nc, err := nats.Connect(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	t.Logf("NATS server %s, max_payload %d", nc.ConnectedServerVersion(), nc.MaxPayload())
}

// A deleted key's tombstone must not block PutIfAbsent, and no version
// from before the delete may match afterwards.
func TestDeleteThenCreate(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx := context.Background()
	v1, err := db.PutIfAbsent(ctx, "k", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Get(ctx, "k"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if _, err := db.PutIfVersion(ctx, "k", []byte("x"), v1); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("PutIfVersion on a deleted key with its old version: %v, want ErrConflict", err)
	}
	v2, err := db.PutIfAbsent(ctx, "k", []byte("two"))
	if err != nil {
		t.Fatalf("PutIfAbsent after Delete: %v", err)
	}
	if v2 == v1 {
		t.Fatalf("version %s reused after delete and re-create", v1)
	}
	if _, err := db.PutIfVersion(ctx, "k", []byte("x"), v1); !errors.Is(err, kv.ErrConflict) {
		t.Fatalf("PutIfVersion with the pre-delete version: %v, want ErrConflict", err)
	}
}

// Revision 0 means "create" to JetStream; a token "0" (or any spelling of a
// revision other than the canonical one) must never reach the server as a
// condition.
func TestVersionTokensTheDriverNeverIssued(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx := context.Background()
	for _, tok := range []kv.Version{"0", "00", "-1", "garbage", "1 ", "18446744073709551616"} {
		if _, err := db.PutIfVersion(ctx, "missing", []byte("x"), tok); !errors.Is(err, kv.ErrConflict) {
			t.Errorf("PutIfVersion(missing, %q) = %v, want ErrConflict", tok, err)
		}
	}
	if _, err := db.Get(ctx, "missing"); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("a PutIfVersion with a bad token created the key: Get = %v", err)
	}
	v, err := db.PutIfAbsent(ctx, "k", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.PutIfVersion(ctx, "k", []byte("y"), "0"+v); !errors.Is(err, kv.ErrConflict) {
		t.Errorf("PutIfVersion with version %q (a zero-padded %q) = %v, want ErrConflict", "0"+v, v, err)
	}
}

func TestValueSizeLimit(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx := context.Background()
	limit := db.Backend().(*natskv.Store).MaxValueSize()
	if limit < 1<<20-2048 {
		t.Fatalf("MaxValueSize = %d, want about 1 MiB on a default server", limit)
	}
	big := bytes.Repeat([]byte{0xA5}, limit)
	v, err := db.PutIfAbsent(ctx, "big", big)
	if err != nil {
		t.Fatalf("PutIfAbsent of %d bytes (the limit): %v", limit, err)
	}
	if _, err := db.PutIfVersion(ctx, "big", big, v); err != nil {
		t.Fatalf("PutIfVersion of %d bytes (the limit): %v", limit, err)
	}
	got, err := db.Get(ctx, "big")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("Get of the %d-byte value: %d bytes, %v", limit, len(got), err)
	}
	over := append(big, 1)
	if err := db.Put(ctx, "over", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("Put of %d bytes: %v, want ErrTooLarge", len(over), err)
	}
	if _, err := db.PutIfAbsent(ctx, "over", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("PutIfAbsent of %d bytes: %v, want ErrTooLarge", len(over), err)
	}
	if _, err := db.Get(ctx, "over"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("an oversized value was stored: Get = %v", err)
	}
}

// Keys written to the bucket by other programs, outside the driver's
// encoding, are not listed; keys in it are, ordered by the original bytes
// although the encoded order differs.
func TestListSkipsForeignKeysAndSorts(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx := context.Background()
	bucket := db.Backend().(*natskv.Store).KeyValue()
	for _, k := range []string{"plain=zz", "x=2F", "a.=41"} {
		if _, err := bucket.Put(ctx, k, []byte("foreign")); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"a/b", "a/b.c", "a/b/c", "a/b=", "a/b~", "a/bc", "a-b", "a.b", "a=b"}
	for _, k := range want {
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Put(ctx, "gone", nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	for _, prefix := range []string{"", "a", "a/", "a/b", "a/b/", "zzz/"} {
		var got []string
		for e, err := range db.List(ctx, prefix) {
			if err != nil {
				t.Fatalf("List(%q): %v", prefix, err)
			}
			if string(e.Value) != e.Key {
				t.Errorf("List(%q): %q has value %q", prefix, e.Key, e.Value)
			}
			got = append(got, e.Key)
		}
		var exp []string
		for _, k := range want {
			if strings.HasPrefix(k, prefix) {
				exp = append(exp, k)
			}
		}
		if !slices.Equal(got, exp) {
			t.Errorf("List(%q) = %q, want %q", prefix, got, exp)
		}
		var keys []string
		for k, err := range db.ListKeys(ctx, prefix) {
			if err != nil {
				t.Fatalf("ListKeys(%q): %v", prefix, err)
			}
			keys = append(keys, k)
		}
		if !slices.Equal(keys, exp) {
			t.Errorf("ListKeys(%q) = %q, want %q", prefix, keys, exp)
		}
	}
}

func TestOpenURLForms(t *testing.T) {
	raw := serverURL(t)
	ctx := context.Background()
	u, _ := url.Parse(raw)

	t.Run("default bucket", func(t *testing.T) {
		db, err := kv.Open(ctx, "nats://"+u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if got := db.Backend().(*natskv.Store).Bucket(); got != natskv.DefaultBucket {
			t.Errorf("bucket = %q, want %q", got, natskv.DefaultBucket)
		}
	})
	t.Run("bucket and options", func(t *testing.T) {
		bucket := randomName("kvtest_")
		t.Cleanup(func() { deleteBucket(t, raw, bucket) })
		db, err := kv.Open(ctx, "nats://"+u.Host+"/?bucket="+bucket+"&storage=memory&replicas=1&name=test")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		nc, _ := nats.Connect(raw)
		defer nc.Close()
		js, _ := jetstream.New(nc)
		st, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatalf("the bucket was not created: %v", err)
		}
		status, err := st.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if status.History() != 1 || status.BackingStore() != "JetStream" {
			t.Errorf("bucket history %d, backing %q; want 1, JetStream", status.History(), status.BackingStore())
		}
		info, _ := js.Stream(ctx, "KV_"+bucket)
		if info.CachedInfo().Config.Storage != jetstream.MemoryStorage {
			t.Errorf("storage = %v, want memory", info.CachedInfo().Config.Storage)
		}
	})
	for _, c := range []struct{ url, want string }{
		{"nats://" + u.Host + "?bucket=a.b", "bucket name"},
		{"nats://" + u.Host + "?buckt=x", `unknown URL parameter "buckt"`},
		{"nats://" + u.Host + "?storage=disk", "storage"},
		{"nats://" + u.Host + "?replicas=0", "replicas"},
		{"nats://" + u.Host + "/x", "path"},
		{"nats://?bucket=x", "no server"},
		{"nats://" + u.Host + "?creds=/nonexistent/file.creds", "connect"},
	} {
		db, err := kv.Open(ctx, c.url)
		if err == nil {
			db.Close()
			t.Errorf("Open(%q) succeeded, want an error about %s", c.url, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q) = %v, want it to mention %q", c.url, err, c.want)
		}
	}
}

// Credentials never show in errors, from a server that refuses them or one
// that is not there.
func TestCredentialsNotInErrors(t *testing.T) {
	ctx := context.Background()
	srv := runServer(t, "agent", "pa55-word-xyzzy")
	host := strings.TrimPrefix(srv, "nats://")

	db, err := kv.Open(ctx, "nats://agent:pa55-word-xyzzy@"+host+"?bucket=authed")
	if err != nil {
		t.Fatalf("Open with the right password: %v", err)
	}
	if err := db.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	db.Close()

	for _, c := range []struct{ url, secret string }{
		{"nats://agent:wrong-secret-42@" + host, "wrong-secret-42"},
		{"nats://sekrit-token-77@" + host, "sekrit-token-77"},
		{"nats://agent:unreachable-pw-9@127.0.0.1:1", "unreachable-pw-9"},
	} {
		db, err := kv.Open(ctx, c.url)
		if err == nil {
			db.Close()
			t.Errorf("Open with bad credentials succeeded")
			continue
		}
		// kv.Open prefixes the URL as (*url.URL).Redacted shows it, which
		// hides passwords but not a bare token in the user field; the
		// driver's own message must show neither.
		msg := err.Error()
		if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(c.url, "nats://"+c.secret) {
			msg = inner.Error()
		}
		if strings.Contains(msg, c.secret) {
			t.Errorf("the error shows the secret: %v", msg)
		}
		t.Logf("error: %v", err)
	}
}

// Open over a connection the program owns: Close leaves it open.
func TestOpenWithConnection(t *testing.T) {
	raw := serverURL(t)
	nc, err := nats.Connect(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bucket := randomName("kvtest_")
	t.Cleanup(func() { deleteBucket(t, raw, bucket) })
	ctx := context.Background()
	db, err := natskv.Open(ctx, nc, &natskv.Options{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if nc.IsClosed() {
		t.Fatal("closing the store closed the caller's connection")
	}
	other, err := kv.Open(ctx, withBucket(t, raw, bucket))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if v, err := other.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("a URL-opened client reads %q, %v", v, err)
	}
}

// TestListingCompletesWhenTheConsumerStalls: a listing whose consumer
// falls silent before it reported nothing pending (a stalled subscription;
// under load a listing once waited for minutes) ends after the idle wait,
// complete and in order, from the stream's own list of subjects.
func TestListingCompletesWhenTheConsumerStalls(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var want []string
	for i := range 40 {
		k := fmt.Sprintf("stall/%03d", i)
		want = append(want, k)
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	natskv.StallListings(db.Backend().(*natskv.Store), 10, 50*time.Millisecond)
	var got []string
	for e, err := range db.List(ctx, "stall/") {
		if err != nil {
			t.Fatalf("List with a stalled consumer: %v", err)
		}
		if string(e.Value) != e.Key {
			t.Errorf("%q has value %q", e.Key, e.Value)
		}
		got = append(got, e.Key)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List with a stalled consumer = %q, want %q", got, want)
	}
	var keys []string
	for k, err := range db.ListKeys(ctx, "stall/") {
		if err != nil {
			t.Fatalf("ListKeys with a stalled consumer: %v", err)
		}
		keys = append(keys, k)
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("ListKeys with a stalled consumer = %q, want %q", keys, want)
	}
}
