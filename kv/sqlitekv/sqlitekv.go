// Package sqlitekv is the SQLite driver for package kv: the whole store in
// one database file, shared safely by several processes on one host. It is
// agentkit's default store (under --state-root/kv). It uses
// modernc.org/sqlite, a pure-Go SQLite, so it needs no C toolchain.
//
// It registers the "sqlite" scheme:
//
//	kv.Open(ctx, "sqlite:/var/lib/agentkit/kv/kv.db")
//	kv.Open(ctx, "sqlite:state/kv.db")                   // relative to the working folder
//	kv.Open(ctx, "sqlite:///var/lib/agentkit/kv/kv.db")  // the three-slash form
//	kv.Open(ctx, "sqlite:/var/lib/agentkit/kv/")         // a folder: kv.db inside it
//	kv.Open(ctx, "sqlite:kv.db?synchronous=normal&busy_timeout=10s")
//
// or call Open with Options.
//
// # Schema
//
// One table holds the data, kv(key TEXT PRIMARY KEY, value BLOB, version
// INTEGER), and a one-row table kv_meta holds the layout format and the last
// version issued. Every write sets its row's version to the next number and
// two triggers record it in kv_meta within the same statement, so versions
// never repeat in a database, across processes and after a delete and
// re-create. The database runs in WAL mode.
//
// # Writes and conditional writes
//
// Each write is a single statement, which SQLite runs as its own
// transaction: it takes the write lock when it starts (waiting up to the
// busy timeout for another process's write) and commits when it ends, so a
// conditional write is atomic across every process using the file.
// PutIfVersion is an UPDATE … WHERE key = ? AND version = ?, and
// PutIfAbsent an INSERT … ON CONFLICT DO NOTHING; no row changed means
// kv.ErrConflict. With synchronous=FULL (the default) a write that returned
// is on disk; synchronous=NORMAL is faster and survives a crash of the
// process but can lose the last writes in a power cut or OS crash.
//
// # Reads and listings
//
// Reads use their own connections and, in WAL mode, never wait for writers
// (another process's included). List reads by key range (key >= prefix AND
// key < the prefix's successor, never LIKE, which ignores ASCII case) in
// pages of at most 1,000 rows, each page a short read transaction resuming
// after the last key, so a long listing does not pin the WAL. Every key that
// exists throughout a listing is returned, once, in bytewise order.
package sqlitekv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"agentkit/internal/privfile"
	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

func init() {
	kv.RegisterOptions("sqlite", openURL)
}

// Synchronous is SQLite's synchronous setting for the store's writes.
type Synchronous string

const (
	// SyncFull makes every returned write durable: it is fsynced to the
	// WAL before the write returns. The default.
	SyncFull Synchronous = "full"
	// SyncNormal fsyncs only at checkpoints. A returned write survives a
	// crash of the process but may be lost (never corrupted) in a power
	// cut or an OS crash.
	SyncNormal Synchronous = "normal"
)

// DefaultBusyTimeout is how long a write waits for another connection's
// write lock before failing, unless Options.BusyTimeout says otherwise.
const DefaultBusyTimeout = 5 * time.Second

// Options configure Open. A nil *Options means the defaults.
type Options struct {
	// Synchronous is SyncFull (the default when empty) or SyncNormal.
	Synchronous Synchronous
	// BusyTimeout is how long a statement waits for a lock another
	// connection or process holds before failing with "database is
	// locked". Zero means DefaultBusyTimeout.
	BusyTimeout time.Duration
	// ReadOnly opens the database read-only: it must exist and hold a
	// store, and nothing is created or written, not even its folder
	// (kv.OpenOptions.ReadOnly sets it).
	ReadOnly bool
}

// dbFileName is the file made inside a folder named as the path.
const dbFileName = "kv.db"

