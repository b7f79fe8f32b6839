package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/kv"
)

// The ledger's benchmarks compare it with the store it runs on, in the same
// process and the same loop, so the ratios hold on a busy machine:
//
//	go test -run '^$' -bench 'Ack|Throughput' -benchtime 2000x ./ledger/
//
// BenchmarkAck alternates, in one loop, one acknowledged delivery to an
// idle session this host served last (its control record cached: the
// fast path) and one compare-and-set, through the same driver, of a value
// as large as that control record. It reports both medians and 99th
// percentiles and their ratios, and the store writes one message costs
// from its delivery to the release of the session. The -keyed runs
// deliver keyed events (a client's Idempotency-Key) to a session that
// keeps kept keys: each acknowledgement reads its kept key first, and
// each turn keeps the key its event pushes out of the window.
func BenchmarkAck(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) { benchAck(b, be.make(b), false) })
		b.Run(be.name+"-keyed", func(b *testing.B) { benchAck(b, be.make(b), true) })
	}
}

func benchAck(b *testing.B, be backend, keyed bool) {
	ctx := context.Background()
	counting := newCountingDB(be.open(b))
	db, err := kv.New(be.name, counting)
	if err != nil {
		b.Fatal(err)
	}
	released := make(chan struct{}, 1)
	l, err := Open(Options{Store: db, Agent: "bench-" + randomSuffix(), Logger: quietLogger(),
		Handler: func(ctx context.Context, tr *Turn) error {
			_, err := tr.Commit(ctx, []json.RawMessage{json.RawMessage(`{"text":"ok"}`)})
			return err
		}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	l.opts.test.step = func(name string) {
		if name == "release:after-write" {
			released <- struct{}{}
		}
	}
	payload := json.RawMessage(`{"text":"hello, how are you today?"}`)
	n := 0
	deliver := func() time.Duration {
		n++
		start := time.Now()
		if _, err := l.Deliver(ctx, "s", Event{ID: fmt.Sprintf("%036d", n), Payload: payload, Keyed: keyed}); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		<-released // the session is idle again before the next delivery
		return d
	}
	// Warm up until the de-duplication window is full: the control record
	// has its steady size.
	for range DefaultDedupWindow + 10 {
		deliver()
	}
	ctl, _, err := db.GetWithVersion(ctx, l.keys.ctl("s"))
	if err != nil {
		b.Fatal(err)
	}
	rawKey := "agentkit/v1/bench-raw-" + randomSuffix()
	ver, err := db.PutIfAbsent(ctx, rawKey, ctl)
	if err != nil {
		b.Fatal(err)
	}
	counting.reset()
	var acks, cass []time.Duration
	for b.Loop() {
		acks = append(acks, deliver())
		start := time.Now()
		if ver, err = db.PutIfVersion(ctx, rawKey, ctl, ver); err != nil {
			b.Fatal(err)
		}
		cass = append(cass, time.Since(start))
	}
	calls := counting.snapshot()
	writes := calls["cas"] + calls["put"] + calls["delete"] - len(cass)
	ackP50, ackP99 := percentiles(acks)
	casP50, casP99 := percentiles(cass)
	b.ReportMetric(float64(ackP50.Microseconds()), "ack-p50-µs")
	b.ReportMetric(float64(ackP99.Microseconds()), "ack-p99-µs")
	b.ReportMetric(float64(casP50.Microseconds()), "cas-p50-µs")
	b.ReportMetric(float64(casP99.Microseconds()), "cas-p99-µs")
	b.ReportMetric(float64(ackP50)/float64(casP50), "p50-ratio")
	b.ReportMetric(float64(ackP99)/float64(casP99), "p99-ratio")
	b.ReportMetric(float64(writes)/float64(len(acks)), "writes/msg")
	b.ReportMetric(float64(calls["get"])/float64(len(acks)), "reads/msg")
	b.ReportMetric(float64(len(ctl)), "ctl-bytes")
}

func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100]
}

