package natskv_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentkit/kv/kvtest"
	"agentkit/kv/natskv"
)

// BenchmarkNATS runs the shared benchmarks paired with jetstream alone
// doing the same work on the same server (kvtest.RunPaired: one loop
// alternates a driver operation and a raw one and reports driver-ns/op,
// raw-ns/op and driver/raw). The raw listing is the best jetstream offers:
// keys stored as dot-separated subjects (what the driver's key mapping
// makes of these keys) and one filtered watcher, "agentkit.v1.bench.>",
// reading every value until the end-of-initial-values marker, unsorted.
//
// ListFloor measures what the contract adds to that raw listing whatever
// the driver does: the two reads of the stream's state that tell whether
// the consumer saw every key (see Store.scan), and sorting by key. It
// pairs the raw listing with itself plus those steps, so its driver/raw
// column is the floor of the driver's List1000 ratio.
//
//	go test -run '^$' -bench NATS -count 10 ./kv/natskv/ > nats.txt && benchstat nats.txt
func BenchmarkNATS(b *testing.B) {
	raw := rawNATS()
	kvtest.RunPaired(b, harness(b), raw)
	b.Run("ListFloor", func(b *testing.B) {
		list := raw.List1000(b)
		bucket := filledBucket(b)
		floor := func(i int) error {
			if _, err := bucket.Status(ctx); err != nil {
				return err
			}
			var keys []string
			w, err := bucket.WatchFiltered(ctx, []string{subject(kvtest.BenchListPrefix) + ">"})
			if err != nil {
				return err
			}
			for e := range w.Updates() {
				if e == nil {
					break
				}
				keys = append(keys, e.Key())
			}
			w.Stop()
			if _, err := bucket.Status(ctx); err != nil {
				return err
			}
			slices.Sort(keys)
			if len(keys) != kvtest.BenchListSize {
				return fmt.Errorf("listed %d keys, want %d", len(keys), kvtest.BenchListSize)
			}
			return nil
		}
		kvtest.PairLoop(b, floor, list)
	})
}

var ctx = context.Background()

// rawBucket opens a fresh bucket through the driver (which creates it the
// same way for both) and returns jetstream's handle on it.
func rawBucket(b *testing.B) jetstream.KeyValue {
	db := namespace(b)(b)
	b.Cleanup(func() { db.Close() })
	return db.Backend().(*natskv.Store).KeyValue()
}

// subject spells a benchmark key as a JetStream key the way a jetstream
// user would: its '/'-separated segments as dot-separated tokens.
func subject(key string) string { return strings.ReplaceAll(key, "/", ".") }

// filledBucket is a fresh bucket holding the listing's keys and one key
// outside its prefix, as kvtest's List1000 prepares.
func filledBucket(b *testing.B) jetstream.KeyValue {
	bucket := rawBucket(b)
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	for i := range kvtest.BenchListSize {
		if _, err := bucket.Put(ctx, subject(kvtest.BenchKey(i)), value); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := bucket.Put(ctx, subject("agentkit/v1/other/x"), value); err != nil {
		b.Fatal(err)
	}
	return bucket
}

func rawNATS() kvtest.Raw {
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	fill := func(b *testing.B, bucket jetstream.KeyValue, n int) {
		for i := range n {
			if _, err := bucket.Put(ctx, subject(kvtest.BenchKey(i)), value); err != nil {
				b.Fatal(err)
			}
		}
	}
	return kvtest.Raw{
		Put: func(b *testing.B) func(int) error {
			bucket := rawBucket(b)
			return func(i int) error {
				_, err := bucket.Put(ctx, subject(kvtest.BenchKey(i%keys)), value)
				return err
			}
		},
		Get: func(b *testing.B) func(int) error {
			bucket := rawBucket(b)
			fill(b, bucket, keys)
			return func(i int) error {
				_, err := bucket.Get(ctx, subject(kvtest.BenchKey(i%keys)))
				return err
			}
		},
		PutIfVersion: func(b *testing.B) func(int) error {
			bucket := rawBucket(b)
			rev, err := bucket.Create(ctx, subject(kvtest.BenchKey(0)), value)
			if err != nil {
				b.Fatal(err)
			}
			return func(int) (err error) {
				rev, err = bucket.Update(ctx, subject(kvtest.BenchKey(0)), value, rev)
				return err
			}
		},
		List1000: func(b *testing.B) func(int) error {
			bucket := filledBucket(b)
			filter := subject(kvtest.BenchListPrefix) + ">"
			return func(int) error {
				w, err := bucket.WatchFiltered(ctx, []string{filter})
				if err != nil {
					return err
				}
				defer w.Stop()
				n := 0
				for e := range w.Updates() {
					if e == nil {
						break // the initial values are all in
					}
					if e.Operation() == jetstream.KeyValuePut && len(e.Value()) > 0 {
						n++
					}
				}
				if n != kvtest.BenchListSize {
					return fmt.Errorf("listed %d entries, want %d", n, kvtest.BenchListSize)
				}
				return nil
			}
		},
	}
}