// Open opens (creating it, and its folder, if needed) the database at path
// and returns the store. A path naming an existing folder, or ending in a
// slash, means the file kv.db inside it. nil opts means the defaults.
func Open(ctx context.Context, path string, opts *Options) (*kv.DB, error) {
	s, err := open(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	return kv.New("sqlite", s)
}

// openURL opens sqlite:PATH, sqlite:///PATH with options in the query.
func openURL(ctx context.Context, u *url.URL, o kv.OpenOptions) (*kv.DB, error) {
	var path string
	switch {
	case u.Opaque != "":
		p, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return nil, fmt.Errorf("sqlitekv: the path in the URL does not unescape: %w", err)
		}
		path = p
	case u.Host != "" && u.Host != "localhost":
		return nil, fmt.Errorf("sqlitekv: a sqlite URL names a local file, but this one names the host %q; write sqlite:/path/to/kv.db, sqlite:relative/kv.db or sqlite:///path/to/kv.db", u.Host)
	default:
		path = u.Path
	}
	q, err := driverkit.Params(u, "synchronous", "busy_timeout")
	if err != nil {
		return nil, fmt.Errorf("sqlitekv: %w (synchronous=full|normal, busy_timeout=DURATION)", err)
	}
	opts, err := parseOptions(q)
	if err != nil {
		return nil, err
	}
	opts.ReadOnly = o.ReadOnly
	return Open(ctx, path, opts)
}

// parseOptions reads synchronous= and busy_timeout= from a URL's
// parameters.
func parseOptions(q map[string]string) (*Options, error) {
	opts := &Options{Synchronous: Synchronous(strings.ToLower(q["synchronous"]))}
	if v, ok := q["busy_timeout"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			ms, err2 := strconv.Atoi(v)
			if err2 != nil {
				return nil, fmt.Errorf("sqlitekv: busy_timeout=%q is not a duration; write it as 5s or 500ms (a bare number is milliseconds)", v)
			}
			d = time.Duration(ms) * time.Millisecond
		}
		if d <= 0 {
			return nil, fmt.Errorf("sqlitekv: busy_timeout=%q must be positive", v)
		}
		opts.BusyTimeout = d
	}
	return opts, nil
}

// store is the backend: a writer pool of one connection (SQLite has one
// writer at a time anyway; one connection keeps this process's writes
// queued in Go instead of spinning on SQLITE_BUSY) and a reader pool.
type store struct {
	path        string
	busyTimeout time.Duration
	w, r        *sql.DB

	put, putAbsent, putVersion, del *sql.Stmt // on w
	get                             *sql.Stmt // on r
	// list and keys read one page of a listing (on r), indexed by
	// pageQuery: the first page or a later one, bounded above or not.
	list, keys [4]*sql.Stmt

	// pageRows and keyPageRows are the page sizes of List and ListKeys
	// (listPage and listKeysPage; tests make them small).
	pageRows, keyPageRows int

	closed atomic.Bool // set by Close, for the errors of operations it cut short
}

var (
	_ kv.Store       = (*store)(nil)
	_ kv.CAS         = (*store)(nil)
	_ kv.AfterLister = (*store)(nil)
)

const (
	formatVersion = 1
	// listPage is the most rows one listing query reads; listPageBytes
	// stops a page early once its values pass that many bytes.
	listPage      = 1000
	listPageBytes = 4 << 20
	listKeysPage  = 1000
	maxReaders    = 4
)

func open(ctx context.Context, path string, opts *Options) (*store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &Options{}
	}
	syncMode := strings.ToUpper(string(opts.Synchronous))
	switch syncMode {
	case "":
		syncMode = "FULL"
	case "FULL", "NORMAL":
	default:
		return nil, fmt.Errorf("sqlitekv: synchronous=%q is not supported; use full (every returned write is on disk, the default) or normal (survives a process crash, may lose the last writes in a power cut)", opts.Synchronous)
	}
	busy := opts.BusyTimeout
	if busy == 0 {
		busy = DefaultBusyTimeout
	}
	if busy < 0 {
		return nil, fmt.Errorf("sqlitekv: the busy timeout %v is negative", busy)
	}
	abs, err := dbPath(path)
	if err != nil {
		return nil, err
	}
	base := "file:" + escapePath(abs) + "?_busy_timeout=" + strconv.FormatInt(busy.Milliseconds(), 10) + "&_pragma=secure_delete(ON)" // deleted values are zeroed, not left in free space
	// The file holds whatever the runtime stores (transcripts, tokens):
	// it is created owner-only before SQLite opens it, so its -wal, -shm
	// and -journal files are too, and an existing one is tightened.
	if opts.ReadOnly {
		if _, err := os.Stat(abs); err != nil {
			return nil, fmt.Errorf("sqlitekv: no database at %s (opened read-only, so none was created): %w", abs, err)
		}
		if err := privfile.TightenSQLite(abs); err != nil {
			return nil, fmt.Errorf("sqlitekv: %w", err)
		}
		base += "&mode=ro"
	} else if err := os.MkdirAll(filepath.Dir(abs), privfile.DirPerm); err != nil {
		return nil, fmt.Errorf("sqlitekv: create the database's folder: %w", err)
	} else if err := privfile.CreateSQLite(abs); err != nil {
		return nil, fmt.Errorf("sqlitekv: %w", err)
	}

	s := &store{path: abs, busyTimeout: busy, pageRows: listPage, keyPageRows: listKeysPage}
	if s.w, err = sql.Open("sqlite", base+"&_synchronous="+syncMode+"&_txlock=immediate"); err != nil {
		return nil, s.closeAfter(fmt.Errorf("sqlitekv: %w", err))
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if opts.ReadOnly {
		if ready, err := s.schemaReady(ctx); err != nil || !ready {
			if err == nil {
				err = fmt.Errorf("sqlitekv: %s holds no store (opened read-only, so none was created)", abs)
			}
			return nil, s.closeAfter(err)
		}
	} else if err := s.initSchema(ctx); err != nil {
		return nil, s.closeAfter(err)
	}
	if s.r, err = sql.Open("sqlite", base+"&_query_only=1"); err != nil {
		return nil, s.closeAfter(fmt.Errorf("sqlitekv: %w", err))
	}
	s.r.SetMaxOpenConns(maxReaders)
	s.r.SetMaxIdleConns(maxReaders)
	if err := s.prepare(ctx); err != nil {
		return nil, s.closeAfter(err)
	}
	return s, nil
}

