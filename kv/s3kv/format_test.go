package s3kv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"agentkit/internal/testenv"
	"agentkit/kv"
)

// freshPrefix returns AGENTKIT_TEST_S3 (versitygw) with a new random
// prefix, skipping (failing in CI) without it. The objects are removed when
// the test ends.
func freshPrefix(t *testing.T) string {
	t.Helper()
	raw := testenv.Getenv("AGENTKIT_TEST_S3", "")
	if raw == "" {
		testenv.Unavailable(t, "an S3 server", `eval "$(scripts/versitygw.sh start)" sets AGENTKIT_TEST_S3`, errors.New("AGENTKIT_TEST_S3 is not set"))
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal("AGENTKIT_TEST_S3 does not parse")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	u.Path = "/kvtest-format-" + hex.EncodeToString(b) + "/"
	t.Cleanup(func() {
		db, err := kv.Open(context.Background(), u.String())
		if err != nil {
			return
		}
		defer db.Close()
		s := db.Backend().(*Store)
		_ = s.eachObject(context.Background(), func(name string, _ int64) bool {
			_, _ = s.client.DeleteObject(context.Background(), &s3.DeleteObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + name)})
			return true
		})
	})
	return u.String()
}

func keysOf(t *testing.T, db *kv.DB) []string {
	t.Helper()
	var got []string
	for k, err := range db.ListKeys(t.Context(), "") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, k)
	}
	return got
}

// A prefix an earlier release wrote (key format 1 names, no marker) opens
// as format 1 and reads as before; MigrateKeyFormat moves it to format 2,
// keeping values and (for server-side copies) versions; every later open
// is format 2.
func TestFormat1StoresReadAndMigrate(t *testing.T) {
	raw := freshPrefix(t)
	ctx := t.Context()
	keys := []string{"agentkit/v1/bot/sessions/s%201/meta", "a.b", "x", "x/y", "é", strings.Repeat("%", 1024)}
	// Write as a release before format 2 did: format 1 names, no marker.
	{
		db, err := kv.Open(ctx, raw)
		if err != nil {
			t.Fatal(err)
		}
		s := db.Backend().(*Store)
		if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + formatName)}); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			b, err := body(k, false, []byte("v:"+k))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.write(ctx, s.prefix+codecV1.encode(k), b, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
		tomb, _ := tombstone()
		if _, err := s.write(ctx, s.prefix+codecV1.encode("gone"), tomb, nil, nil); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	db, err := kv.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := db.Backend().(*Store)
	if s.KeyFormat() != 1 {
		t.Fatalf("a prefix of format 1 objects opened as format %d", s.KeyFormat())
	}
	want := slices.Sorted(slices.Values(keys))
	if got := keysOf(t, db); !slices.Equal(got, want) {
		t.Fatalf("format 1 store lists %q, want %q", got, want)
	}
	_, verBefore, err := db.GetWithVersion(ctx, "a.b")
	if err != nil {
		t.Fatal(err)
	}
	moved, err := s.MigrateKeyFormat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if moved != 4 { // "x" and "x/y" have the same name in both formats
		t.Errorf("MigrateKeyFormat moved %d keys, want 4", moved)
	}
	again, err := kv.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if f := again.Backend().(*Store).KeyFormat(); f != 2 {
		t.Fatalf("after migration the store opens as format %d", f)
	}
	if got := keysOf(t, again); !slices.Equal(got, want) {
		t.Errorf("after migration the store lists %q, want %q", got, want)
	}
	for _, k := range keys {
		if v, err := again.Get(ctx, k); err != nil || string(v) != "v:"+k {
			t.Errorf("after migration Get(%.20q) = %.20q, %v", k, v, err)
		}
	}
	if _, ver, err := again.GetWithVersion(ctx, "a.b"); err != nil || ver != verBefore {
		t.Errorf("migration changed the version of a.b from %s to %s (%v)", verBefore, ver, err)
	}
	var leftovers []string
	_ = s.eachObject(ctx, func(name string, _ int64) bool {
		if _, ok := codecV1.decode(name); ok && codecV1.encode(mustDecode(t, name)) != codecV2.encode(mustDecode(t, name)) {
			leftovers = append(leftovers, name)
		}
		return true
	})
	if len(leftovers) > 0 {
		t.Errorf("format 1 objects left after migration: %q", leftovers)
	}
	if n, err := again.Backend().(*Store).MigrateKeyFormat(ctx); n != 0 || err != nil {
		t.Errorf("MigrateKeyFormat of a format 2 store = %d, %v; want nothing to do", n, err)
	}
}

func mustDecode(t *testing.T, name string) string {
	k, _ := codecV1.decode(name)
	return k
}

// A fresh prefix becomes format 2 and says so in its marker; a read-only
// open writes nothing, and never creates a bucket.
func TestFormatMarkerAndReadOnly(t *testing.T) {
	raw := freshPrefix(t)
	ctx := t.Context()
	ro, err := kv.OpenWith(ctx, raw, kv.OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	s := ro.Backend().(*Store)
	if s.KeyFormat() != 2 {
		t.Errorf("a fresh prefix opened read-only as format %d", s.KeyFormat())
	}
	if f, err := s.readFormat(ctx); f != 0 || err != nil {
		t.Errorf("a read-only open wrote the marker (format %d, %v)", f, err)
	}
	if got := keysOf(t, ro); len(got) != 0 {
		t.Errorf("a fresh prefix lists %q", got)
	}
	ro.Close()
	db, err := kv.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if f, err := db.Backend().(*Store).readFormat(ctx); f != 2 || err != nil {
		t.Errorf("after a read-write open the marker says %d (%v), want 2", f, err)
	}
	u, _ := url.Parse(raw)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	u.Host = "kvtest-missing-" + hex.EncodeToString(b)
	if _, err := kv.OpenWith(ctx, u.String(), kv.OpenOptions{ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("read-only open of a missing bucket = %v, want an error saying it does not exist", err)
	}
	if _, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(u.Host)}); err == nil {
		t.Errorf("a read-only open created the bucket %s", u.Host)
		_, _ = s.client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(u.Host)})
	}
}
