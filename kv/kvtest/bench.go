package kvtest

import (
	"fmt"
	"testing"
	"time"
)

// BenchValueSize is the size of the values the benchmarks write: 256 bytes,
// about one small JSON record of the runtime (a session's metadata, a
// reminder, a continuation).
const BenchValueSize = 256

// BenchListSize is how many entries the List1000 benchmark lists.
const BenchListSize = 1000

// BenchValue returns n deterministic bytes for benchmark values, so a
// driver's benchmark of its raw client can write the same payload as
// RunBenchmarks.
func BenchValue(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}

// BenchKey returns the key the benchmarks use for their i-th key, shaped
// like the runtime's keys.
func BenchKey(i int) string {
	return fmt.Sprintf("agentkit/v1/bench/sessions/s%07d/meta", i)
}

// benchOp is one shared benchmark: setup prepares a fresh namespace
// and returns the operation to time, called with the iteration number.
type benchOp struct {
	name  string
	needs need
	bytes int64 // bytes per operation, for b.SetBytes
	setup func(b *testing.B, s *suite) func(i int) error
}

// benchKeys is how many keys Put and Get spread over.
const benchKeys = 1000

// benchOps are the shared benchmarks:
//
//   - Put: overwrite one of 1,000 keys with a BenchValueSize value;
//   - Get: read one of 1,000 keys holding such values;
//   - PutIfVersion: a compare-and-set write chained on the previous version
//     (needs the CAS group);
//   - List1000: list BenchListSize entries under a prefix, with their
//     values (ListKeys when the backend has no List).
func benchOps() []benchOp {
	value := BenchValue(BenchValueSize)
	names := make([]string, benchKeys)
	for i := range names {
		names[i] = BenchKey(i)
	}
	return []benchOp{
		{"Put", 0, BenchValueSize, func(b *testing.B, s *suite) func(int) error {
			db, ctx := s.store(b), b.Context()
			return func(i int) error { return db.Put(ctx, names[i%benchKeys], value) }
		}},
		{"Get", needRead, BenchValueSize, func(b *testing.B, s *suite) func(int) error {
			db, ctx := s.store(b), b.Context()
			putAll(b, db, names, func(string) []byte { return value })
			return func(i int) error {
				_, err := read(ctx, db, names[i%benchKeys])
				return err
			}
		}},
		{"PutIfVersion", needCAS, BenchValueSize, func(b *testing.B, s *suite) func(int) error {
			db, ctx := s.store(b), b.Context()
			ver, err := db.PutIfAbsent(ctx, BenchKey(0), value)
			if err != nil {
				b.Fatal(err)
			}
			return func(int) (err error) {
				ver, err = db.PutIfVersion(ctx, BenchKey(0), value, ver)
				return err
			}
		}},
		{"List1000", needKeys, 0, func(b *testing.B, s *suite) func(int) error {
			db, ctx := s.store(b), b.Context()
			putAll(b, db, names[:BenchListSize], func(string) []byte { return value })
			if err := db.Put(ctx, "agentkit/v1/other/x", value); err != nil {
				b.Fatal(err)
			}
			return func(int) error {
				n := 0
				if s.caps.List {
					for _, err := range db.List(ctx, BenchListPrefix) {
						if err != nil {
							return err
						}
						n++
					}
				} else {
					for _, err := range db.ListKeys(ctx, BenchListPrefix) {
						if err != nil {
							return err
						}
						n++
					}
				}
				if n != BenchListSize {
					return fmt.Errorf("listed %d entries, want %d", n, BenchListSize)
				}
				return nil
			}
		}},
	}
}

// BenchListPrefix is the prefix List1000 lists: BenchKey's keys share it,
// and one key outside it ("agentkit/v1/other/x") is there to be left out.
const BenchListPrefix = "agentkit/v1/bench/"

// RunBenchmarks runs the shared benchmarks (Put, Get, PutIfVersion,
// List1000; see benchOps) against a fresh namespace each. To compare a
// driver with its raw client, use RunPaired.
func RunBenchmarks(b *testing.B, h Harness) {
	if h.NewNamespace == nil {
		b.Fatal("kvtest: Harness.NewNamespace is nil")
	}
	s := newSuite(b, h)
	for _, op := range benchOps() {
		b.Run(op.name, func(b *testing.B) {
			if !s.has(op.needs) {
				b.Skipf("the backend has %s; %s needs %s", s.caps, op.name, op.needs)
			}
			do := op.setup(b, s)
			if op.bytes > 0 {
				b.SetBytes(op.bytes)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := do(i); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// Raw is a driver's raw-client reference for RunPaired: for each shared
// benchmark, a function that prepares the same data through the raw client
// alone (on a namespace of its own) and returns the same work done the best
// way that client allows, called with the iteration number. A nil field
// leaves its benchmark unpaired (it is not run).
type Raw struct {
	Put, Get, PutIfVersion, List1000 func(b *testing.B) func(i int) error
}

func (r Raw) op(name string) func(b *testing.B) func(int) error {
	switch name {
	case "Put":
		return r.Put
	case "Get":
		return r.Get
	case "PutIfVersion":
		return r.PutIfVersion
	case "List1000":
		return r.List1000
	}
	return nil
}

// RunPaired runs each shared benchmark paired with raw's reference: one
// loop times a driver operation and a raw operation alternately (the
// driver first on even iterations, raw first on odd ones), so drift in the
// machine or the server hits both sides alike, and reports the mean time
// of each (driver-ns/op, raw-ns/op) and their ratio (driver/raw). With
// -count N, benchstat prints the median of each across the runs:
//
//	go test -run '^$' -bench Paired -count 10 ./kv/pgkv/ > pg.txt && benchstat pg.txt
func RunPaired(b *testing.B, h Harness, raw Raw) {
	if h.NewNamespace == nil {
		b.Fatal("kvtest: Harness.NewNamespace is nil")
	}
	s := newSuite(b, h)
	for _, op := range benchOps() {
		rawOp := raw.op(op.name)
		if rawOp == nil || !s.has(op.needs) {
			continue
		}
		b.Run(op.name, func(b *testing.B) {
			pairLoop(b, op.setup(b, s), rawOp(b))
		})
	}
}

// PairLoop times driver and raw alternately inside one loop, as RunPaired
// does, for a driver's own paired benchmarks.
func PairLoop(b *testing.B, driver, raw func(i int) error) { pairLoop(b, driver, raw) }

func pairLoop(b *testing.B, driver, raw func(i int) error) {
	var dt, rt time.Duration
	timed := func(f func(int) error, i int) time.Duration {
		t0 := time.Now()
		if err := f(i); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			dt += timed(driver, i)
			rt += timed(raw, i)
		} else {
			rt += timed(raw, i)
			dt += timed(driver, i)
		}
		i++
	}
	if i == 0 || rt == 0 {
		return
	}
	b.ReportMetric(float64(dt.Nanoseconds())/float64(i), "driver-ns/op")
	b.ReportMetric(float64(rt.Nanoseconds())/float64(i), "raw-ns/op")
	b.ReportMetric(float64(dt)/float64(rt), "driver/raw")
}
