package pgkv

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"agentkit/kv/internal/driverkit"
	"agentkit/kv/kvtest"
)

// BenchmarkPostgres runs the shared benchmarks paired with a bare pgx pool
// doing the same work with the same SQL on a table of the driver's shape
// (kvtest.RunPaired: one loop alternates a driver operation and a raw one
// and reports driver-ns/op, raw-ns/op and driver/raw). The raw listing is
// one range SELECT of the whole prefix, without paging.
//
//	go test -run '^$' -bench Postgres -count 10 ./kv/pgkv/ > pg.txt && benchstat pg.txt
func BenchmarkPostgres(b *testing.B) {
	kvtest.RunPaired(b, harness(false), rawPostgres())
}

// rawPostgres is the reference: pgx alone, with the driver's statements.
func rawPostgres() kvtest.Raw {
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	setup := func(b *testing.B) (*pgxpool.Pool, statements, string) {
		table := newTable(b)
		openTable(b, table, nil).Close()                          // creates the table
		pool, err := pgxpool.New(context.Background(), server(b)) // the driver's durability: harness(false)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		return pool, newStatements(table), table
	}
	return kvtest.Raw{
		Put: func(b *testing.B) func(int) error {
			pool, sql, _ := setup(b)
			ctx := b.Context()
			return func(i int) error {
				_, err := pool.Exec(ctx, sql.put, kvtest.BenchKey(i%keys), value)
				return err
			}
		},
		Get: func(b *testing.B) func(int) error {
			pool, sql, _ := setup(b)
			ctx := b.Context()
			fill(b, pool, sql, keys, value)
			return func(i int) error {
				var v []byte
				return pool.QueryRow(ctx, sql.get, kvtest.BenchKey(i%keys)).Scan(&v)
			}
		},
		PutIfVersion: func(b *testing.B) func(int) error {
			pool, sql, _ := setup(b)
			ctx := b.Context()
			var ver int64
			if err := pool.QueryRow(ctx, sql.putIfAbsent, kvtest.BenchKey(0), value).Scan(&ver); err != nil {
				b.Fatal(err)
			}
			return func(int) error {
				return pool.QueryRow(ctx, sql.putIfVersion, kvtest.BenchKey(0), value, ver).Scan(&ver)
			}
		},
		List1000: func(b *testing.B) func(int) error {
			pool, sql, table := setup(b)
			ctx := b.Context()
			fill(b, pool, sql, kvtest.BenchListSize, value)
			if _, err := pool.Exec(ctx, sql.put, "agentkit/v1/other/x", value); err != nil {
				b.Fatal(err)
			}
			upper, _ := driverkit.PrefixEnd(kvtest.BenchListPrefix)
			q := "SELECT key, value FROM " + pgx.Identifier{table}.Sanitize() + " WHERE key >= $1 AND key < $2 ORDER BY key"
			type entry struct {
				key   string
				value []byte
			}
			return func(int) error {
				rows, err := pool.Query(ctx, q, kvtest.BenchListPrefix, upper)
				if err != nil {
					return err
				}
				var out []entry
				var e entry
				if _, err := pgx.ForEachRow(rows, []any{&e.key, &e.value}, func() error {
					out = append(out, e)
					return nil
				}); err != nil {
					return err
				}
				if len(out) != kvtest.BenchListSize {
					return fmt.Errorf("listed %d rows, want %d", len(out), kvtest.BenchListSize)
				}
				return nil
			}
		},
	}
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
