package memory

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkAppend measures appends per second through a Journal beside raw
// appends of the same bytes to a plain file, in one run so the ratio is
// meaningful. Sub-benchmarks are named impl=X so benchstat can put them in
// columns against the first, RawBufio:
//
//   - RawBufio: the line already marshalled, through a bufio.Writer on an
//     os.File (truncated every 4 MiB to bound disk use, like a rotation).
//   - Journal: the default Journal (marshal, flock, stat, one write call;
//     rotation at the default 4 MiB included).
//   - JournalSync: the same with JournalOptions.Sync (fsync per record).
//   - RawWrite: one unbuffered write call per line to an O_APPEND file.
//
// Run: go test -run '^$' -bench Append -count 6 ./memory/ > bench.txt
// and benchstat -col /impl bench.txt
func BenchmarkAppend(b *testing.B) {
	rec := turnRecord("5f0c2a9e-7d1b-4c43-9a6e-2b8f1e0d7c35", 1)
	line, err := rec.Line()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("impl=RawBufio", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "raw.jsonl"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		w := bufio.NewWriter(f)
		b.SetBytes(int64(len(line)))
		var size int64
		for b.Loop() {
			if _, err := w.Write(line); err != nil {
				b.Fatal(err)
			}
			if size += int64(len(line)); size >= DefaultRotateSize {
				if err := w.Flush(); err != nil {
					b.Fatal(err)
				}
				if err := f.Truncate(0); err != nil {
					b.Fatal(err)
				}
				if _, err := f.Seek(0, 0); err != nil {
					b.Fatal(err)
				}
				size = 0
			}
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
	})
	for _, sync := range []bool{false, true} {
		name := "impl=Journal"
		if sync {
			name = "impl=JournalSync"
		}
		b.Run(name, func(b *testing.B) {
			j, err := NewJournal(b.TempDir(), &JournalOptions{Sync: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				if err := j.Append(ctx, rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("impl=RawWrite", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.SetBytes(int64(len(line)))
		var size int64
		for b.Loop() {
			if _, err := f.Write(line); err != nil {
				b.Fatal(err)
			}
			if size += int64(len(line)); size >= DefaultRotateSize {
				if err := f.Truncate(0); err != nil {
					b.Fatal(err)
				}
				size = 0
			}
		}
	})
}
