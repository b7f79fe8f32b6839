package turnbench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"agentkit/agent/sessiondb"
	"agentkit/bench/pair"
)

// floor is the five sides of BenchmarkFloor, on files in one folder of
// the same disk, each writing the same bytes (the JSON of one event of the
// runtime, about 400 bytes):
//
//   - fdatasync: the record written in place at offset 0 of a
//     preallocated file, then fdatasync: the least a durable write of a
//     record costs on this disk (no file size, block allocation or time
//     stamp to make durable);
//   - fsync: the same write, then fsync, which also makes the file's
//     modification time durable (a journal commit on ext4). SQLite calls
//     fsync, not fdatasync, on every commit (strace shows it), so this is
//     the floor of any SQLite commit here, and the "write + fsync" floor
//     the target names;
//   - append: the record appended to a file, then fdatasync (the file
//     grows, so the file system journals its new size);
//   - sqlite: one INSERT of the record into a SQLite table with agentkit's
//     durability (WAL, synchronous=FULL, autocommit: one transaction),
//     through a prepared statement on the same SQLite library
//     (modernc.org/sqlite) the runtime uses;
//   - agentkit: the runtime's single event append, what a turn does for
//     every event it records (sessiondb.Record: the event and the
//     session's new row in one transaction of the local session database),
//     encoding the event's JSON included, as a turn encodes it.
type floor struct {
	inPlace, log *os.File
	raw          *sql.DB
	insert       *sql.Stmt
	sessions     *sessiondb.DB
	meta         sessiondb.Meta
	seq          int64
	sample       []byte // what the raw sides write: one event's JSON
}

