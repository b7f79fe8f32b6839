package rediskv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"agentkit/internal/testenv"
	"agentkit/kv"
)

const defaultServer = "redis://127.0.0.1:6379/0"

var (
	serverOnce sync.Once
	serverErr  error
)

// server returns the URL of the test server, or skips (fails in CI) when it
// is not reachable.
func server(t testing.TB) string {
	t.Helper()
	u := testenv.Getenv("AGENTKIT_TEST_REDIS", defaultServer)
	serverOnce.Do(func() {
		var c *redis.Client
		c, serverErr = rawClient(u)
		if serverErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			serverErr = c.Ping(ctx).Err()
			c.Close()
		}
	})
	if serverErr != nil {
		testenv.Unavailable(t, "Redis", "Start one and set AGENTKIT_TEST_REDIS to its URL (default "+defaultServer+").", serverErr)
	}
	return u
}

func rawClient(u string) (*redis.Client, error) {
	o, err := redis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(o), nil
}

// raw returns a plain go-redis client on the test server, closed when the
// test ends.
func raw(t testing.TB) *redis.Client {
	t.Helper()
	c, err := rawClient(server(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// scanPrefix returns every Redis key under prefix (the test prefixes hold no
// glob characters).
func scanPrefix(ctx context.Context, c *redis.Client, prefix string) ([]string, error) {
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	slices.Sort(keys)
	return slices.Compact(keys), iter.Err()
}

// newPrefix returns a fresh namespace. When the test ends it checks that the
// index and the data agree exactly (the scripts keep them in step), then
// deletes every key of the namespace.
func newPrefix(t testing.TB) string {
	t.Helper()
	return newPrefixChecked(t, true)
}

// newPrefixChecked is newPrefix, with the index check optional (for raw
// benchmarks that keep no index).
func newPrefixChecked(t testing.TB, check bool) string {
	t.Helper()
	u := server(t)
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "kvtest:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := rawClient(u)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		keys, err := scanPrefix(ctx, c, prefix)
		if err != nil {
			t.Errorf("scan %s: %v", prefix, err)
			return
		}
		if check && !t.Failed() {
			checkIndex(t, ctx, c, prefix, keys)
		}
		for chunk := range slices.Chunk(keys, 500) {
			if err := c.Unlink(ctx, chunk...).Err(); err != nil {
				t.Errorf("clean %s: %v", prefix, err)
				return
			}
		}
	})
	return prefix
}

// checkIndex reports data hashes missing from the index and index members
// without data.
func checkIndex(t testing.TB, ctx context.Context, c *redis.Client, prefix string, keys []string) {
	var data []string
	for _, k := range keys {
		if rest, ok := strings.CutPrefix(k, prefix+"d:"); ok {
			data = append(data, rest)
		} else if k != prefix+"idx" && k != prefix+"seq" {
			t.Errorf("stray Redis key %q in the namespace", k)
		}
	}
	members, err := c.ZRange(ctx, prefix+"idx", 0, -1).Result()
	if err != nil {
		t.Errorf("read index: %v", err)
		return
	}
	slices.Sort(data)
	if !slices.Equal(data, members) {
		t.Errorf("the index (%d members) does not match the data (%d keys)", len(members), len(data))
	}
}

func openPrefix(t testing.TB, prefix string, opts *Options) *kv.DB {
	t.Helper()
	o := Options{Prefix: prefix}
	if opts != nil {
		o = *opts
		o.Prefix = prefix
	}
	db, err := Open(context.Background(), server(t), &o)
	if err != nil {
		t.Fatalf("Open prefix %s: %v", prefix, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpenURL(t *testing.T) {
	base := server(t)
	prefix := newPrefix(t)
	ctx := t.Context()
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	db, err := kv.Open(ctx, base+sep+"prefix="+url.QueryEscape(prefix))
	if err != nil {
		t.Fatalf("kv.Open: %v", err)
	}
	defer db.Close()
	if db.Name() != "redis" {
		t.Errorf("Name() = %q, want redis", db.Name())
	}
	s, ok := db.Backend().(*Store)
	if !ok {
		t.Fatalf("Backend() is %T, want *rediskv.Store", db.Backend())
	}
	if s.Prefix() != prefix {
		t.Errorf("prefix %q, want %q", s.Prefix(), prefix)
	}
	if !db.Capabilities().CAS || !db.Capabilities().List {
		t.Errorf("capabilities %v, want the full core and CAS", db.Capabilities())
	}
	if err := db.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := raw(t).HGet(ctx, prefix+"d:k", "v").Result(); err != nil || v != "v" {
		t.Errorf("the value is not in hash %sd:k: %q, %v", prefix, v, err)
	}

	// rediss:// is registered and speaks TLS: against this plain server the
	// handshake fails, which is not a missing driver.
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tlsURL := "rediss" + strings.TrimPrefix(base, "redis")
	_, err = kv.Open(tctx, tlsURL+sep+"prefix=x:")
	if err == nil || strings.Contains(err.Error(), "no driver") || !strings.Contains(err.Error(), "rediskv") {
		t.Errorf("kv.Open(%s) against a plain server: got %v, want a TLS failure from rediskv", tlsURL, err)
	}
}

func TestSplitURL(t *testing.T) {
	for _, tc := range []struct{ in, rest, prefix string }{
		{"redis://:pw@h:6379/2?prefix=app%3A&dial_timeout=3s", "redis://:pw@h:6379/2?dial_timeout=3s", "app:"},
		{"rediss://h/0", "rediss://h/0", ""},
	} {
		u, err := url.Parse(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		rest, opts, err := splitURL(u)
		if err != nil {
			t.Fatalf("splitURL(%s): %v", tc.in, err)
		}
		if rest != tc.rest || opts.Prefix != tc.prefix {
			t.Errorf("splitURL(%s) = %q, prefix %q; want %q, prefix %q", tc.in, rest, opts.Prefix, tc.rest, tc.prefix)
		}
	}
	for _, bad := range []string{"redis://h/0?prefix=", "redis://h/0?prefix=a;b", "redis://h/0?prefix=a&prefix=b"} {
		u, _ := url.Parse(bad)
		if _, _, err := splitURL(u); err == nil {
			t.Errorf("splitURL(%s) succeeded, want an error", bad)
		}
	}
}

func TestOptionsChecked(t *testing.T) {
	base := server(t)
	_, err := kv.Open(t.Context(), base+"?max_retries=3")
	if err == nil || !strings.Contains(err.Error(), "max_retries") {
		t.Errorf("kv.Open with max_retries=3: got %v, want an error explaining retries", err)
	}
	_, err = kv.Open(t.Context(), base+"?nonsense=1")
	if err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Errorf("kv.Open with an unknown option: got %v, want an error naming it", err)
	}
	db, err := kv.Open(t.Context(), base+"?max_retries=-1&prefix="+newPrefix(t))
	if err != nil {
		t.Errorf("kv.Open with max_retries=-1: %v", err)
	} else {
		db.Close()
	}
}

func TestErrorsHidePassword(t *testing.T) {
	const pw = "S3cretPassw0rd"
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error, want one", what)
			return
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(fmt.Sprintf("%+v", err), pw) {
			t.Errorf("%s: the error shows the password: %v", what, err)
		}
	}
	_, err := kv.Open(ctx, "redis://:"+pw+"@127.0.0.1:1/0?prefix=x:")
	check("kv.Open on a closed port", err)
	if err != nil && !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("the error does not say where it tried to connect: %v", err)
	}
	_, err = kv.Open(ctx, "redis://someone:"+pw+"@127.0.0.1:1/0")
	check("kv.Open with a user on a closed port", err)
	_, err = Open(ctx, "redis://:"+pw+"@127.0.0.1:1/0", nil)
	check("Open on a closed port", err)
	_, err = Open(ctx, "redis://:"+pw+"@127.0.0.1:1/0?bogus="+pw, nil)
	check("Open with an unknown option", err)
	_, err = Open(ctx, "redis://:"+pw+"@127.0.0.1:99999999/0", nil)
	check("Open with a bad port", err)
	_, err = Open(ctx, "redis://:"+pw+"@127.0.0.1:6379/notanumber", nil)
	check("Open with a bad database", err)
	// The real server, with credentials it does not accept.
	srv, _ := url.Parse(server(t))
	srv.User = url.UserPassword("nosuchuser", pw)
	_, err = kv.Open(ctx, srv.String())
	check("kv.Open with a wrong user and password", err)
}

// capturedLog collects what go-redis prints through its global logger.
type capturedLog struct {
	mu    sync.Mutex
	lines []string
}

func (c *capturedLog) Printf(_ context.Context, format string, v ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, fmt.Sprintf(format, v...))
}

// A server that is down is reported once, by the error: go-redis's pool
// prints nothing of its own (it would print "failed to dial after 5
// attempts" to standard error, beside the error, for a command-line user to
// puzzle over).
func TestServerDownPrintsNothing(t *testing.T) {
	logged := &capturedLog{}
	redis.SetLogger(logged)
	t.Cleanup(func() { redis.SetLogger(&stderrLogger{}) })
	_, err := kv.Open(t.Context(), "redis://127.0.0.1:1/0")
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("kv.Open of a closed port = %v, want the dial error", err)
	}
	logged.mu.Lock()
	defer logged.mu.Unlock()
	if len(logged.lines) > 0 {
		t.Errorf("go-redis logged %q beside the error", logged.lines)
	}
}

