package hosted

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"agentkit/internal/privfile"
)

// sqliteStore is the SQLite backend: one database file, for a service on
// one host. Writes go through one connection, each in a BEGIN IMMEDIATE
// transaction; reads use a pool of read-only connections and, in WAL mode,
// never wait for a writer.
type sqliteStore struct {
	path string
	w, r *sql.DB
	p    string
	ep   string

	mu    sync.Mutex
	stmts map[stmtKey]*sql.Stmt // prepared once, on w or r
}

type stmtKey struct {
	db *sql.DB
	q  string
}

// prepared returns q prepared on db, preparing it on first use: parsing a
// statement costs more than running it.
func (s *sqliteStore) prepared(ctx context.Context, db *sql.DB, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.stmts[stmtKey{db, q}]; st != nil {
		return st, nil
	}
	st, err := db.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	if s.stmts == nil {
		s.stmts = map[stmtKey]*sql.Stmt{}
	}
	s.stmts[stmtKey{db, q}] = st
	return st, nil
}

// txStmt returns q for use in tx: prepared on the writer by
// prepareWrites, or prepared in tx (the writer's one connection is tx's, so
// preparing on the pool would wait for tx to end).
func (s *sqliteStore) txStmt(ctx context.Context, tx *sql.Tx, q string) (*sql.Stmt, error) {
	s.mu.Lock()
	st := s.stmts[stmtKey{s.w, q}]
	s.mu.Unlock()
	if st == nil {
		return tx.PrepareContext(ctx, q)
	}
	return tx.StmtContext(ctx, st), nil
}

// writeQueries are the statements of write transactions, prepared when the
// store opens.
func (s *sqliteStore) writeQueries() []string {
	p := s.p
	return []string{
		"SELECT key, op, status, version FROM " + p + "_requests WHERE ns = ? AND id = ?",
		"UPDATE " + p + "_meta SET last_version = last_version + 1 WHERE id = 1 RETURNING last_version",
		"SELECT version FROM " + p + "_kv WHERE ns = ? AND key = ?",
		"DELETE FROM " + p + "_kv WHERE ns = ? AND key = ?",
		"INSERT INTO " + p + "_kv (ns, key, value, version) VALUES (?, ?, ?, ?) ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value, version = excluded.version",
		"INSERT INTO " + p + "_requests (ns, id, key, op, status, version, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
	}
}

func (s *sqliteStore) prepareWrites(ctx context.Context) error {
	for _, q := range s.writeQueries() {
		if _, err := s.prepared(ctx, s.w, q); err != nil {
			return fmt.Errorf("hosted: %s: prepare %q: %w", s.path, q, err)
		}
	}
	return nil
}

// txExec runs a prepared statement in tx.
func (s *sqliteStore) txExec(ctx context.Context, tx *sql.Tx, q string, args ...any) error {
	st, err := s.txStmt(ctx, tx, q)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(ctx, args...)
	return err
}

// txScan runs a prepared one-row query in tx and scans the row.
func (s *sqliteStore) txScan(ctx context.Context, tx *sql.Tx, q string, args []any, dest ...any) error {
	st, err := s.txStmt(ctx, tx, q)
	if err != nil {
		return err
	}
	return st.QueryRowContext(ctx, args...).Scan(dest...)
}