// BenchmarkThroughput runs three hosts on one PostgreSQL table, with
// senders delivering to their own sessions through random hosts, and
// alternates that (for a second) with the same number of goroutines doing
// compare-and-sets through the driver (for a second). It reports acked
// deliveries per second, store writes per message, and the share of the
// raw compare-and-set throughput the ledger's writes use:
// acked/s × writes/msg ÷ raw CAS/s.
func BenchmarkThroughput(b *testing.B) {
	be := postgresBackend(b)
	const nHosts, senders = 3, 12
	phase := time.Second
	ctx := context.Background()
	counters := make([]*countingDB, nHosts)
	ledgers := make([]*Ledger, nHosts)
	for i := range ledgers {
		counters[i] = newCountingDB(be.open(b))
		db, err := kv.New("postgres", counters[i])
		if err != nil {
			b.Fatal(err)
		}
		l, err := Open(Options{Store: db, Agent: "bench-tp", HostID: fmt.Sprint("h", i), Logger: quietLogger(),
			Handler: func(ctx context.Context, tr *Turn) error {
				_, err := tr.Commit(ctx, []json.RawMessage{json.RawMessage(`{"text":"ok"}`)})
				return err
			}})
		if err != nil {
			b.Fatal(err)
		}
		ledgers[i] = l
		defer l.Close(ctx)
	}
	raw := be.open(b)
	value := make([]byte, 600)
	var ledgerAcks, ledgerWrites, rawOps int64
	var ledgerTime, rawTime time.Duration
	seq := atomic.Int64{}
	for b.Loop() {
		// The ledger.
		for _, c := range counters {
			c.reset()
		}
		var acked atomic.Int64
		deadline := time.Now().Add(phase)
		var wg sync.WaitGroup
		start := time.Now()
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					l := ledgers[(s+i)%nHosts]
					id := fmt.Sprintf("e%d", seq.Add(1))
					_, err := l.Deliver(ctx, fmt.Sprint("s", s), Event{ID: id, Payload: json.RawMessage(`{"text":"hi"}`)})
					if err == nil {
						acked.Add(1)
					} else {
						time.Sleep(time.Millisecond) // busy (back-pressure) or a store error
					}
				}
			}()
		}
		wg.Wait()
		// Let the holders drain what was acknowledged, so every write the
		// acknowledged messages cost is counted.
		for s := range senders {
			for {
				c, _, _ := ledgers[0].readControl(ctx, ledgers[0].keys.ctl(fmt.Sprint("s", s)))
				if c == nil || (len(c.Pending) == 0 && c.Holder == "") {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		ledgerTime += time.Since(start)
		ledgerAcks += acked.Load()
		for _, c := range counters {
			calls := c.snapshot()
			ledgerWrites += int64(calls["cas"] + calls["put"] + calls["delete"])
		}
		// Raw compare-and-sets at the same concurrency.
		var ops atomic.Int64
		deadline = time.Now().Add(phase)
		start = time.Now()
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("agentkit/v1/bench-raw/%d-%s", s, randomSuffix())
				ver, err := raw.PutIfAbsent(ctx, key, value)
				if err != nil {
					b.Error(err)
					return
				}
				for time.Now().Before(deadline) {
					if ver, err = raw.PutIfVersion(ctx, key, value, ver); err != nil {
						b.Error(err)
						return
					}
					ops.Add(1)
				}
			}()
		}
		wg.Wait()
		rawTime += time.Since(start)
		rawOps += ops.Load()
	}
	ackRate := float64(ledgerAcks) / ledgerTime.Seconds()
	writesPerMsg := float64(ledgerWrites) / float64(ledgerAcks)
	rawRate := float64(rawOps) / rawTime.Seconds()
	b.ReportMetric(ackRate, "acked/s")
	b.ReportMetric(writesPerMsg, "writes/msg")
	b.ReportMetric(rawRate, "raw-cas/s")
	b.ReportMetric(ackRate*writesPerMsg/rawRate, "store-share")
}

// countingDB counts calls to a real store by kind.
type countingDB struct {
	db     *kv.DB
	mu     sync.Mutex
	counts map[string]int
}

var (
	_ kv.Store = (*countingDB)(nil)
	_ kv.CAS   = (*countingDB)(nil)
)

func newCountingDB(db *kv.DB) *countingDB { return &countingDB{db: db, counts: map[string]int{}} }

func (c *countingDB) count(op string) {
	c.mu.Lock()
	c.counts[op]++
	c.mu.Unlock()
}

func (c *countingDB) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps(c.counts)
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (c *countingDB) reset() {
	c.mu.Lock()
	c.counts = map[string]int{}
	c.mu.Unlock()
}

func (c *countingDB) Put(ctx context.Context, k string, v []byte) error {
	c.count("put")
	return c.db.Put(ctx, k, v)
}
func (c *countingDB) Get(ctx context.Context, k string) ([]byte, error) {
	c.count("get")
	return c.db.Get(ctx, k)
}
func (c *countingDB) Delete(ctx context.Context, k string) error {
	c.count("delete")
	return c.db.Delete(ctx, k)
}
func (c *countingDB) List(ctx context.Context, p string) iter.Seq2[kv.Entry, error] {
	c.count("list")
	return c.db.List(ctx, p)
}
func (c *countingDB) GetWithVersion(ctx context.Context, k string) ([]byte, kv.Version, error) {
	c.count("get")
	return c.db.GetWithVersion(ctx, k)
}
func (c *countingDB) PutIfAbsent(ctx context.Context, k string, v []byte) (kv.Version, error) {
	c.count("cas")
	return c.db.PutIfAbsent(ctx, k, v)
}
func (c *countingDB) PutIfVersion(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
	c.count("cas")
	return c.db.PutIfVersion(ctx, k, v, e)
}
func (c *countingDB) ListKeys(ctx context.Context, p string) iter.Seq2[string, error] {
	c.count("list")
	return c.db.ListKeys(ctx, p)
}
