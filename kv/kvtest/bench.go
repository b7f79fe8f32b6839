package kvtest

import (
	"fmt"
	"testing"
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

// RunBenchmarks runs the shared benchmarks against a fresh namespace each:
//
//   - Put: overwrite one of 1,000 keys with a BenchValueSize value;
//   - Get: read one of 1,000 keys holding such values;
//   - PutIfVersion: a compare-and-set write chained on the previous version
//     (needs the CAS group);
//   - List1000: list BenchListSize entries under a prefix, with their
//     values (ListKeys when the backend has no List).
//
// A driver compares itself with its raw client by running a benchmark of
// the client beside these in the same process, with BenchValue and BenchKey.
func RunBenchmarks(b *testing.B, h Harness) {
	if h.NewNamespace == nil {
		b.Fatal("kvtest: Harness.NewNamespace is nil")
	}
	s := newSuite(b, h)
	value := BenchValue(BenchValueSize)
	const keys = 1000
	names := make([]string, keys)
	for i := range names {
		names[i] = BenchKey(i)
	}
	b.Run("Put", func(b *testing.B) {
		db := s.store(b)
		ctx := b.Context()
		b.SetBytes(BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := db.Put(ctx, names[i%keys], value); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Get", func(b *testing.B) {
		if !s.has(needRead) {
			b.Skipf("the backend has %s; Get needs Get or GetWithVersion", s.caps)
		}
		db := s.store(b)
		ctx := b.Context()
		putAll(b, db, names, func(string) []byte { return value })
		b.SetBytes(BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := read(ctx, db, names[i%keys]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("PutIfVersion", func(b *testing.B) {
		if !s.caps.CAS {
			b.Skipf("the backend has %s; PutIfVersion needs the CAS group", s.caps)
		}
		db := s.store(b)
		ctx := b.Context()
		ver, err := db.PutIfAbsent(ctx, BenchKey(0), value)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(BenchValueSize)
		b.ReportAllocs()
		for b.Loop() {
			if ver, err = db.PutIfVersion(ctx, BenchKey(0), value, ver); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("List1000", func(b *testing.B) {
		if !s.has(needKeys) {
			b.Skipf("the backend has %s; List1000 needs List or ListKeys", s.caps)
		}
		db := s.store(b)
		ctx := b.Context()
		putAll(b, db, names[:BenchListSize], func(string) []byte { return value })
		if err := db.Put(ctx, "agentkit/v1/other/x", value); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			if s.caps.List {
				for _, err := range db.List(ctx, "agentkit/v1/bench/") {
					if err != nil {
						b.Fatal(err)
					}
					n++
				}
			} else {
				for _, err := range db.ListKeys(ctx, "agentkit/v1/bench/") {
					if err != nil {
						b.Fatal(err)
					}
					n++
				}
			}
			if n != BenchListSize {
				b.Fatalf("listed %d entries, want %d", n, BenchListSize)
			}
		}
	})
}
