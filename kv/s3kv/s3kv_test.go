package s3kv_test

import (
	"bytes"
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
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/kvtest"
	"agentkit/kv/s3kv"
)

// servers are the S3 implementations the driver is tested against, each
// found through its variable.
var servers = []struct{ name, env, howto string }{
	{"versitygw", "AGENTKIT_TEST_S3", `Start versitygw with: eval "$(scripts/versitygw.sh start)" (it sets AGENTKIT_TEST_S3=s3://KEY:SECRET@BUCKET/?endpoint=http://127.0.0.1:PORT&region=us-east-1); stop it with scripts/versitygw.sh stop.`},
	{"minio", "AGENTKIT_TEST_S3_MINIO", `Start MinIO with: eval "$(scripts/minio.sh start)" (it builds MinIO into the tool cache the first time and sets AGENTKIT_TEST_S3_MINIO); stop it with scripts/minio.sh stop.`},
}

// baseURL returns AGENTKIT_TEST_S3 (versitygw), skipping (failing in CI)
// when it is unset or the server does not answer.
func baseURL(t testing.TB) *url.URL { return serverURL(t, 0) }

// serverURL returns the URL of servers[i], skipping (failing in CI) when
// its variable is unset or the server does not answer.
func serverURL(t testing.TB, i int) *url.URL {
	t.Helper()
	srv := servers[i]
	raw := testenv.Getenv(srv.env, "")
	if raw == "" {
		testenv.Unavailable(t, "an S3 server ("+srv.name+")", srv.howto, errors.New(srv.env+" is not set"))
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s does not parse as a URL", srv.env)
	}
	db, err := kv.Open(t.Context(), raw)
	if err != nil {
		testenv.Unavailable(t, "the S3 server of "+srv.env+" ("+u.Redacted()+")", srv.howto, err)
	}
	db.Close()
	return u
}

// eachServer runs fn as a subtest per server.
func eachServer(t *testing.T, fn func(t *testing.T, base *url.URL)) {
	for i, srv := range servers {
		t.Run(srv.name, func(t *testing.T) { fn(t, serverURL(t, i)) })
	}
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// withPrefix returns the URL with the folder dir appended to its prefix.
func withPrefix(u *url.URL, dir string) string {
	c := *u
	c.Path = strings.TrimSuffix(u.Path, "/") + "/" + dir + "/"
	return c.String()
}

// removeAll deletes every object under the store's prefix.
func removeAll(t testing.TB, raw string) {
	db, err := kv.Open(context.Background(), raw)
	if err != nil {
		t.Logf("clean-up: %v", err)
		return
	}
	defer db.Close()
	st := db.Backend().(*s3kv.Store)
	ctx := context.Background()
	pages := s3.NewListObjectsV2Paginator(st.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(st.Bucket()), Prefix: aws.String(st.Prefix())})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Errorf("clean-up: list: %v", err)
			return
		}
		if len(page.Contents) == 0 {
			continue
		}
		ids := make([]types.ObjectIdentifier, len(page.Contents))
		for i, o := range page.Contents {
			ids[i] = types.ObjectIdentifier{Key: o.Key}
		}
		if _, err := st.Client().DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(st.Bucket()), Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)}}); err != nil {
			t.Errorf("clean-up: delete: %v", err)
			return
		}
	}
}

// namespace makes a fresh prefix on versitygw, emptied when the test ends,
// and returns an opener that makes a new client (its own connections) on
// every call.
func namespace(t testing.TB) kvtest.Opener { return namespaceOn(t, baseURL(t)) }

