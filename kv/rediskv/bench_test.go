package rediskv

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"agentkit/kv/kvtest"
)

// BenchmarkRedis runs the shared benchmarks through the driver (impl=kv)
// and the same work done with go-redis directly (impl=raw): the driver's
// write scripts sent with EVALSHA, HGET, and a BYLEX range read followed by
// one pipeline of HGETs. impl=hset is the floor for Put, a lone HSET that
// keeps neither version nor index. Compare with:
//
//	go test -run '^$' -bench Redis -count 6 ./kv/rediskv/ > redis.txt
//	benchstat -col /impl redis.txt
func BenchmarkRedis(b *testing.B) {
	b.Run("impl=kv", func(b *testing.B) { kvtest.RunBenchmarks(b, harness()) })
	b.Run("impl=raw", benchmarkRaw)
	b.Run("impl=hset", func(b *testing.B) {
		b.Run("Put", func(b *testing.B) {
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
	})
}

func rawSetup(b *testing.B) (*redis.Client, string) {
	prefix := newPrefix(b)
	return raw(b), prefix
}

// benchmarkRaw is the reference: go-redis alone, on the driver's layout.
func benchmarkRaw(b *testing.B) {
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	put := func(b *testing.B, c *redis.Client, prefix, key string) string {
		r, err := c.EvalSha(b.Context(), putScript.Hash(), []string{prefix + "d:" + key, prefix + "idx", prefix + "seq"}, value, key, nonce()).Text()
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	load := func(b *testing.B, c *redis.Client) {
		for _, s := range []*redis.Script{putScript, putIfAbsentScript, putIfVersionScript} {
			if err := s.Load(b.Context(), c).Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("Put", func(b *testing.B) {
		c, prefix := rawSetup(b)
		load(b, c)
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			put(b, c, prefix, kvtest.BenchKey(i%keys))
			i++
		}
	})
	b.Run("Get", func(b *testing.B) {
		c, prefix := rawSetup(b)
		load(b, c)
		for i := range keys {
			put(b, c, prefix, kvtest.BenchKey(i))
		}
		ctx := b.Context()
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := c.HGet(ctx, prefix+"d:"+kvtest.BenchKey(i%keys), "v").Bytes(); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("PutIfVersion", func(b *testing.B) {
		c, prefix := rawSetup(b)
		load(b, c)
		key := kvtest.BenchKey(0)
		ver := put(b, c, prefix, key)
		keys := []string{prefix + "d:" + key, prefix + "idx", prefix + "seq"}
		ctx := b.Context()
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			ver, err = c.EvalSha(ctx, putIfVersionScript.Hash(), keys, value, key, nonce(), ver).Text()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("List1000", func(b *testing.B) {
		c, prefix := rawSetup(b)
		load(b, c)
		for i := range kvtest.BenchListSize {
			put(b, c, prefix, kvtest.BenchKey(i))
		}
		put(b, c, prefix, "agentkit/v1/other/x")
		ctx := b.Context()
		const lo, hi = "[agentkit/v1/bench/", "(agentkit/v1/bench0"
		b.ReportAllocs()
		for b.Loop() {
			members, err := c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: prefix + "idx", Start: lo, Stop: hi, ByLex: true}).Result()
			if err != nil {
				b.Fatal(err)
			}
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, m := range members {
					p.HGet(ctx, prefix+"d:"+m, "v")
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for _, cmd := range cmds {
				if v, err := cmd.(*redis.StringCmd).Bytes(); err == nil && v != nil {
					n++
				}
			}
			if n != kvtest.BenchListSize {
				b.Fatalf("listed %d entries, want %d", n, kvtest.BenchListSize)
			}
		}
	})
}