// openFloor prepares the sides in dir.
func openFloor(ctx context.Context, dir string) (f *floor, err error) {
	f = &floor{}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if f.inPlace, err = os.OpenFile(filepath.Join(dir, "in-place.bin"), os.O_RDWR|os.O_CREATE, 0o644); err != nil {
		return f, err
	}
	// Preallocate and make the size durable, so each write only replaces
	// data.
	if _, err = f.inPlace.Write(make([]byte, 4096)); err != nil {
		return f, err
	}
	if err = f.inPlace.Sync(); err != nil {
		return f, err
	}
	if f.log, err = os.OpenFile(filepath.Join(dir, "append.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err != nil {
		return f, err
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	if f.raw, err = sql.Open("sqlite", "file:"+filepath.Join(dir, "raw.db")+"?"+q.Encode()); err != nil {
		return f, err
	}
	f.raw.SetMaxOpenConns(1)
	if _, err = f.raw.ExecContext(ctx, `CREATE TABLE records (id INTEGER PRIMARY KEY, data BLOB NOT NULL)`); err != nil {
		return f, err
	}
	if f.insert, err = f.raw.PrepareContext(ctx, `INSERT INTO records (id, data) VALUES (?, ?)`); err != nil {
		return f, err
	}
	if f.sessions, err = sessiondb.Open(ctx, filepath.Join(dir, sessionsFile)); err != nil {
		return f, err
	}
	f.meta = newMeta("floor", time.Now())
	if err = f.sessions.Put(ctx, f.meta); err != nil {
		return f, err
	}
	rec, err := record(event(f.meta.ID, 2, time.Now()))
	if err != nil {
		return f, err
	}
	f.sample = rec.Data
	return f, nil
}

// next returns the session's next event record.
func (f *floor) next() (sessiondb.Record, error) {
	f.seq++
	return record(event(f.meta.ID, f.seq, time.Now()))
}

// ops returns the five sides, in the order Loop starts them.
func (f *floor) ops(ctx context.Context) []pair.Op {
	return []pair.Op{
		{Name: "fdatasync", Run: func(int) error {
			if _, err := f.inPlace.WriteAt(f.sample, 0); err != nil {
				return err
			}
			return unix.Fdatasync(int(f.inPlace.Fd()))
		}},
		{Name: "fsync", Run: func(int) error {
			if _, err := f.inPlace.WriteAt(f.sample, 0); err != nil {
				return err
			}
			return f.inPlace.Sync()
		}},
		{Name: "append", Run: func(int) error {
			if _, err := f.log.Write(f.sample); err != nil {
				return err
			}
			return unix.Fdatasync(int(f.log.Fd()))
		}},
		{Name: "sqlite", Run: func(i int) error {
			_, err := f.insert.ExecContext(ctx, i+1, f.sample)
			return err
		}},
		{Name: "agentkit", Run: func(int) error {
			rec, err := f.next()
			if err != nil {
				return err
			}
			next := f.meta
			next.LastSeq, next.UpdatedAt, next.Turns = rec.Seq, rec.At, (rec.Seq-1)/3+1
			if err := f.sessions.Record(ctx, next, rec); err != nil {
				return err
			}
			f.meta = next
			return nil
		}},
	}
}

// groupWriters is how many events the "agentkit16" side appends at once,
// each to a session of its own, as 16 concurrent turns do.
const groupWriters = 16

// groupOp is the "agentkit16" side: groupWriters goroutines each append
// one event to a session of its own (sessiondb.Record) at the same moment;
// the session database's writer commits the ones waiting together (group
// commit). Its time is for all of them; BenchmarkFloor reports the time
// per event.
func (f *floor) groupOp(ctx context.Context) (pair.Op, error) {
	metas := make([]sessiondb.Meta, groupWriters)
	for i := range metas {
		metas[i] = newMeta(fmt.Sprintf("floor-group-%02d", i), time.Now())
		if err := f.sessions.Put(ctx, metas[i]); err != nil {
			return pair.Op{}, err
		}
	}
	return pair.Op{Name: "agentkit16", Run: func(int) error {
		errs := make(chan error, groupWriters)
		for i := range metas {
			go func() {
				m := metas[i]
				rec, err := record(event(m.ID, m.LastSeq+1, time.Now()))
				if err == nil {
					next := m
					next.LastSeq, next.UpdatedAt, next.Turns = rec.Seq, rec.At, (rec.Seq-1)/3+1
					if err = f.sessions.Record(ctx, next, rec); err == nil {
						metas[i] = next
					}
				}
				errs <- err
			}()
		}
		var first error
		for range metas {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}}, nil
}

// Close closes every file.
func (f *floor) Close() error {
	var errs []error
	if f.inPlace != nil {
		errs = append(errs, f.inPlace.Close())
	}
	if f.log != nil {
		errs = append(errs, f.log.Close())
	}
	if f.insert != nil {
		errs = append(errs, f.insert.Close())
	}
	if f.raw != nil {
		errs = append(errs, f.raw.Close())
	}
	if f.sessions != nil {
		errs = append(errs, f.sessions.Close())
	}
	return errors.Join(errs...)
}

// BenchmarkFloor alternates the runtime's single event append with the
// disk's floors (see floor), in one loop, and reports each side's time
// and agentkit/fsync (the target: at most 1.3), agentkit/fdatasync,
// agentkit/sqlite, sqlite/fsync, fsync/fdatasync and append/fdatasync. A
// sixth side, agentkit16, appends 16 events at once to 16 sessions, as 16
// concurrent turns do; agentkit16-per-event/fsync is its time per event
// over the fsync floor (group commit: the 16 share commits).
// Every side writes the same record, the JSON of one event (about 400
// bytes; record-bytes). It starts with sync(2), so other processes' dirty
// pages are not flushed by the first fsyncs.
func BenchmarkFloor(b *testing.B) {
	ctx := b.Context()
	f, err := openFloor(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	group, err := f.groupOp(ctx)
	if err != nil {
		b.Fatal(err)
	}
	unix.Sync()
	t := pair.Loop(b, append(f.ops(ctx), group),
		pair.Ratio{Num: "agentkit", Den: "fsync"},
		pair.Ratio{Num: "agentkit", Den: "fdatasync"},
		pair.Ratio{Num: "agentkit", Den: "sqlite"},
		pair.Ratio{Num: "sqlite", Den: "fsync"},
		pair.Ratio{Num: "fsync", Den: "fdatasync"},
		pair.Ratio{Num: "append", Den: "fdatasync"},
	)
	b.ReportMetric(float64(len(f.sample)), "record-bytes")
	if fsync := t.Mean("fsync"); fsync > 0 {
		b.ReportMetric(float64(t.Mean("agentkit16"))/groupWriters/float64(fsync), "agentkit16-per-event/fsync")
	}
}

// TestFloorSidesWriteTheRecord runs every side of BenchmarkFloor and
// checks that each made the record durable where it says.
func TestFloorSidesWriteTheRecord(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	f, err := openFloor(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const calls = 3
	group, err := f.groupOp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range calls {
		for _, op := range append(f.ops(ctx), group) {
			if err := op.Run(i); err != nil {
				t.Fatalf("%s: %v", op.Name, err)
			}
		}
	}
	if n := len(f.sample); n < 300 || n > 1000 {
		t.Errorf("the record is %d bytes; want the size of one event's JSON (300 to 1,000)", n)
	}
	in, err := os.ReadFile(filepath.Join(dir, "in-place.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 4096 || in[0] != '{' {
		t.Errorf("the in-place file is %d bytes starting %q; want 4096 bytes starting with the record", len(in), in[:1])
	}
	log, err := os.ReadFile(filepath.Join(dir, "append.log"))
	if err != nil {
		t.Fatal(err)
	}
	if len(log) != calls*len(f.sample) {
		t.Errorf("the appended file is %d bytes; want %d records of %d bytes", len(log), calls, len(f.sample))
	}
	var rows int
	if err := f.raw.QueryRowContext(ctx, `SELECT count(*) FROM records`).Scan(&rows); err != nil || rows != calls {
		t.Errorf("the raw SQLite table has %d rows (%v); want %d", rows, err, calls)
	}
	var mode string
	var syncMode int
	if err := f.raw.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("the raw SQLite database is in journal mode %q (%v); want wal", mode, err)
	}
	if err := f.raw.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode); err != nil || syncMode != 2 {
		t.Errorf("the raw SQLite database has synchronous=%d (%v); want 2 (FULL)", syncMode, err)
	}
	recs, err := f.sessions.Last(ctx, f.meta.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	m, err := f.sessions.Get(ctx, f.meta.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != calls || m.LastSeq != calls {
		t.Errorf("the session database holds %d events, last seq %d; want %d", len(recs), m.LastSeq, calls)
	}
	for i, rec := range recs {
		if rec.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d; want %d", i, rec.Seq, i+1)
		}
	}
	for i := range groupWriters {
		id := fmt.Sprintf("floor-group-%02d", i)
		if recs, err := f.sessions.Last(ctx, id, 10); err != nil || len(recs) != calls {
			t.Errorf("session %s of the group side holds %d events (%v); want %d", id, len(recs), err, calls)
		}
	}
}