// namespaceOn is namespace on the server at base.
func namespaceOn(t testing.TB, base *url.URL) kvtest.Opener {
	raw := withPrefix(base, randomName("kvtest-"))
	t.Cleanup(func() { removeAll(t, raw) })
	return func(t testing.TB) *kv.DB {
		t.Helper()
		db, err := kv.Open(context.Background(), raw)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
}

// harness runs the whole suite on the server at base, its 10,000-key
// listing check included (about a minute against versitygw on this 2-core
// machine: every key is a file).
func harness(base *url.URL) kvtest.Harness {
	return kvtest.Harness{NewNamespace: func(t testing.TB) kvtest.Opener { return namespaceOn(t, base) }, Shared: true}
}

// The suite against every server: versitygw (posix backend) and MinIO.
// MinIO lists 1,200 keys rather than 10,000: versitygw's run covers the
// large listing, MinIO's is there for its own naming and listing rules,
// and 1,200 keys still span two ListObjectsV2 pages; it keeps .ci/run
// about a minute shorter.
func TestConformance(t *testing.T) {
	eachServer(t, func(t *testing.T, base *url.URL) {
		h := harness(base)
		if strings.HasSuffix(t.Name(), "/minio") {
			h.ManyKeys = 1200
		}
		kvtest.Run(t, h)
	})
}

// The keys servers rewrite or refuse when used as object names all round
// trip, side by side, and list exactly, on every server.
func TestKeysServersMangle(t *testing.T) {
	eachServer(t, checkKeysServersMangle)
}

func checkKeysServersMangle(t *testing.T, base *url.URL) {
	db := namespaceOn(t, base)(t)
	defer db.Close()
	ctx := context.Background()
	keys := []string{
		"x", "x/child", "x/child/grandchild", "a/../x", "a/./x", "a//b", "a/", "/a", "..", ".",
		".sgwtmp", "a/.sgwtmp/b", strings.Repeat("s", 300), strings.Repeat("s", 300) + "/t",
		strings.Repeat("%", 1024), "a b", "a+b", "a?b#c", "ab", "a/b", "a/bc",
		// names over 1,024 bytes, beside names that fit, all sharing a prefix
		strings.Repeat("%", 1023) + "&", strings.Repeat("%", 1000) + "/x", strings.Repeat("%", 500),
		strings.Repeat("é", 512), strings.Repeat("é", 511) + "e",
		// bytes XML or a path cannot carry as they are
		"\x01", "ctl\x1f/x", "\uffff", "\ufffe", "back\\slash", "!", "x!#", "a!_",
	}
	for _, k := range keys {
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatalf("Put(%q): %v", k, err)
		}
	}
	for _, k := range keys {
		if v, err := db.Get(ctx, k); err != nil || string(v) != k {
			t.Errorf("Get(%q) = %q, %v", k, v, err)
		}
	}
	slices.Sort(keys)
	for _, prefix := range []string{"", "a", "a/", "x/", "x/child", "s", "%", strings.Repeat("%", 900), strings.Repeat("%", 1000) + "/", "é", "\x01", "\uffff"} {
		var got, want []string
		for k, err := range db.ListKeys(ctx, prefix) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, k)
		}
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				want = append(want, k)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("ListKeys(%q) = %q, want %q", prefix, got, want)
		}
	}
	// Deleting "x" leaves the folder of "x/child" alone, and the reverse.
	if err := db.Delete(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if v, err := db.Get(ctx, "x/child"); err != nil || string(v) != "x/child" {
		t.Errorf("after Delete(x): Get(x/child) = %q, %v", v, err)
	}
	if err := db.Put(ctx, "x", []byte("again")); err != nil {
		t.Fatal(err)
	}
}

// Objects under the prefix that the driver did not write are not listed,
// and reading one under a driver's name fails clearly (not as a miss).
func TestForeignObjects(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx := context.Background()
	st := db.Backend().(*s3kv.Store)
	for _, name := range []string{"plain.txt", "dir/file", st.ObjectName("k")[len(st.Prefix()):]} {
		_, err := st.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(st.Bucket()), Key: aws.String(st.Prefix() + name), Body: strings.NewReader("written by another program")})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Put(ctx, "mine", []byte("v")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k, err := range db.ListKeys(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, k)
	}
	if want := []string{"k", "mine"}; !slices.Equal(got, want) {
		t.Errorf("ListKeys = %q, want %q", got, want)
	}
	_, err := db.Get(ctx, "k")
	if err == nil || errors.Is(err, kv.ErrNotFound) || !strings.Contains(err.Error(), "not written by this driver") {
		t.Errorf("Get of a foreign object = %v, want an error saying it was not written by the driver", err)
	}
}

// The stored body carries a nonce: identical values give distinct ETags,
// and a raw reader sees the header in front of the value.
func TestNonceInBody(t *testing.T) {
	db := namespace(t)(t)
	defer db.Close()
	ctx := context.Background()
	v1, err := db.PutIfAbsent(ctx, "k", []byte("same"))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := db.PutIfVersion(ctx, "k", []byte("same"), v1)
	if err != nil {
		t.Fatal(err)
	}
	if v1 == v2 {
		t.Fatalf("identical bytes kept the version %s", v1)
	}
	st := db.Backend().(*s3kv.Store)
	out, err := st.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(st.Bucket()), Key: aws.String(st.ObjectName("k"))})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(out.Body)
	if buf.Len() != 20+4 || !bytes.HasPrefix(buf.Bytes(), []byte("akv\x01")) || !bytes.HasSuffix(buf.Bytes(), []byte("same")) {
		t.Errorf("stored body = %q, want the 20-byte header then the value", buf.Bytes())
	}
	if got := kv.Version(strings.Trim(aws.ToString(out.ETag), `"`)); got != v2 {
		t.Errorf("the object's ETag is %s, the driver's version %s", got, v2)
	}
}