// dbPath resolves path to the database file's absolute path.
func dbPath(path string) (string, error) {
	if path == "" {
		return "", errors.New("sqlitekv: no database path given; name a file, as in sqlite:/var/lib/agentkit/kv/kv.db")
	}
	if path == "~" || strings.HasPrefix(path, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("sqlitekv: expand %s: %w", path, err)
		}
		path = filepath.Join(home, path[1:])
	}
	folder := strings.HasSuffix(path, "/")
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("sqlitekv: resolve %s: %w", path, err)
	}
	if fi, err := os.Stat(abs); folder || (err == nil && fi.IsDir()) {
		abs = filepath.Join(abs, dbFileName)
	}
	return abs, nil
}

// escapePath escapes what a SQLite URI filename would read as syntax.
func escapePath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23").Replace(p)
}

func (s *store) closeAfter(err error) error {
	s.Close()
	return err
}

// initSchema switches the file to WAL and creates the tables, once, inside
// one write transaction so two processes opening a new file agree. Opening
// a database that is ready only reads: a process that opens it to look
// (agentkit kv ls) never queues for the write lock behind a busy server.
func (s *store) initSchema(ctx context.Context) error {
	var mode string
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return s.openErr("read the journal mode", err)
	}
	if !strings.EqualFold(mode, "wal") {
		if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode=WAL").Scan(&mode); err != nil {
			return s.openErr("switch to WAL mode", err)
		}
		if !strings.EqualFold(mode, "wal") {
			return fmt.Errorf("sqlitekv: %s stays in journal mode %q; it must allow WAL mode (a local file system, not a network share)", s.path, mode)
		}
	}
	if ready, err := s.schemaReady(ctx); err != nil || ready {
		return err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return s.openErr("create the tables", err)
	}
	defer tx.Rollback()
	for _, q := range tableStatements {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return s.openErr("create the tables (is this another program's database?)", err)
		}
	}
	var format int
	if err := tx.QueryRowContext(ctx, "SELECT format FROM kv_meta WHERE id = 1").Scan(&format); err != nil {
		return s.openErr("read the format", err)
	}
	if format > formatVersion {
		return fmt.Errorf("sqlitekv: %s was written by a newer agentkit (format %d; this build reads format %d); upgrade agentkit", s.path, format, formatVersion)
	}
	if err := tx.Commit(); err != nil {
		return s.openErr("create the tables", err)
	}
	return nil
}

