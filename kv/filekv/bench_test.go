package filekv

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentkit/kv"
	"agentkit/kv/kvtest"
)

// BenchmarkFile runs the shared benchmarks and, beside them, two references
// on the same disk:
//
//   - RawFloor: the same durable overwrite done by hand (temporary file,
//     write, fsync, rename, fsync the folder) on the same paths, the least
//     any crash-safe file store can cost. Compare Put with it.
//   - PairedPutVsRaw: a driver Put and a RawFloor write in turn in one loop,
//     reporting the time of each (put-ns, raw-ns) and their ratio. On a
//     disk shared with other work, fsync latency drifts by several times
//     within a minute; pairing makes both sides see the same drift, so the
//     ratio holds where the separate figures do not.
//
// Each sub-benchmark starts with sync(2), so none pays for dirty pages
// another left behind (on ext4 an fsync writes out more than its own file).
func BenchmarkFile(b *testing.B) {
	kvtest.RunBenchmarks(b, kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener {
			unix.Sync()
			dir := t.TempDir() // the real disk, like RawFloor
			return func(t testing.TB) *kv.DB {
				db, err := Open(t.Context(), dir)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	})
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	b.Run("RawFloor", func(b *testing.B) {
		raw := newRawFloor(b.TempDir(), keys)
		unix.Sync()
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if err := raw.write(i, value); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("PairedPutVsRaw", func(b *testing.B) {
		db, err := Open(b.Context(), b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		raw := newRawFloor(b.TempDir(), keys)
		unix.Sync()
		var putTime, rawTime time.Duration
		i := 0
		for b.Loop() {
			t0 := time.Now()
			if err := db.Put(b.Context(), kvtest.BenchKey(i%keys), value); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := raw.write(i, value); err != nil {
				b.Fatal(err)
			}
			putTime += t1.Sub(t0)
			rawTime += time.Since(t1)
			i++
		}
		b.ReportMetric(float64(putTime.Nanoseconds())/float64(i), "put-ns")
		b.ReportMetric(float64(rawTime.Nanoseconds())/float64(i), "raw-ns")
		b.ReportMetric(float64(putTime)/float64(rawTime), "put/raw")
	})
}

// rawFloor writes files durably by hand at the paths the driver would use
// for kvtest.BenchKey keys.
type rawFloor struct {
	dir   string
	paths []string
}

func newRawFloor(dir string, keys int) *rawFloor {
	r := &rawFloor{dir: dir, paths: make([]string, keys)}
	for i := range r.paths {
		r.paths[i] = filepath.Join(dir, filepath.FromSlash(kvtest.BenchKey(i)))
	}
	return r
}

// write overwrites the i-th path (modulo the number of keys). Like the
// driver, and like kvtest's Put benchmark, which starts from an empty
// store, the first write of each path makes its folder and syncs the folder
// above it.
func (r *rawFloor) write(i int, value []byte) error {
	path := r.paths[i%len(r.paths)]
	if i < len(r.paths) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		if err := rawSyncDir(filepath.Dir(filepath.Dir(path))); err != nil {
			return err
		}
	}
	f, err := os.CreateTemp(r.dir, ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(value); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return rawSyncDir(filepath.Dir(path))
}

func rawSyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
