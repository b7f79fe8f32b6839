package rediskv

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"agentkit/kv/kvtest"
)

// BenchmarkRedis runs the shared benchmarks paired with go-redis alone
// doing the same work (kvtest.RunPaired: one loop alternates a driver
// operation and a raw one and reports driver-ns/op, raw-ns/op and
// driver/raw). The raw side keeps the driver's layout: the write scripts
// sent with EVALSHA, HGET, and for the listing the best a go-redis user
// does, one BYLEX range read then one pipeline of HGETs. HSetFloor is the
// least a Redis write costs, a lone HSET that keeps neither version nor
// index. ListCPU measures where a listing spends CPU, on the server and in
// this process, which wall-clock time on a busy machine hides.
//
//	go test -run '^$' -bench Redis -count 10 ./kv/rediskv/ > redis.txt && benchstat redis.txt
func BenchmarkRedis(b *testing.B) {
	kvtest.RunPaired(b, harness(), rawRedis())
	b.Run("ListCPU", benchListCPU)
	b.Run("HSetFloor", func(b *testing.B) {
		prefix := newPrefixChecked(b, false)
		c := raw(b)
		value := kvtest.BenchValue(kvtest.BenchValueSize)
		ctx := b.Context()
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := c.HSet(ctx, prefix+"d:"+kvtest.BenchKey(i%1000), "v", value).Err(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// rawRedis is the reference: go-redis alone, on the driver's layout.
func rawRedis() kvtest.Raw {
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	setup := func(b *testing.B) (*redis.Client, string) {
		c, prefix := raw(b), newPrefix(b)
		for _, s := range []*redis.Script{putScript, putIfAbsentScript, putIfVersionScript} {
			if err := s.Load(b.Context(), c).Err(); err != nil {
				b.Fatal(err)
			}
		}
		return c, prefix
	}
	put := func(b *testing.B, c *redis.Client, prefix, key string) string {
		r, err := c.EvalSha(b.Context(), putScript.Hash(), []string{prefix + "d:" + key, prefix + "idx", prefix + "seq"}, value, key, nonce()).Text()
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	return kvtest.Raw{
		Put: func(b *testing.B) func(int) error {
			c, prefix := setup(b)
			ctx := b.Context()
			return func(i int) error {
				key := kvtest.BenchKey(i % keys)
				return c.EvalSha(ctx, putScript.Hash(), []string{prefix + "d:" + key, prefix + "idx", prefix + "seq"}, value, key, nonce()).Err()
			}
		},
		Get: func(b *testing.B) func(int) error {
			c, prefix := setup(b)
			for i := range keys {
				put(b, c, prefix, kvtest.BenchKey(i))
			}
			ctx := b.Context()
			return func(i int) error {
				return c.HGet(ctx, prefix+"d:"+kvtest.BenchKey(i%keys), "v").Err()
			}
		},
		PutIfVersion: func(b *testing.B) func(int) error {
			c, prefix := setup(b)
			key := kvtest.BenchKey(0)
			ver := put(b, c, prefix, key)
			hashes := []string{prefix + "d:" + key, prefix + "idx", prefix + "seq"}
			ctx := b.Context()
			return func(int) (err error) {
				ver, err = c.EvalSha(ctx, putIfVersionScript.Hash(), hashes, value, key, nonce(), ver).Text()
				return err
			}
		},
		List1000: func(b *testing.B) func(int) error {
			c, prefix := setup(b)
			for i := range kvtest.BenchListSize {
				put(b, c, prefix, kvtest.BenchKey(i))
			}
			put(b, c, prefix, "agentkit/v1/other/x")
			ctx := b.Context()
			const lo, hi = "[" + kvtest.BenchListPrefix, "(agentkit/v1/bench0"
			return func(int) error {
				members, err := c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: prefix + "idx", Start: lo, Stop: hi, ByLex: true}).Result()
				if err != nil {
					return err
				}
				cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, m := range members {
						p.HGet(ctx, prefix+"d:"+m, "v")
					}
					return nil
				})
				if err != nil {
					return err
				}
				n := 0
				for _, cmd := range cmds {
					if v, err := cmd.(*redis.StringCmd).Bytes(); err == nil && v != nil {
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

// benchListCPU lists 1,000 entries through the driver and through raw
// go-redis, alternately, and reports the CPU time each costs the Redis
// server (INFO cpu, so other clients of a shared server add noise) and
// this process (getrusage), per listing.
func benchListCPU(b *testing.B) {
	db := harness().NewNamespace(b)(b)
	b.Cleanup(func() { db.Close() })
	ctx := b.Context()
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	for i := range kvtest.BenchListSize {
		if err := db.Put(ctx, kvtest.BenchKey(i), value); err != nil {
			b.Fatal(err)
		}
	}
	rawList := rawRedis().List1000(b)
	c := raw(b)
	var srv, cli [2]time.Duration // driver, raw
	n := 0
	for b.Loop() {
		for k := range 2 {
			side := (n + k) % 2
			s0, c0 := serverCPU(b, c), processCPU()
			if side == 0 {
				for _, err := range db.List(ctx, kvtest.BenchListPrefix) {
					if err != nil {
						b.Fatal(err)
					}
				}
			} else if err := rawList(n); err != nil {
				b.Fatal(err)
			}
			srv[side] += serverCPU(b, c) - s0
			cli[side] += processCPU() - c0
		}
		n++
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(per(srv[0]), "driver-server-µs/op")
	b.ReportMetric(per(cli[0]), "driver-client-µs/op")
	b.ReportMetric(per(srv[1]), "raw-server-µs/op")
	b.ReportMetric(per(cli[1]), "raw-client-µs/op")
}

// serverCPU returns the Redis server's CPU time so far.
func serverCPU(b *testing.B, c *redis.Client) time.Duration {
	info, err := c.Info(b.Context(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// processCPU returns this process's CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
