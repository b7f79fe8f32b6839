package pgkv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"agentkit/kv/internal/driverkit"
	"agentkit/kv/kvtest"
)

// BenchmarkPostgres runs the shared benchmarks through the driver
// (impl=kv) and the same operations on a bare pgx pool with the same SQL
// (impl=raw), so benchstat -col /impl shows the driver's overhead:
//
//	go test -run '^$' -bench Postgres -count 6 ./kv/pgkv/ > pg.txt
//	benchstat -col /impl pg.txt
func BenchmarkPostgres(b *testing.B) {
	b.Run("impl=kv", func(b *testing.B) { kvtest.RunBenchmarks(b, harness(false)) })
	b.Run("impl=raw", benchmarkRaw)
}

// benchmarkRaw is the reference: pgx alone, on a table of the driver's
// shape, with the driver's statements.
func benchmarkRaw(b *testing.B) {
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	setup := func(b *testing.B) (*pgxpool.Pool, statements, string) {
		table := newTable(b)
		openTable(b, table, nil).Close() // creates the table
		pool, err := pgxpool.New(context.Background(), server(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		return pool, newStatements(table), table
	}
	b.Run("Put", func(b *testing.B) {
		pool, sql, _ := setup(b)
		ctx := b.Context()
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := pool.Exec(ctx, sql.put, kvtest.BenchKey(i%keys), value); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("Get", func(b *testing.B) {
		pool, sql, _ := setup(b)
		ctx := b.Context()
		fill(b, pool, sql, keys, value)
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			var v []byte
			if err := pool.QueryRow(ctx, sql.get, kvtest.BenchKey(i%keys)).Scan(&v); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("PutIfVersion", func(b *testing.B) {
		pool, sql, _ := setup(b)
		ctx := b.Context()
		var ver int64
		if err := pool.QueryRow(ctx, sql.putIfAbsent, kvtest.BenchKey(0), value).Scan(&ver); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		for b.Loop() {
			if err := pool.QueryRow(ctx, sql.putIfVersion, kvtest.BenchKey(0), value, ver).Scan(&ver); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("List1000", func(b *testing.B) {
		pool, sql, table := setup(b)
		ctx := b.Context()
		fill(b, pool, sql, kvtest.BenchListSize, value)
		if _, err := pool.Exec(ctx, sql.put, "agentkit/v1/other/x", value); err != nil {
			b.Fatal(err)
		}
		const prefix = "agentkit/v1/bench/"
		upper, _ := driverkit.PrefixEnd(prefix)
		// One range select of the whole prefix, no paging.
		q := "SELECT key, value FROM " + pgx.Identifier{table}.Sanitize() + " WHERE key >= $1 AND key < $2 ORDER BY key"
		type entry struct {
			key   string
			value []byte
		}
		b.ReportAllocs()
		for b.Loop() {
			rows, err := pool.Query(ctx, q, prefix, upper)
			if err != nil {
				b.Fatal(err)
			}
			var out []entry
			var e entry
			_, err = pgx.ForEachRow(rows, []any{&e.key, &e.value}, func() error {
				out = append(out, e)
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if len(out) != kvtest.BenchListSize {
				b.Fatalf("listed %d rows, want %d", len(out), kvtest.BenchListSize)
			}
		}
	})
}

// fill writes the first n benchmark keys in one transaction.
func fill(b *testing.B, pool *pgxpool.Pool, sql statements, n int, value []byte) {
	err := pgx.BeginFunc(b.Context(), pool, func(tx pgx.Tx) error {
		for i := range n {
			if _, err := tx.Exec(b.Context(), sql.put, kvtest.BenchKey(i), value); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