// stderrLogger puts go-redis's logging back to standard error after a test.
type stderrLogger struct{}

func (stderrLogger) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(os.Stderr, "redis: "+format+"\n", v...)
}

// TestLayout checks what a store keeps on the server: a hash per key, the
// index and the counter, and that Delete removes the first two but keeps
// the counter.
func TestLayout(t *testing.T) {
	prefix := newPrefix(t)
	db := openPrefix(t, prefix, nil)
	c := raw(t)
	ctx := t.Context()
	ver, err := db.PutIfAbsent(ctx, "a/b", []byte("val"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.HGetAll(ctx, prefix+"d:a/b").Result()
	if err != nil || h["v"] != "val" || h["r"] != string(ver) || len(h) != 2 {
		t.Errorf("hash %sd:a/b = %v, %v; want v=val r=%s", prefix, h, err, ver)
	}
	if m, err := c.ZRange(ctx, prefix+"idx", 0, -1).Result(); err != nil || !slices.Equal(m, []string{"a/b"}) {
		t.Errorf("index = %q, %v; want [a/b]", m, err)
	}
	if n, err := c.Get(ctx, prefix+"seq").Result(); err != nil || !strings.HasPrefix(string(ver), n+"-") {
		t.Errorf("counter = %q, %v; want the number in version %s", n, err, ver)
	}
	if err := db.Delete(ctx, "a/b"); err != nil {
		t.Fatal(err)
	}
	keys, err := scanPrefix(ctx, c, prefix)
	if err != nil || !slices.Equal(keys, []string{prefix + "seq"}) {
		t.Errorf("after Delete the namespace holds %q, %v; want only the counter", keys, err)
	}
}

// TestVersionsSurviveCounterRollback replays what a restart from an older
// snapshot (or a failover to a lagging replica) does: the data and the
// counter go back in time, and the next write draws a counter value that was
// already handed out. A client still holding the lost write's version must
// get a conflict, not overwrite the newer value.
func TestVersionsSurviveCounterRollback(t *testing.T) {
	prefix := newPrefix(t)
	db := openPrefix(t, prefix, nil)
	c := raw(t)
	ctx := t.Context()
	if _, err := db.PutIfAbsent(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	snapHash, err := c.HGetAll(ctx, prefix+"d:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	snapSeq, err := c.Get(ctx, prefix+"seq").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Put(ctx, "k", []byte("lost")); err != nil {
		t.Fatal(err)
	}
	_, lost, err := db.GetWithVersion(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// Roll back to the snapshot.
	if err := c.HSet(ctx, prefix+"d:k", snapHash).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, prefix+"seq", snapSeq, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := db.Put(ctx, "k", []byte("after")); err != nil {
		t.Fatal(err)
	}
	_, now, err := db.GetWithVersion(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if now == lost {
		t.Fatalf("the write after the rollback got version %s, the same as the lost write", now)
	}
	if _, err := db.PutIfVersion(ctx, "k", []byte("stale"), lost); !errors.Is(err, kv.ErrConflict) {
		t.Errorf("PutIfVersion with the lost write's version: got %v, want kv.ErrConflict", err)
	}
	if v, err := db.Get(ctx, "k"); err != nil || string(v) != "after" {
		t.Errorf("k = %q, %v; want \"after\"", v, err)
	}
}

// stallProxy forwards TCP connections to a server, and while stalled holds
// back the server's replies: a command then runs on the server but its
// client never hears back, the case where a write's outcome is unknown.
type stallProxy struct {
	ln    net.Listener
	stall atomic.Bool
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() { io.Copy(s, c); s.Close() })
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					for p.stall.Load() {
						time.Sleep(5 * time.Millisecond)
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

// TestUnknownOutcomeIsNotConflict holds back the replies of conditional
// writes until their deadline passes. The writes land on the server, so the
// error must be the deadline, never a conflict.
func TestUnknownOutcomeIsNotConflict(t *testing.T) {
	base := server(t)
	su, _ := url.Parse(base)
	proxy := newStallProxy(t, su.Host)
	su.Host = proxy.ln.Addr().String()
	su.RawQuery = "pool_size=1" // one connection, set up before each stall
	prefix := newPrefix(t)
	db, err := Open(t.Context(), su.String(), &Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	direct := openPrefix(t, prefix, nil)
	ctx := t.Context()
	ver, err := db.PutIfAbsent(ctx, "k", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		name, key, want string
		run             func(context.Context) error
	}{
		{"PutIfVersion", "k", "v2", func(ctx context.Context) error {
			_, err := db.PutIfVersion(ctx, "k", []byte("v2"), ver)
			return err
		}},
		{"PutIfAbsent", "new", "n", func(ctx context.Context) error {
			_, err := db.PutIfAbsent(ctx, "new", []byte("n"))
			return err
		}},
	} {
		// The previous timeout closed the connection: open the next
		// one while replies still flow.
		if err := db.Backend().(*Store).client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		proxy.stall.Store(true)
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := op.run(tctx)
		cancel()
		proxy.stall.Store(false)
		if errors.Is(err, kv.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with its reply held back: got %v, want context.DeadlineExceeded and no conflict", op.name, err)
		}
		if v, err := direct.Get(ctx, op.key); err != nil || string(v) != op.want {
			t.Errorf("%s: the server holds %q, %v; want the write to have landed (%q)", op.name, v, err, op.want)
		}
	}
}

func TestListPaging(t *testing.T) {
	db := openPrefix(t, newPrefix(t), &Options{PageSize: 3})
	ctx := t.Context()
	var want []string
	for i := range 11 {
		want = append(want, fmt.Sprintf("p/%02d", i))
	}
	others := []string{"o", "p", "p.", "p0", "q", "\u007f", "\u007fa", "é", "ê", "éa", "\U0010ffff", "\U0010ffffz"}
	for _, k := range append(slices.Clone(want), others...) {
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if got := collectKeys(t, db, "p/"); !slices.Equal(got, want) {
		t.Errorf("ListKeys(p/) with 3-key pages = %q, want %q", got, want)
	}
	for prefix, want := range map[string][]string{
		"\u007f":     {"\u007f", "\u007fa"},
		"é":          {"é", "éa"},
		"\U0010ffff": {"\U0010ffff", "\U0010ffffz"},
		"zz":         nil,
	} {
		if got := collectKeys(t, db, prefix); !slices.Equal(got, want) {
			t.Errorf("ListKeys(%q) = %q, want %q", prefix, got, want)
		}
	}
	var all []string
	for e, err := range db.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Value) != e.Key {
			t.Errorf("List yielded %q with value %q", e.Key, e.Value)
		}
		all = append(all, e.Key)
	}
	wantAll := append(slices.Clone(want), others...)
	slices.Sort(wantAll)
	if !slices.Equal(all, wantAll) {
		t.Errorf("List(\"\") = %q, want %q", all, wantAll)
	}
}

func collectKeys(t *testing.T, db *kv.DB, prefix string) []string {
	t.Helper()
	var out []string
	for k, err := range db.ListKeys(t.Context(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

// TestListSkipsDeleted deletes a key between List's index read and its
// value fetch: it is skipped, and the other values (big and empty ones
// included) round-trip.
func TestListSkipsDeleted(t *testing.T) {
	db := openPrefix(t, newPrefix(t), nil)
	ctx := t.Context()
	big := func(c byte) []byte { return []byte(strings.Repeat(string(c), 100<<10)) }
	vals := map[string][]byte{"b/1": big('1'), "b/2": []byte("small"), "b/3": []byte("gone"), "b/4": {}, "b/5": big('5')}
	for k, v := range vals {
		if err := db.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	s := db.Backend().(*Store)
	hooked := 0
	s.testHookPage = func(page []string) {
		hooked++
		if err := db.Delete(ctx, "b/3"); err != nil {
			t.Error(err)
		}
	}
	defer func() { s.testHookPage = nil }()
	var got []string
	for e, err := range db.List(ctx, "b/") {
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Value) != string(vals[e.Key]) {
			t.Errorf("List yielded %q with %d bytes, want %d", e.Key, len(e.Value), len(vals[e.Key]))
		}
		got = append(got, e.Key)
	}
	if want := []string{"b/1", "b/2", "b/4", "b/5"}; !slices.Equal(got, want) || hooked != 1 {
		t.Errorf("List = %q after %d index reads, want %q after 1 (b/3 deleted before its value was fetched)", got, hooked, want)
	}
}

func TestTooLarge(t *testing.T) {
	db := openPrefix(t, newPrefix(t), nil)
	s := db.Backend().(*Store)
	s.maxValue = 10
	ctx := t.Context()
	if err := db.Put(ctx, "k", make([]byte, 10)); err != nil {
		t.Fatalf("Put at the limit: %v", err)
	}
	ver, err := db.PutIfAbsent(ctx, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	over := make([]byte, 11)
	if err := db.Put(ctx, "k", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("Put over the limit: %v, want kv.ErrTooLarge", err)
	}
	if _, err := db.PutIfAbsent(ctx, "n", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("PutIfAbsent over the limit: %v, want kv.ErrTooLarge", err)
	}
	if _, err := db.PutIfVersion(ctx, "c", over, ver); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("PutIfVersion over the limit: %v, want kv.ErrTooLarge", err)
	}
	if v, err := db.Get(ctx, "k"); err != nil || len(v) != 10 {
		t.Errorf("after a rejected Put, Get = %d bytes, %v; want the 10 bytes stored before", len(v), err)
	}
}

func TestDrop(t *testing.T) {
	prefix := newPrefix(t)
	db := openPrefix(t, prefix, &Options{PageSize: 2})
	ctx := t.Context()
	for i := range 5 {
		if err := db.Put(ctx, fmt.Sprint("k", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Backend().(*Store).Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, err := scanPrefix(ctx, raw(t), prefix); err != nil || len(keys) != 0 {
		t.Errorf("after Drop the namespace holds %q, %v", keys, err)
	}
}
