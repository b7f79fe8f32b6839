package hostedkv_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/kv"
	"agentkit/kv/hostedkv"
)

// lossyProxy forwards TCP connections to a service and can cut the
// service's answers short: the request arrives and is served, the answer
// never comes back whole, as when a network path breaks after the write.
type lossyProxy struct {
	ln       net.Listener
	target   string
	dropNext atomic.Bool // drop the next answer
	dropAll  atomic.Bool // drop every answer
	dropped  atomic.Int64
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *lossyProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *lossyProxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	go func() {
		io.Copy(server, client)
		server.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if p.dropAll.Load() || p.dropNext.CompareAndSwap(true, false) {
				p.dropped.Add(1)
				// Send the start of the answer, then break: the client
				// knows the request went out and cannot tell more (with
				// nothing at all, Go's client resends the request by
				// itself, and the driver's own retry would go untested).
				client.Write(buf[:min(n, 9)])
				client.Close()
				server.Close()
				return
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	client.Close()
	server.Close()
}

// faultBackends are the backends the fault tests run on: PostgreSQL (a
// SQL backend) and Redis (the generic backend).
func faultBackends(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Run("postgres", func(t *testing.T) { fn(t, pgBackend(t, true)) })
	t.Run("redis", func(t *testing.T) { fn(t, redisBackend(t)) })
}

func TestLostAnswerIsReplayedNotConflict(t *testing.T) {
	faultBackends(t, testLostAnswerIsReplayedNotConflict)
}

func testLostAnswerIsReplayedNotConflict(t *testing.T, backend string) {
	svc := startService(t, backend)
	ns, token := svc.namespace(t)
	proxy := newLossyProxy(t, svc.addr)
	db, err := hostedkv.Open(t.Context(), proxy.url(), ns, &hostedkv.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()

	// PutIfAbsent whose first answer is lost: the resend learns it won.
	proxy.dropNext.Store(true)
	ver, err := db.PutIfAbsent(ctx, "k", []byte("one"))
	if err != nil {
		t.Fatalf("PutIfAbsent with its first answer lost: %v; the service applied it, so the driver must report success", err)
	}
	if proxy.dropped.Load() != 1 {
		t.Fatalf("the proxy dropped %d answers, want 1", proxy.dropped.Load())
	}
	_, cur, err := db.GetWithVersion(ctx, "k")
	if err != nil || cur != ver {
		t.Fatalf("the version returned (%q) is not the key's (%q, %v)", ver, cur, err)
	}
	// PutIfVersion, the same.
	proxy.dropNext.Store(true)
	ver2, err := db.PutIfVersion(ctx, "k", []byte("two"), ver)
	if err != nil {
		t.Fatalf("PutIfVersion with its first answer lost: %v", err)
	}
	if v, cur, _ := db.GetWithVersion(ctx, "k"); string(v) != "two" || cur != ver2 {
		t.Fatalf("after PutIfVersion: %q at %q, want \"two\" at %q", v, cur, ver2)
	}
	if proxy.dropped.Load() != 2 {
		t.Fatalf("the proxy dropped %d answers, want 2", proxy.dropped.Load())
	}
}

func TestUnknownOutcomeIsNeverAConflict(t *testing.T) {
	faultBackends(t, testUnknownOutcomeIsNeverAConflict)
}

func testUnknownOutcomeIsNeverAConflict(t *testing.T, backend string) {
	svc := startService(t, backend)
	ns, token := svc.namespace(t)
	direct := svc.open(t, ns, token, nil)
	defer direct.Close()
	proxy := newLossyProxy(t, svc.addr)
	db, err := hostedkv.Open(t.Context(), proxy.url(), ns, &hostedkv.Options{Token: token, RetryFor: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	ver, err := direct.PutIfAbsent(ctx, "k", []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	// Every answer is lost: the driver cannot know, and says so.
	proxy.dropAll.Store(true)
	_, err = db.PutIfVersion(ctx, "k", []byte("two"), ver)
	if !errors.Is(err, hostedkv.ErrOutcomeUnknown) || errors.Is(err, kv.ErrConflict) {
		t.Fatalf("PutIfVersion with every answer lost: %v; want ErrOutcomeUnknown and not ErrConflict", err)
	}
	var ke *kv.Error
	if !errors.As(err, &ke) || ke.Key != "k" {
		t.Errorf("the error does not name the key: %v", err)
	}
	// The write did land; re-reading tells the caller so.
	if v, _, err := direct.GetWithVersion(ctx, "k"); err != nil || string(v) != "two" {
		t.Fatalf("re-read after the unknown outcome: %q, %v; want the write's value", v, err)
	}
	// With the service down, a write never leaves (every connection is
	// refused): a plain error, neither a conflict nor an unknown outcome.
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	fresh, err := hostedkv.Open(t.Context(), "http://"+svc.addr, ns, &hostedkv.Options{Token: token, HTTPClient: noReuse, RetryFor: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	svc.kill()
	_, err = fresh.PutIfAbsent(ctx, "k2", []byte("x"))
	if err == nil || errors.Is(err, kv.ErrConflict) || errors.Is(err, hostedkv.ErrOutcomeUnknown) {
		t.Fatalf("PutIfAbsent with the service down: %v; want a plain error (the request never reached it)", err)
	}
}

// TestKilledAndRestartedWhileWriting kills storaged with SIGKILL several
// times while clients write, restarting it on the same address. Every
// write a client saw acknowledged must be there afterwards; a
// compare-and-set counter whose every increment appends a unique tag must
// hold each tag at most once (no write applied twice), every acknowledged
// tag, and only tags a client tried.
func TestKilledAndRestartedWhileWriting(t *testing.T) {
	faultBackends(t, testKilledAndRestartedWhileWriting)
}

func testKilledAndRestartedWhileWriting(t *testing.T, backend string) {
	svc := startService(t, backend)
	ns, token := svc.namespace(t)
	const writers = 4
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		acked    = map[string]string{} // key → value of acknowledged puts
		ackTags  []string              // acknowledged counter tags
		tried    = map[string]bool{}
		unknowns atomic.Int64
	)
	for w := range writers {
		db := svc.open(t, ns, token, &hostedkv.Options{RetryFor: 20 * time.Second})
		defer db.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := t.Context()
			for i := 0; !stop.Load(); i++ {
				key, val := fmt.Sprintf("w%d/k%05d", w, i), fmt.Sprintf("v%d-%d", w, i)
				if err := db.Put(ctx, key, []byte(val)); err == nil {
					mu.Lock()
					acked[key] = val
					mu.Unlock()
				} else if errors.Is(err, hostedkv.ErrOutcomeUnknown) {
					unknowns.Add(1)
				} else {
					t.Errorf("Put %s: %v", key, err)
					return
				}
				if i%3 != 0 {
					continue
				}
				tag := fmt.Sprintf("%d-%d", w, i)
				mu.Lock()
				tried[tag] = true
				mu.Unlock()
				if ok, err := increment(t, db, tag); err != nil {
					t.Errorf("increment %s: %v", tag, err)
					return
				} else if ok {
					mu.Lock()
					ackTags = append(ackTags, tag)
					mu.Unlock()
				}
			}
		}()
	}
	for range 5 {
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
		svc.kill()
		time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond)
		svc.restart()
	}
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}

	db := svc.open(t, ns, token, nil)
	defer db.Close()
	ctx := t.Context()
	for key, want := range acked {
		v, err := db.Get(ctx, key)
		if err != nil || string(v) != want {
			t.Errorf("acknowledged write %s = %q is gone after the restarts: got %q, %v", key, want, v, err)
		}
	}
	v, err := db.Get(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	json.Unmarshal(v, &tags)
	seen := map[string]bool{}
	for _, tag := range tags {
		if seen[tag] {
			t.Errorf("tag %s is in the counter twice: a compare-and-set was applied twice", tag)
		}
		seen[tag] = true
		if !tried[tag] {
			t.Errorf("tag %s is in the counter but no client tried it", tag)
		}
	}
	for _, tag := range ackTags {
		if !seen[tag] {
			t.Errorf("acknowledged increment %s is missing from the counter", tag)
		}
	}
	t.Logf("%d acknowledged puts, %d acknowledged increments (%d in the counter), %d puts with an unknown outcome, 5 SIGKILLs",
		len(acked), len(ackTags), len(tags), unknowns.Load())
	if len(acked) < 20 || len(ackTags) < 5 {
		t.Fatalf("too little got through to test anything: %d puts, %d increments", len(acked), len(ackTags))
	}
}

// increment appends tag to the JSON list under "counter" with a
// compare-and-set loop. An unknown outcome is resolved by re-reading: the
// tag is there (it landed) or not (try again with a fresh read).
func increment(t *testing.T, db *kv.DB, tag string) (bool, error) {
	ctx := t.Context()
	for {
		var tags []string
		v, ver, err := db.GetWithVersion(ctx, "counter")
		switch {
		case errors.Is(err, kv.ErrNotFound):
			_, err = db.PutIfAbsent(ctx, "counter", mustJSON([]string{tag}))
		case err != nil:
			return false, err
		default:
			json.Unmarshal(v, &tags)
			if slices.Contains(tags, tag) {
				return true, nil // an earlier attempt landed
			}
			_, err = db.PutIfVersion(ctx, "counter", mustJSON(append(tags, tag)), ver)
		}
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, kv.ErrConflict), errors.Is(err, hostedkv.ErrOutcomeUnknown):
			continue // re-read: another writer won, or learn whether this one did
		case strings.Contains(err.Error(), "gave up"):
			continue
		default:
			return false, err
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