func TestOpenURLForms(t *testing.T) {
	base := baseURL(t)
	ctx := context.Background()
	user := base.User
	if user == nil {
		testenv.Unavailable(t, "an S3 URL with credentials", "put ACCESS:SECRET@ in AGENTKIT_TEST_S3 (scripts/versitygw.sh start prints one)", errors.New("AGENTKIT_TEST_S3 carries no credentials"))
	}
	access := user.Username()
	secret, _ := user.Password()

	t.Run("new bucket is created", func(t *testing.T) {
		u := *base
		u.Host = randomName("kvtest-bucket-")
		u.Path = "/p/q/"
		db, err := kv.Open(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		st := db.Backend().(*s3kv.Store)
		if st.Prefix() != "p/q/" {
			t.Errorf("prefix = %q, want p/q/", st.Prefix())
		}
		if err := db.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			removeAll(t, u.String())
			if _, err := st.Client().DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(u.Host)}); err != nil {
				t.Errorf("clean-up: delete bucket %s: %v", u.Host, err)
			}
		})
		if _, err := st.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(u.Host), Key: aws.String("p/q/k!")}); err != nil {
			t.Errorf("the object is not where the URL says: %v", err)
		}
	})
	t.Run("credentials from the environment", func(t *testing.T) {
		u := *base
		u.User = nil
		t.Setenv("AWS_ACCESS_KEY_ID", access)
		t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
		t.Setenv("AWS_REGION", "us-east-1")
		db, err := kv.Open(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Get(ctx, "missing"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("Get = %v, want ErrNotFound", err)
		}
	})
	t.Run("prefix without trailing slash", func(t *testing.T) {
		u := *base
		u.Path = "/" + randomName("kvtest-")
		db, err := kv.Open(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if p := db.Backend().(*s3kv.Store).Prefix(); p != u.Path[1:]+"/" {
			t.Errorf("prefix = %q, want %q", p, u.Path[1:]+"/")
		}
	})
	bad := func(mod func(*url.URL)) string {
		u := *base
		mod(&u)
		return u.String()
	}
	for _, c := range []struct{ url, want string }{
		{bad(func(u *url.URL) { u.Host = "" }), "no bucket"},
		{bad(func(u *url.URL) { u.RawQuery += "&endpont=x" }), `unknown URL parameter "endpont"`},
		{bad(func(u *url.URL) { u.RawQuery = "endpoint=ftp://x" }), "endpoint must be"},
		{bad(func(u *url.URL) { u.RawQuery += "&path_style=maybe" }), "path_style"},
		{bad(func(u *url.URL) { u.Path = "/a/../b/" }), "prefix"},
		{bad(func(u *url.URL) { u.User = url.User(access) }), "without a secret"},
	} {
		db, err := kv.Open(ctx, c.url)
		if err == nil {
			db.Close()
			t.Errorf("Open(%s) succeeded, want an error about %s", c.url, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open = %v, want it to mention %q", err, c.want)
		}
	}
}

// Secrets never show in errors: a refused secret, or a server that is not
// there.
func TestCredentialsNotInErrors(t *testing.T) {
	base := baseURL(t)
	ctx := context.Background()
	const secret = "wrong-secret-value-31337"
	for _, mod := range []func(*url.URL){
		func(u *url.URL) { u.User = url.UserPassword("agentkit-test-access", secret) },
		func(u *url.URL) {
			u.User = url.UserPassword("agentkit-test-access", secret)
			u.RawQuery = "endpoint=http://127.0.0.1:1&region=us-east-1"
		},
	} {
		u := *base
		mod(&u)
		db, err := kv.Open(ctx, u.String())
		if err == nil {
			db.Close()
			t.Errorf("Open with a wrong secret succeeded")
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows the secret: %v", err)
		}
		t.Logf("error: %v", err)
	}
}

// Open over a client the program owns: the store works through it, sees
// what a URL-opened store wrote, and Close leaves the client usable.
func TestOpenWithClient(t *testing.T) {
	open := namespace(t)
	db := open(t)
	defer db.Close()
	ctx := context.Background()
	st := db.Backend().(*s3kv.Store)
	if err := db.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	own, err := s3kv.Open(ctx, st.Client(), &s3kv.Options{Bucket: st.Bucket(), Prefix: st.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := own.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get through the caller's client = %q, %v", v, err)
	}
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Put(ctx, "k2", []byte("v")); err != nil {
		t.Fatalf("the client stopped working after the other store closed: %v", err)
	}
	if _, err := s3kv.Open(ctx, st.Client(), nil); err == nil || !strings.Contains(err.Error(), "no bucket") {
		t.Errorf("Open with nil options = %v, want an error naming the missing bucket", err)
	}
}
