package hostedkv_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/kv"
	"agentkit/kv/kvtest"
	"agentkit/kv/pgkv"
)

// benchSides returns the direct PostgreSQL store and the hosted one, each
// filled with 1,000 keys of kvtest.BenchValueSize bytes and 100 keys under
// list/.
func benchSides(b *testing.B) ([]*kv.DB, []byte) {
	base := postgresServer(b)
	svc := startService(b, pgBackend(b, false))
	ns, token := svc.namespace(b)
	hosted := svc.open(b, ns, token, nil)
	b.Cleanup(func() { hosted.Close() })
	table := "hkb_" + randomHex(5)
	conn := base
	if n := os.Getenv("HOSTEDKV_BENCH_DIRECT_POOL"); n != "" {
		sep := "?"
		if strings.Contains(conn, "?") {
			sep = "&"
		}
		conn += sep + "pool_max_conns=" + n // to compare with storaged's larger pool
	}
	direct, err := pgkv.Open(context.Background(), conn, &pgkv.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		direct.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, base); err == nil {
			conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
			conn.Close(ctx)
		}
	})
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	sides := []*kv.DB{direct, hosted}
	ctx := context.Background()
	for _, db := range sides {
		for i := range keys {
			if err := db.Put(ctx, kvtest.BenchKey(i), value); err != nil {
				b.Fatal(err)
			}
		}
		for i := range 100 {
			if err := db.Put(ctx, fmt.Sprintf("list/%03d", i), value); err != nil {
				b.Fatal(err)
			}
		}
	}
	return sides, value
}

// BenchmarkHostedVsPostgres measures what storaged adds over the
// PostgreSQL driver used directly: both sides write to the same server with
// its own durability settings (no synchronous_commit override), in tables
// of their own, through *kv.DB. Each iteration runs the operation once on
// each side, in alternating order, and the benchmark reports the median
// latency of each side and their difference:
//
//	go test -run '^$' -bench HostedVsPostgres -benchtime 3000x ./kv/hostedkv/
func BenchmarkHostedVsPostgres(b *testing.B) {
	sides, value := benchSides(b)
	ctx := b.Context()
	const keys = 1000
	run := "" // a fresh name per sub-benchmark run, for PutIfAbsent's keys
	type opFunc func(db *kv.DB, i int, state *kv.Version) error
	ops := []struct {
		name string
		fn   opFunc
	}{
		{"Put", func(db *kv.DB, i int, _ *kv.Version) error { return db.Put(ctx, kvtest.BenchKey(i%keys), value) }},
		{"Get", func(db *kv.DB, i int, _ *kv.Version) error {
			_, err := db.Get(ctx, kvtest.BenchKey(i%keys))
			return err
		}},
		{"PutIfVersion", func(db *kv.DB, i int, ver *kv.Version) error {
			if *ver == "" {
				_, v, err := db.GetWithVersion(ctx, kvtest.BenchKey(0))
				if err != nil {
					return err
				}
				*ver = v
			}
			v, err := db.PutIfVersion(ctx, kvtest.BenchKey(0), value, *ver)
			*ver = v
			return err
		}},
		{"PutIfAbsent", func(db *kv.DB, i int, _ *kv.Version) error {
			_, err := db.PutIfAbsent(ctx, fmt.Sprintf("absent/%s/%d", run, i), value)
			return err
		}},
		{"Delete", func(db *kv.DB, i int, _ *kv.Version) error { return db.Delete(ctx, fmt.Sprintf("gone/%d", i)) }},
		{"ListKeys100", func(db *kv.DB, i int, _ *kv.Version) error {
			n := 0
			for _, err := range db.ListKeys(ctx, "list/") {
				if err != nil {
					return err
				}
				n++
			}
			if n != 100 {
				return fmt.Errorf("listed %d keys, want 100", n)
			}
			return nil
		}},
	}
	for _, op := range ops {
		b.Run(op.name, func(b *testing.B) {
			run = randomHex(4)
			lat := [2][]time.Duration{}
			vers := [2]kv.Version{}
			i := 0
			for b.Loop() {
				for k := range 2 {
					side := (i + k) % 2 // alternate which side goes first
					start := time.Now()
					if err := op.fn(sides[side], i, &vers[side]); err != nil {
						b.Fatalf("%s on side %d: %v", op.name, side, err)
					}
					lat[side] = append(lat[side], time.Since(start))
				}
				i++
			}
			d, h := median(lat[0]), median(lat[1])
			b.ReportMetric(float64(d.Microseconds()), "direct-p50-µs")
			b.ReportMetric(float64(h.Microseconds()), "hosted-p50-µs")
			b.ReportMetric(float64((h - d).Microseconds()), "added-p50-µs")
		})
	}
}

