package natskv_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentkit/kv/kvtest"
	"agentkit/kv/natskv"
)

// BenchmarkNATS runs the shared benchmarks through the driver
// (impl=driver) and the same operations through jetstream directly
// (impl=raw), on the same server with the same payloads, so
//
//	go test -run '^$' -bench NATS -count 6 ./kv/natskv/ | tee nats.txt
//	benchstat -col /impl nats.txt
//
// shows the driver's overhead as a ratio.
func BenchmarkNATS(b *testing.B) {
	b.Run("impl=driver", func(b *testing.B) {
		kvtest.RunBenchmarks(b, harness(b))
	})
	b.Run("impl=raw", benchRaw)
}

// rawBucket opens a fresh bucket through the driver (which creates it the
// same way for both) and returns jetstream's handle on it.
func rawBucket(b *testing.B) jetstream.KeyValue {
	db := namespace(b)(b)
	b.Cleanup(func() { db.Close() })
	return db.Backend().(*natskv.Store).KeyValue()
}

func benchRaw(b *testing.B) {
	ctx := context.Background()
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000

	b.Run("Put", func(b *testing.B) {
		bucket := rawBucket(b)
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := bucket.Put(ctx, kvtest.BenchKey(i%keys), value); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Get", func(b *testing.B) {
		bucket := rawBucket(b)
		for i := range keys {
			if _, err := bucket.Put(ctx, kvtest.BenchKey(i), value); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := bucket.Get(ctx, kvtest.BenchKey(i%keys)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("PutIfVersion", func(b *testing.B) {
		bucket := rawBucket(b)
		rev, err := bucket.Create(ctx, kvtest.BenchKey(0), value)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		for b.Loop() {
			if rev, err = bucket.Update(ctx, kvtest.BenchKey(0), value, rev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("List1000", func(b *testing.B) {
		bucket := rawBucket(b)
		for i := range kvtest.BenchListSize {
			if _, err := bucket.Put(ctx, kvtest.BenchKey(i), value); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := bucket.Put(ctx, "agentkit/v1/other/x", value); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			lister, err := bucket.ListKeys(ctx)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for k := range lister.Keys() {
				if !strings.HasPrefix(k, "agentkit/v1/bench/") {
					continue
				}
				if _, err := bucket.Get(ctx, k); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if n != kvtest.BenchListSize {
				b.Fatalf("listed %d keys, want %d", n, kvtest.BenchListSize)
			}
		}
	})
}