// schemaReady reports whether the tables and triggers exist in a format
// this build reads.
func (s *store) schemaReady(ctx context.Context) (bool, error) {
	var n int
	err := s.w.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE
		(type = 'table' AND name IN ('kv', 'kv_meta')) OR
		(type = 'trigger' AND name IN ('kv_version_insert', 'kv_version_update'))`).Scan(&n)
	if err != nil {
		return false, s.openErr("read the schema", err)
	}
	if n != 4 {
		return false, nil
	}
	var format int
	err = s.w.QueryRowContext(ctx, "SELECT format FROM kv_meta WHERE id = 1").Scan(&format)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, s.openErr("read the format (is this another program's database?)", err)
	case format > formatVersion:
		return false, fmt.Errorf("sqlitekv: %s was written by a newer agentkit (format %d; this build reads format %d); upgrade agentkit", s.path, format, formatVersion)
	}
	return true, nil
}

func (s *store) openErr(what string, err error) error {
	return fmt.Errorf("sqlitekv: %s: %s: %w", s.path, what, s.mapErr(err))
}

func (s *store) prepare(ctx context.Context) error {
	var err error
	prep := func(db *sql.DB, q string) *sql.Stmt {
		if err != nil {
			return nil
		}
		var st *sql.Stmt
		st, err = db.PrepareContext(ctx, q)
		return st
	}
	const next = `(SELECT last_version + 1 FROM kv_meta WHERE id = 1)`
	s.put = prep(s.w, `INSERT INTO kv (key, value, version) VALUES (?1, ?2, `+next+`)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value, version = excluded.version
		RETURNING version`)
	s.putAbsent = prep(s.w, `INSERT INTO kv (key, value, version) VALUES (?1, ?2, `+next+`)
		ON CONFLICT (key) DO NOTHING
		RETURNING version`)
	s.putVersion = prep(s.w, `UPDATE kv SET value = ?2, version = `+next+`
		WHERE key = ?1 AND version = ?3
		RETURNING version`)
	s.del = prep(s.w, `DELETE FROM kv WHERE key = ?1`)
	s.get = prep(s.r, `SELECT value, version FROM kv WHERE key = ?1`)
	for i := range 4 {
		first, bounded := i&1 == 0, i&2 != 0
		q := " FROM kv WHERE key > ?1"
		if first {
			q = " FROM kv WHERE key >= ?1"
		}
		if bounded {
			q += " AND key < ?3"
		}
		q += " ORDER BY key LIMIT ?2"
		s.list[i] = prep(s.r, "SELECT key, value"+q)
		s.keys[i] = prep(s.r, "SELECT key"+q)
	}
	if err != nil {
		return s.openErr("prepare statements (is this another program's database?)", err)
	}
	return nil
}

// Close closes both pools. The last connection to the file checkpoints the
// WAL into the database.
func (s *store) Close() error {
	s.closed.Store(true)
	var errs []error
	stmts := append([]*sql.Stmt{s.put, s.putAbsent, s.putVersion, s.del, s.get}, s.list[:]...)
	for _, st := range append(stmts, s.keys[:]...) {
		if st != nil {
			st.Close()
		}
	}
	for _, db := range []*sql.DB{s.r, s.w} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	return errors.Join(errs...)
}

// mapErr gives SQLite's errors the contract's meaning where there is one.
func (s *store) mapErr(err error) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("%w: %w", kv.ErrClosed, err)
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_TOOBIG:
		return fmt.Errorf("%w: SQLite's limit is 1,000,000,000 bytes per value: %w", kv.ErrTooLarge, err)
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("sqlitekv: %s stayed locked by another connection or process for the whole busy timeout (%v); raise busy_timeout or find the long transaction: %w", s.path, s.busyTimeout, err)
	}
	return err
}

// write runs one write statement, st(key, value, args...), which draws
// the next version and returns it. A statement on its own is a transaction:
// it takes the write lock when it starts (waiting up to the busy timeout
// for other processes) and commits when it completes, so the condition in
// its WHERE or ON CONFLICT clause and the write are one atomic step. No row
// returned means the condition failed: kv.ErrConflict.
func (s *store) write(ctx context.Context, st *sql.Stmt, key string, value []byte, args ...any) (kv.Version, error) {
	rows, err := st.QueryContext(ctx, append([]any{key, value}, args...)...)
	if err != nil {
		return "", s.mapErr(err)
	}
	defer rows.Close()
	var ver int64
	n := 0
	// Step until done: the commit happens at the last step, and its error
	// (if any) surfaces there.
	for rows.Next() {
		if err := rows.Scan(&ver); err != nil {
			return "", s.mapErr(err)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return "", s.mapErr(err)
	}
	if n == 0 {
		return "", kv.ErrConflict
	}
	return kv.Version(strconv.FormatInt(ver, 10)), nil
}

// Put creates or overwrites key.
func (s *store) Put(ctx context.Context, key string, value []byte) error {
	_, err := s.write(ctx, s.put, key, value)
	return err
}

// PutIfAbsent inserts key only if it has no row.
func (s *store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	return s.write(ctx, s.putAbsent, key, value)
}

// PutIfVersion updates key only if its row has version expected.
func (s *store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	want, err := strconv.ParseInt(string(expected), 10, 64)
	if err != nil || strconv.FormatInt(want, 10) != string(expected) {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		return "", fmt.Errorf("%w: %q is not a version this driver issued", kv.ErrConflict, expected)
	}
	return s.write(ctx, s.putVersion, key, value, want)
}

// Delete removes key's row; a missing key is not an error.
func (s *store) Delete(ctx context.Context, key string) error {
	_, err := s.del.ExecContext(ctx, key)
	return s.mapErr(err)
}

// Get returns the value of key, or an error matching kv.ErrNotFound.
func (s *store) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := s.GetWithVersion(ctx, key)
	return v, err
}

// GetWithVersion returns the value of key and its version.
func (s *store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	var (
		v   []byte
		ver int64
	)
	err := s.get.QueryRowContext(ctx, key).Scan(&v, &ver)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", kv.ErrNotFound
	}
	if err != nil {
		return nil, "", s.mapErr(err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, kv.Version(strconv.FormatInt(ver, 10)), nil
}

// List yields the entries under prefix in ascending bytewise key order, a
// page at a time.
func (s *store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter is List from the first key after after: the page queries
// start there on the primary key's index.
func (s *store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		for page, err := range s.pages(ctx, prefix, after, true, s.pageRows) {
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			for _, e := range page {
				if !yield(e, nil) {
					return
				}
			}
		}
	}
}

// ListKeys yields the keys under prefix in ascending bytewise order.
func (s *store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter is ListKeys from the first key after after.
func (s *store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for page, err := range s.pages(ctx, prefix, after, false, s.keyPageRows) {
			if err != nil {
				yield("", err)
				return
			}
			for _, e := range page {
				if !yield(e.Key, nil) {
					return
				}
			}
		}
	}
}

// pages yields the rows under prefix in key order, one query per page
// (prepared once, at open). Each page is read whole and its rows closed
// before it is yielded, so the caller may write to the store (or stop)
// between entries without holding a read transaction open. A query asks
// for one row more than a page, to know whether another page follows
// without a query that finds nothing. The first page starts after from
// when from sorts at or after the prefix, at the prefix otherwise.
func (s *store) pages(ctx context.Context, prefix, from string, withValue bool, size int) iter.Seq2[[]kv.Entry, error] {
	return func(yield func([]kv.Entry, error) bool) {
		stmts := &s.keys
		if withValue {
			stmts = &s.list
		}
		end, bounded := driverkit.PrefixEnd(prefix)
		after, next := prefix, 0
		if from >= prefix {
			after, next = from, 1
		}
		args := []any{after, size + 1}
		if bounded {
			args = append(args, end)
			next |= 2
		}
		for {
			args[0] = after
			page, full, err := s.readPage(ctx, stmts[next], args, withValue, size)
			if err != nil {
				yield(nil, err)
				return
			}
			if len(page) > 0 && !yield(page, nil) {
				return
			}
			if !full {
				return
			}
			after, next = page[len(page)-1].Key, next|1
		}
	}
}

// readPage runs one page query. full reports whether more rows may follow.
func (s *store) readPage(ctx context.Context, st *sql.Stmt, args []any, withValue bool, size int) (page []kv.Entry, full bool, err error) {
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, false, s.mapErr(err)
	}
	defer rows.Close()
	bytes := 0
	for rows.Next() {
		var e kv.Entry
		if withValue {
			err = rows.Scan(&e.Key, &e.Value)
		} else {
			err = rows.Scan(&e.Key)
		}
		if err != nil {
			return nil, false, s.mapErr(err)
		}
		if withValue && e.Value == nil {
			e.Value = []byte{}
		}
		if len(page) == size {
			return page, true, nil // the extra row: another page follows
		}
		page = append(page, e)
		if bytes += len(e.Value); bytes >= listPageBytes {
			return page, true, nil // stop early; the next page resumes after this key
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, s.mapErr(err)
	}
	return page, false, nil
}