// readScan runs a prepared one-row query on the readers and scans the row.
func (s *sqliteStore) readScan(ctx context.Context, q string, args []any, dest ...any) error {
	st, err := s.prepared(ctx, s.r, q)
	if err != nil {
		return err
	}
	return st.QueryRowContext(ctx, args...).Scan(dest...)
}

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS %[1]s_meta (
	id           INTEGER PRIMARY KEY CHECK (id = 1),
	format       INTEGER NOT NULL,
	epoch        TEXT NOT NULL,
	last_version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS %[1]s_kv (
	ns      TEXT NOT NULL,
	key     TEXT NOT NULL,
	value   BLOB NOT NULL,
	version INTEGER NOT NULL,
	PRIMARY KEY (ns, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS %[1]s_requests (
	ns      TEXT NOT NULL,
	id      TEXT NOT NULL,
	key     TEXT NOT NULL,
	op      INTEGER NOT NULL,
	status  INTEGER NOT NULL,
	version INTEGER,
	at      INTEGER NOT NULL,
	PRIMARY KEY (ns, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS %[1]s_requests_at ON %[1]s_requests (at);
CREATE TABLE IF NOT EXISTS %[1]s_eval_runs (
	ns         TEXT NOT NULL,
	agent      TEXT NOT NULL,
	run_id     TEXT NOT NULL,
	snapshot   TEXT NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (ns, agent, run_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS %[1]s_ab_samples (
	ns         TEXT NOT NULL,
	agent      TEXT NOT NULL,
	experiment TEXT NOT NULL,
	variant    TEXT NOT NULL,
	session_id TEXT NOT NULL,
	at         TEXT NOT NULL,
	metrics    TEXT NOT NULL,
	PRIMARY KEY (ns, agent, experiment, session_id, at)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS %[1]s_ab_snapshots (
	ns         TEXT NOT NULL,
	agent      TEXT NOT NULL,
	snapshot   TEXT NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (ns, agent)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS %[1]s_memory (
	ns         TEXT NOT NULL,
	agent      TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	request_id TEXT NOT NULL,
	at         INTEGER NOT NULL,
	record     TEXT NOT NULL,
	PRIMARY KEY (ns, agent, seq),
	UNIQUE (ns, agent, request_id)
);
`

func openSQLite(ctx context.Context, rawURL string) (*sqliteStore, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("hosted: the sqlite URL does not parse; write sqlite:/path/to/hosted.db")
	}
	path := u.Opaque
	if path == "" {
		path = u.Path
	}
	if path, err = url.PathUnescape(path); err != nil || path == "" {
		return nil, errors.New("hosted: the sqlite URL names no file; write sqlite:/path/to/hosted.db")
	}
	q := u.Query()
	prefix, err := tablePrefix(q)
	if err != nil {
		return nil, err
	}
	syncMode := "FULL"
	if q.Has("synchronous") {
		syncMode = strings.ToUpper(q.Get("synchronous"))
		q.Del("synchronous")
		if syncMode != "FULL" && syncMode != "NORMAL" {
			return nil, fmt.Errorf("hosted: synchronous=%s: use full (every acknowledged write is on disk, the default) or normal (survives a crash of the process, not of the machine)", strings.ToLower(syncMode))
		}
	}
	for name := range q {
		return nil, fmt.Errorf("hosted: unknown option %q in the sqlite URL; the options are table=PREFIX and synchronous=full|normal", name)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("hosted: resolve %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), privfile.DirPerm); err != nil {
		return nil, fmt.Errorf("hosted: create the database's folder: %w", err)
	}
	// Every deployment's data is in this file: it is created owner-only
	// before SQLite opens it (SQLite gives its -wal, -shm and -journal
	// files the file's mode), and an existing one is tightened.
	if err := privfile.CreateSQLite(abs); err != nil {
		return nil, fmt.Errorf("hosted: %w", err)
	}
	base := "file:" + strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23").Replace(abs) + "?_busy_timeout=10000"
	s := &sqliteStore{path: abs, p: prefix}
	if s.w, err = sql.Open("sqlite", base+"&_synchronous="+syncMode+"&_txlock=immediate&_pragma=journal_mode(WAL)"); err != nil {
		return nil, fmt.Errorf("hosted: %w", err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	if err := s.ensureSchema(ctx); err != nil {
		s.w.Close()
		return nil, err
	}
	if err := s.prepareWrites(ctx); err != nil {
		s.close()
		return nil, err
	}
	if s.r, err = sql.Open("sqlite", base+"&_query_only=1"); err != nil {
		s.w.Close()
		return nil, fmt.Errorf("hosted: %w", err)
	}
	s.r.SetMaxOpenConns(4)
	s.r.SetMaxIdleConns(4)
	return s, nil
}

func (s *sqliteStore) ensureSchema(ctx context.Context) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("hosted: %s: %w", s.path, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(sqliteSchema, s.p)); err != nil {
		return fmt.Errorf("hosted: %s: create the tables %s_* (is this another program's database?): %w", s.path, s.p, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.p+"_meta (id, format, epoch, last_version) VALUES (1, ?, ?, 0) ON CONFLICT (id) DO NOTHING", schemaFormat, newEpoch()); err != nil {
		return fmt.Errorf("hosted: %s: %w", s.path, err)
	}
	var format int
	if err := tx.QueryRowContext(ctx, "SELECT format, epoch FROM "+s.p+"_meta WHERE id = 1").Scan(&format, &s.ep); err != nil {
		return fmt.Errorf("hosted: %s: read %s_meta: %w", s.path, s.p, err)
	}
	if format > schemaFormat {
		return fmt.Errorf("hosted: %s was written by a newer agentkit (format %d; this build reads format %d); upgrade agentkit", s.path, format, schemaFormat)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("hosted: %s: %w", s.path, err)
	}
	return nil
}

func (s *sqliteStore) kind() string  { return "sqlite" }
func (s *sqliteStore) epoch() string { return s.ep }

func (s *sqliteStore) close() {
	s.mu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	s.stmts = nil
	s.mu.Unlock()
	if s.r != nil {
		s.r.Close()
	}
	s.w.Close()
}

func (s *sqliteStore) ping(ctx context.Context) error {
	var one int
	return s.r.QueryRowContext(ctx, "SELECT 1 FROM "+s.p+"_meta").Scan(&one)
}

func (s *sqliteStore) get(ctx context.Context, ns, key string) ([]byte, int64, error) {
	var v []byte
	var ver int64
	err := s.readScan(ctx, "SELECT value, version FROM "+s.p+"_kv WHERE ns = ? AND key = ?", []any{ns, key}, &v, &ver)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, errNotFound
	}
	if v == nil && err == nil {
		v = []byte{}
	}
	return v, ver, err
}

// writeTx runs fn in a write transaction.
func (s *sqliteStore) writeTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *sqliteStore) write(ctx context.Context, w writeReq) (writeResult, error) {
	var res writeResult
	value := w.value
	if value == nil {
		value = []byte{}
	}
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		res = writeResult{}
		var key string
		var op, st int16
		var ver sql.NullInt64
		err := s.txScan(ctx, tx, "SELECT key, op, status, version FROM "+s.p+"_requests WHERE ns = ? AND id = ?", []any{w.ns, w.reqID}, &key, &op, &st, &ver)
		switch {
		case err == nil:
			res.replayed = true
			if key != w.key || writeOp(op) != w.op {
				res.status = statusReused
			} else {
				res.status, res.version = writeStatus(st), ver.Int64
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		next := func() (int64, error) {
			var n int64
			err := s.txScan(ctx, tx, "UPDATE "+s.p+"_meta SET last_version = last_version + 1 WHERE id = 1 RETURNING last_version", nil, &n)
			return n, err
		}
		var cur int64
		found := true
		if w.op == opPutIfAbsent || w.op == opPutIfVersion {
			err := s.txScan(ctx, tx, "SELECT version FROM "+s.p+"_kv WHERE ns = ? AND key = ?", []any{w.ns, w.key}, &cur)
			if errors.Is(err, sql.ErrNoRows) {
				found = false
			} else if err != nil {
				return err
			}
		}
		switch {
		case w.op == opPutIfAbsent && found:
			res.status = statusExists
		case w.op == opPutIfVersion && (!found || cur != w.expected):
			res.status = statusMismatch
		case w.op == opDelete:
			if err := s.txExec(ctx, tx, "DELETE FROM "+s.p+"_kv WHERE ns = ? AND key = ?", w.ns, w.key); err != nil {
				return err
			}
		default:
			n, err := next()
			if err != nil {
				return err
			}
			if err := s.txExec(ctx, tx, "INSERT INTO "+s.p+"_kv (ns, key, value, version) VALUES (?, ?, ?, ?) ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value, version = excluded.version", w.ns, w.key, value, n); err != nil {
				return err
			}
			res.version = n
		}
		var v any
		if res.version != 0 {
			v = res.version
		}
		return s.txExec(ctx, tx, "INSERT INTO "+s.p+"_requests (ns, id, key, op, status, version, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
			w.ns, w.reqID, w.key, int16(w.op), int16(res.status), v, time.Now().UnixMilli())
	})
	return res, err
}

func (s *sqliteStore) list(ctx context.Context, ns, prefix, after string, limit int, values bool) ([]row, bool, error) {
	cols := "key, NULL, 0"
	if values {
		cols = fmt.Sprintf("key, CASE WHEN length(value) <= %d THEN value END, length(value)", inlineValueLimit)
	}
	q := "SELECT " + cols + " FROM " + s.p + "_kv WHERE ns = ? AND key >= ? AND key > ?"
	args := []any{ns, prefix, after}
	if upper, ok := successor(prefix); ok {
		q += " AND key < ?"
		args = append(args, upper)
	}
	q += " ORDER BY key LIMIT ?"
	args = append(args, limit+1)
	st, err := s.prepared(ctx, s.r, q)
	if err != nil {
		return nil, false, err
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var page []row
	inline, more := 0, false
	for rows.Next() {
		if len(page) == limit || inline >= pageValueBytes {
			more = true
			break
		}
		var r row
		if err := rows.Scan(&r.key, &r.value, &r.size); err != nil {
			return nil, false, err
		}
		if values && r.value == nil && r.size == 0 {
			r.value = []byte{}
		}
		inline += len(r.value)
		page = append(page, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	return page, more, nil
}

func (s *sqliteStore) forgetRequests(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.w.ExecContext(ctx, "DELETE FROM "+s.p+"_requests WHERE at < ?", before.UnixMilli())
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *sqliteStore) putEval(ctx context.Context, ns, agent, runID string, snapshot []byte) error {
	_, err := s.w.ExecContext(ctx, "INSERT INTO "+s.p+"_eval_runs (ns, agent, run_id, snapshot, updated_at) VALUES (?, ?, ?, ?, ?) "+
		"ON CONFLICT (ns, agent, run_id) DO UPDATE SET snapshot = excluded.snapshot, updated_at = excluded.updated_at",
		ns, agent, runID, string(snapshot), time.Now().UnixMilli())
	return err
}

func (s *sqliteStore) deleteEval(ctx context.Context, ns, agent, runID string) error {
	_, err := s.w.ExecContext(ctx, "DELETE FROM "+s.p+"_eval_runs WHERE ns = ? AND agent = ? AND run_id = ?", ns, agent, runID)
	return err
}

func (s *sqliteStore) listEvals(ctx context.Context, ns, agent, after string, limit int) ([]evalRow, bool, error) {
	return sqlitePage(ctx, s.r, limit, func(r *evalRow, doc *string) []any { return []any{&r.runID, doc} },
		func(r *evalRow, doc string) { r.snapshot = []byte(doc) },
		"SELECT run_id, snapshot FROM "+s.p+"_eval_runs WHERE ns = ? AND agent = ? AND run_id > ? ORDER BY run_id LIMIT ?",
		ns, agent, after, limit+1)
}

func (s *sqliteStore) putSample(ctx context.Context, ns string, x sample) error {
	_, err := s.w.ExecContext(ctx, "INSERT INTO "+s.p+"_ab_samples (ns, agent, experiment, variant, session_id, at, metrics) VALUES (?, ?, ?, ?, ?, ?, ?) "+
		"ON CONFLICT DO NOTHING", ns, x.agent, x.experiment, x.variant, x.sessionID, x.at.UTC().Format(time.RFC3339Nano), string(x.metrics))
	return err
}

func (s *sqliteStore) putSnapshot(ctx context.Context, ns, agent string, doc []byte) error {
	_, err := s.w.ExecContext(ctx, "INSERT INTO "+s.p+"_ab_snapshots (ns, agent, snapshot, updated_at) VALUES (?, ?, ?, ?) "+
		"ON CONFLICT (ns, agent) DO UPDATE SET snapshot = excluded.snapshot, updated_at = excluded.updated_at",
		ns, agent, string(doc), time.Now().UnixMilli())
	return err
}

func (s *sqliteStore) getSnapshot(ctx context.Context, ns, agent string) ([]byte, error) {
	var doc string
	err := s.r.QueryRowContext(ctx, "SELECT snapshot FROM "+s.p+"_ab_snapshots WHERE ns = ? AND agent = ?", ns, agent).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errNotFound
	}
	if err != nil {
		return nil, err
	}
	return []byte(doc), nil
}

func (s *sqliteStore) appendMemory(ctx context.Context, ns, agent, reqID string, record []byte) (int64, bool, error) {
	var seq int64
	var replayed bool
	err := s.writeTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, "SELECT seq FROM "+s.p+"_memory WHERE ns = ? AND agent = ? AND request_id = ?", ns, agent, reqID).Scan(&seq)
		if err == nil {
			replayed = true
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if err := tx.QueryRowContext(ctx, "SELECT coalesce(max(seq), 0) + 1 FROM "+s.p+"_memory WHERE ns = ? AND agent = ?", ns, agent).Scan(&seq); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO "+s.p+"_memory (ns, agent, seq, request_id, at, record) VALUES (?, ?, ?, ?, ?, ?)",
			ns, agent, seq, reqID, time.Now().UnixMilli(), string(record))
		return err
	})
	return seq, replayed, err
}

func (s *sqliteStore) listMemory(ctx context.Context, ns, agent string, after int64, limit int) ([]memoryRow, bool, error) {
	return sqlitePage(ctx, s.r, limit, func(r *memoryRow, doc *string) []any { return []any{&r.seq, doc} },
		func(r *memoryRow, doc string) { r.record = []byte(doc) },
		"SELECT seq, record FROM "+s.p+"_memory WHERE ns = ? AND agent = ? AND seq > ? ORDER BY seq LIMIT ?",
		ns, agent, after, limit+1)
}

// sqlitePage runs a listing query that asks for limit+1 rows, each a
// key column and a text document: fields gives a row's scan targets (the
// document into doc), set stores the document in the row.
func sqlitePage[T any](ctx context.Context, db *sql.DB, limit int, fields func(r *T, doc *string) []any, set func(r *T, doc string), query string, args ...any) ([]T, bool, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var r T
		var doc string
		if err := rows.Scan(fields(&r, &doc)...); err != nil {
			return nil, false, err
		}
		set(&r, doc)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	out, more := page(out, limit)
	return out, more, nil
}
