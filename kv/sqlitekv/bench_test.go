package sqlitekv

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentkit/kv"
	"agentkit/kv/kvtest"
)

// BenchmarkSQLite runs the shared benchmarks for each synchronous setting,
// with two references beside them:
//
//   - RawUpsert: a plain database/sql UPSERT on the same driver, file
//     system and settings (WAL, the same synchronous, one connection,
//     autocommit, a table of the same shape), the reference the driver's
//     Put is measured against. Its version column takes the loop counter:
//     a reference writing identical bytes to an unchanged row would cost
//     next to nothing (SQLite skips rewriting an identical row, and the
//     benchmarks' value never changes), while every driver write changes
//     its row. The driver's Put also draws the version from the counter
//     row in kv_meta, in the same statement.
//   - PairedPutVsRaw: a driver Put and a raw UPSERT (on two files of the
//     same disk) in turn in one loop, reporting the time of each and their
//     ratio. On a disk shared with other work fsync latency drifts by
//     several times within a minute; pairing makes both sides see the same
//     drift, so the ratio holds where the separate figures do not.
//
// Every sub-benchmark starts with sync(2): on ext4 an fsync also writes
// out other dirty data, so without it a durable benchmark run after the
// normal ones would pay for their unsynced WAL pages. Run full and normal
// in separate invocations (-bench 'SQLite/full') for the same reason.
func BenchmarkSQLite(b *testing.B) {
	for _, mode := range []Synchronous{SyncFull, SyncNormal} {
		b.Run(string(mode), func(b *testing.B) {
			opts := &Options{Synchronous: mode}
			h := kvtest.Harness{
				Shared: true,
				NewNamespace: func(t testing.TB) kvtest.Opener {
					unix.Sync()
					path := filepath.Join(t.TempDir(), "kv.db") // the real disk
					return func(t testing.TB) *kv.DB {
						db, err := Open(context.Background(), path, opts)
						if err != nil {
							t.Fatal(err)
						}
						return db
					}
				},
			}
			kvtest.RunBenchmarks(b, h)
			b.Run("Paired", func(b *testing.B) { kvtest.RunPaired(b, h, rawSQLite(mode)) })
			b.Run("RawUpsert", func(b *testing.B) {
				raw := newRawUpsert(b, mode)
				unix.Sync()
				b.SetBytes(kvtest.BenchValueSize)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					raw.put(b, i)
					i++
				}
			})
			b.Run("PairedPutVsRaw", func(b *testing.B) {
				db, err := Open(context.Background(), filepath.Join(b.TempDir(), "kv.db"), opts)
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				raw := newRawUpsert(b, mode)
				value := kvtest.BenchValue(kvtest.BenchValueSize)
				ctx := context.Background()
				unix.Sync()
				var putTime, rawTime time.Duration
				i := 0
				for b.Loop() {
					t0 := time.Now()
					if err := db.Put(ctx, raw.keys[i%len(raw.keys)], value); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					raw.put(b, i)
					putTime += t1.Sub(t0)
					rawTime += time.Since(t1)
					i++
				}
				b.ReportMetric(float64(putTime.Nanoseconds())/float64(i), "put-ns")
				b.ReportMetric(float64(rawTime.Nanoseconds())/float64(i), "raw-ns")
				b.ReportMetric(float64(putTime)/float64(rawTime), "put/raw")
			})
		})
	}
}

// rawSQLite is the reference for kvtest.RunPaired: database/sql on the
// same driver, file system and settings, on a table of the driver's shape,
// one prepared statement an operation (the version supplied by the loop
// counter where the driver draws it from its counter row).
func rawSQLite(mode Synchronous) kvtest.Raw {
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	prepare := func(b *testing.B, r *rawUpsert, q string) *sql.Stmt {
		st, err := r.db.PrepareContext(b.Context(), q)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	}
	filled := func(b *testing.B, n int) *rawUpsert {
		r := newRawUpsert(b, mode)
		for i := range n {
			r.put(b, i)
		}
		unix.Sync()
		return r
	}
	return kvtest.Raw{
		Put: func(b *testing.B) func(int) error {
			r := newRawUpsert(b, mode)
			unix.Sync()
			ctx := b.Context() // as the driver's side gets: database/sql watches it
			return func(i int) error {
				_, err := r.st.ExecContext(ctx, r.keys[i%len(r.keys)], value, i)
				return err
			}
		},
		Get: func(b *testing.B) func(int) error {
			r := filled(b, 1000)
			get := prepare(b, r, `SELECT value, version FROM kv WHERE key = ?1`)
			ctx := b.Context()
			return func(i int) error {
				var v []byte
				var ver int64
				return get.QueryRowContext(ctx, r.keys[i%len(r.keys)]).Scan(&v, &ver)
			}
		},
		PutIfVersion: func(b *testing.B) func(int) error {
			r := filled(b, 1)
			upd := prepare(b, r, `UPDATE kv SET value = ?2, version = ?3 WHERE key = ?1 AND version = ?4 RETURNING version`)
			ver := int64(0)
			ctx := b.Context()
			return func(i int) error {
				return upd.QueryRowContext(ctx, r.keys[0], value, ver+1, ver).Scan(&ver)
			}
		},
		List1000: func(b *testing.B) func(int) error {
			r := filled(b, kvtest.BenchListSize)
			if _, err := r.db.Exec(`INSERT INTO kv VALUES ('agentkit/v1/other/x', ?1, 0)`, value); err != nil {
				b.Fatal(err)
			}
			list := prepare(b, r, `SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key`)
			ctx := b.Context()
			return func(int) error {
				rows, err := list.QueryContext(ctx, kvtest.BenchListPrefix, "agentkit/v1/bench0")
				if err != nil {
					return err
				}
				defer rows.Close()
				// Collected, as the driver's listing and pgkv's raw
				// reference collect theirs.
				var out []kv.Entry
				for rows.Next() {
					var e kv.Entry
					if err := rows.Scan(&e.Key, &e.Value); err != nil {
						return err
					}
					out = append(out, e)
				}
				if len(out) != kvtest.BenchListSize {
					return fmt.Errorf("listed %d rows, want %d", len(out), kvtest.BenchListSize)
				}
				return rows.Err()
			}
		},
	}
}

// rawUpsert is the reference: a table like the driver's, written with one
// prepared UPSERT whose version is supplied by the caller.
type rawUpsert struct {
	db    *sql.DB
	st    *sql.Stmt
	keys  []string
	value []byte
}

func newRawUpsert(b *testing.B, mode Synchronous) *rawUpsert {
	path := filepath.Join(b.TempDir(), "raw.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=5000&_journal_mode=WAL&_synchronous="+strings.ToUpper(string(mode)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE kv (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL, version INTEGER NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	st, err := db.PrepareContext(ctx, `INSERT INTO kv (key, value, version) VALUES (?1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value, version = excluded.version`)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	r := &rawUpsert{db: db, st: st, keys: make([]string, 1000), value: kvtest.BenchValue(kvtest.BenchValueSize)}
	for i := range r.keys {
		r.keys[i] = kvtest.BenchKey(i)
	}
	return r
}

func (r *rawUpsert) put(b *testing.B, i int) {
	if _, err := r.st.Exec(r.keys[i%len(r.keys)], r.value, i); err != nil {
		b.Fatal(err)
	}
}