// BenchmarkHostedVsPostgresThroughput runs 64 goroutines (half Get, half
// Put) on one side for 300 ms, then on the next, rotating which goes first
// each iteration, and reports each side's ops/s and their ratios:
//
//	go test -run '^$' -bench HostedVsPostgresThroughput -benchtime 10x ./kv/hostedkv/
//
// Each side uses its default connection pool: pgx's (4 on this machine)
// for the direct driver, storaged's (DefaultPoolSize) for the service.
// HOSTEDKV_BENCH_DIRECT_POOL=16 gives the direct side as many.
//
// A third side is the floor of any service hop (relay_test.go): the
// thinnest HTTP server over the PostgreSQL driver, in a process of its
// own with storaged's pool. relay/direct is what the hop alone costs on
// this machine; hosted/relay is what storaged costs beyond it.
func BenchmarkHostedVsPostgresThroughput(b *testing.B) {
	dbs, value := benchSides(b)
	fill := make([]string, 1000)
	for i := range fill {
		fill[i] = kvtest.BenchKey(i)
	}
	sides := []ops{dbOps(dbs[0]), dbOps(dbs[1]), relayOps(b, value, fill)}
	ctx := b.Context()
	const clients, window = 64, 300 * time.Millisecond
	var counts [3]int64
	var elapsed [3]time.Duration
	round := 0
	for b.Loop() {
		round++
		for k := range sides {
			side := (round + k) % len(sides) // rotate which side goes first
			n, d := burst(ctx, sides[side], clients, window, value)
			counts[side] += n
			elapsed[side] += d
		}
	}
	rd := float64(counts[0]) / elapsed[0].Seconds()
	rh := float64(counts[1]) / elapsed[1].Seconds()
	rr := float64(counts[2]) / elapsed[2].Seconds()
	b.ReportMetric(rd, "direct-ops/s")
	b.ReportMetric(rh, "hosted-ops/s")
	b.ReportMetric(rr, "relay-ops/s")
	b.ReportMetric(rh/rd, "hosted/direct")
	b.ReportMetric(rr/rd, "relay/direct")
	b.ReportMetric(rh/rr, "hosted/relay")
}

// burst runs clients goroutines doing Get and Put (half each) on a side
// for the window and returns how many operations finished and how long it
// took.
func burst(ctx context.Context, side ops, clients int, window time.Duration, value []byte) (int64, time.Duration) {
	var n atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(window)
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				key := kvtest.BenchKey((c*131 + i) % 1000)
				var err error
				if i%2 == 0 {
					err = side.get(ctx, key)
				} else {
					err = side.put(ctx, key, value)
				}
				if err != nil {
					panic(err)
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return n.Load(), time.Since(start)
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// BenchmarkHostedListing10k measures a full listing of 10,000 keys through
// storaged's generic backend (Redis: PostgreSQL and SQLite backends use
// native tables instead) against a raw listing of the same backend store:
// the backend itself, listed with rediskv under the namespace's prefix,
// which reads the same 10,000 entries (the service's envelopes) that the
// service reads. Each iteration lists once on each
// side, in alternating order; the benchmark reports each side's median and
// the ratio:
//
//	go test -run '^$' -bench HostedListing10k -benchtime 20x ./kv/hostedkv/
//
// The hosted listing is paged (the client's default page), so it costs
// one HTTP round trip per page; the raw listing is rediskv's own paging.
func BenchmarkHostedListing10k(b *testing.B) {
	const keys = 10_000
	ctx := b.Context()
	backend := redisBackend(b)
	svc := startService(b, backend)
	ns, token := svc.namespace(b)
	hosted := svc.open(b, ns, token, nil)
	b.Cleanup(func() { hosted.Close() })
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys; i += 8 {
				if err := hosted.Put(ctx, fmt.Sprintf("k/%05d", i), value); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	raw, err := kv.Open(ctx, backend)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { raw.Close() })
	// The namespace's envelopes sit under a prefix of the service's own
	// layout: find it from one of them.
	mark, prefix := "/kv/"+ns+"/", ""
	for k, err := range raw.ListKeys(ctx, "") {
		if err != nil {
			b.Fatal(err)
		}
		if i := strings.Index(k, mark); i >= 0 {
			prefix = k[:i+len(mark)]
			break
		}
	}
	if prefix == "" {
		b.Fatalf("no backend key holds %q", mark)
	}
	count := func(seq func(func(string, error) bool)) error {
		n := 0
		for _, err := range seq {
			if err != nil {
				return err
			}
			n++
		}
		if n != keys {
			return fmt.Errorf("listed %d keys, want %d", n, keys)
		}
		return nil
	}
	keysOf := func(seq func(func(kv.Entry, error) bool)) func(func(string, error) bool) {
		return func(yield func(string, error) bool) {
			for e, err := range seq {
				if !yield(e.Key, err) {
					return
				}
			}
		}
	}
	sides := []struct {
		name string
		list func() error
	}{
		{"raw", func() error { return count(keysOf(raw.List(ctx, prefix))) }},
		{"hosted-keys", func() error { return count(hosted.ListKeys(ctx, "")) }},
		{"hosted-values", func() error { return count(keysOf(hosted.List(ctx, ""))) }},
	}
	lat := make([][]time.Duration, len(sides))
	round := 0
	for b.Loop() {
		round++
		for k := range sides {
			side := (round + k) % len(sides) // rotate which side goes first
			start := time.Now()
			if err := sides[side].list(); err != nil {
				b.Fatalf("%s: %v", sides[side].name, err)
			}
			lat[side] = append(lat[side], time.Since(start))
		}
	}
	r := median(lat[0])
	b.ReportMetric(float64(r.Milliseconds()), "raw-p50-ms")
	for i, s := range sides[1:] {
		m := median(lat[i+1])
		b.ReportMetric(float64(m.Milliseconds()), s.name+"-p50-ms")
		b.ReportMetric(float64(m)/float64(r), s.name+"/raw")
	}
}
