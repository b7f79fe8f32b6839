// Package sessiondb is the runtime's local session database: one SQLite file
// (state root sessions/sessions.db, through modernc.org/sqlite) with a table
// of session metadata, a table of continuation tokens, and the event log
// keyed by (session_id, seq).
//
// Events are a clustered index on (session_id, seq), so appending one event,
// reading a page after a sequence number and reading the last N events each
// cost one B-tree descent: the same with a thousand or a hundred thousand
// events in the session, whatever the other sessions hold.
//
// The runtime (package agent) is its user; it is exported so benchmarks can
// measure Append and Last directly.
package sessiondb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"agentkit/internal/privfile"
)

// ErrNotFound means no session (or token) matched.
var ErrNotFound = errors.New("sessiondb: not found")

// Meta is one session's row: what the runtime shows and what it needs to
// mirror the session.
type Meta struct {
	ID         string
	ChannelID  string
	Title      string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	Turns      int64
	LastSeq    int64
	LastStatus string
	// TokenDigest is the digest (keys.TokenDigest) of the session's
	// continuation token: the token itself is never stored.
	TokenDigest string
	// MirroredSeq is the last event committed to the store (see
	// MirrorState).
	MirroredSeq int64
	// Batches is the number of the session's last batch in the store.
	Batches int64
	// IndexKey is the session-index key last written for the session.
	IndexKey string
	// TokenMirrored is true once the continuation token reached the store.
	TokenMirrored bool
}

// Record is one stored event: its JSON in Data.
type Record struct {
	SessionID string
	Seq       int64
	At        time.Time
	Type      string
	Data      []byte
}

// DB is an open session database. It is safe for concurrent use. Reads
// run on a pool of connections with statements prepared once; writes go
// through one writing connection owned by one goroutine, which commits
// the writes waiting at the same moment together (see Write).
type DB struct {
	db *sql.DB
	w  *writer

	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt // prepared on db, for reads

	storeMu sync.Mutex
	store   *Store // the embedded store (Store), once used
}

// maxReaders bounds the reading connections.
const maxReaders = 8

const schema = `
CREATE TABLE IF NOT EXISTS sessions (
	id           TEXT PRIMARY KEY,
	channel_id   TEXT NOT NULL,
	title        TEXT NOT NULL,
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	turns        INTEGER NOT NULL,
	last_seq     INTEGER NOT NULL,
	last_status  TEXT NOT NULL,
	token        TEXT NOT NULL,
	mirrored_seq INTEGER NOT NULL,
	batches      INTEGER NOT NULL,
	index_key    TEXT NOT NULL,
	token_mirrored INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_updated ON sessions (updated_at, id);
CREATE TABLE IF NOT EXISTS tokens (
	token      TEXT PRIMARY KEY, -- the digest of the token (keys.TokenDigest)
	session_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tokens_by_session ON tokens (session_id);
CREATE TABLE IF NOT EXISTS events (
	session_id TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	at         INTEGER NOT NULL,
	type       TEXT NOT NULL,
	data       BLOB NOT NULL,
	PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
`

// Open opens (creating if needed) the session database at path. The file
// is in WAL mode with synchronous=FULL: a write is on disk when the call
// that made it returns. secure_delete is on: a deleted session's rows are
// overwritten with zeros, not left in the file's free space. The file and
// its -wal and -shm files are owner-only (0600): a missing file is created
// empty with that mode before SQLite opens it, and an existing one (with
// its companions) is tightened.
func Open(ctx context.Context, path string) (*DB, error) {
	if err := privfile.CreateSQLite(path); err != nil {
		return nil, fmt.Errorf("sessiondb: %w", err)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "secure_delete(ON)"} {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sessiondb: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(maxReaders + 1)
	db.SetMaxIdleConns(maxReaders + 1)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sessiondb: opening %s: %w", path, err)
	}
	if _, err := conn.ExecContext(ctx, schema+mirrorSchema+idempotencySchema); err != nil {
		conn.Close()
		db.Close()
		return nil, fmt.Errorf("sessiondb: preparing %s: %w", path, err)
	}
	if err := digestTokens(ctx, conn); err != nil {
		conn.Close()
		db.Close()
		return nil, fmt.Errorf("sessiondb: %s: %w", path, err)
	}
	return &DB{db: db, w: newWriter(conn), stmts: map[string]*sql.Stmt{}}, nil
}

// Close waits for the writes in progress, then closes the database.
func (d *DB) Close() error {
	err := d.w.close()
	if d.store != nil {
		err = errors.Join(err, d.store.r.Close())
	}
	d.stmtMu.Lock()
	for _, st := range d.stmts {
		err = errors.Join(err, st.Close())
	}
	d.stmts = map[string]*sql.Stmt{}
	d.stmtMu.Unlock()
	return errors.Join(err, d.db.Close())
}

// Write runs fn in a write transaction on the database's writing
// connection and returns when that transaction is committed (on disk):
// fn's error if it failed (its writes are then rolled back, and nothing
// else), or the commit's. Writes waiting at the same moment share one
// transaction and one commit (group commit), each in a savepoint of its
// own. fn must not call DB's writing methods (that deadlocks); it uses
// tx's. A ctx that ends before the write starts cancels it; a started
// write runs to its end.
func (d *DB) Write(ctx context.Context, fn func(tx *Tx) error) error {
	return d.w.do(ctx, fn)
}

// Commits returns how many write transactions were committed since Open:
// with group commit, fewer than the writes made.
func (d *DB) Commits() int64 { return d.w.commits.Load() }

// read returns the read statement q, prepared on the reading pool on
// first use.
func (d *DB) read(ctx context.Context, q string) (*sql.Stmt, error) {
	d.stmtMu.Lock()
	defer d.stmtMu.Unlock()
	if st, ok := d.stmts[q]; ok {
		return st, nil
	}
	st, err := d.db.PrepareContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: %w", err)
	}
	d.stmts[q] = st
	return st, nil
}

func (d *DB) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	st, err := d.read(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// rowScanner is a *sql.Row, or the error of preparing its statement.
type rowScanner struct {
	row *sql.Row
	err error
}

func (r rowScanner) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.row.Scan(dest...)
}

func (d *DB) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	st, err := d.read(ctx, q)
	if err != nil {
		return rowScanner{err: err}
	}
	return rowScanner{row: st.QueryRowContext(ctx, args...)}
}

const metaCols = `id, channel_id, title, created_at, updated_at, turns, last_seq, last_status, token, mirrored_seq, batches, index_key, token_mirrored`

func scanMeta(row interface{ Scan(...any) error }) (Meta, error) {
	var m Meta
	var created, updated int64
	err := row.Scan(&m.ID, &m.ChannelID, &m.Title, &created, &updated, &m.Turns, &m.LastSeq,
		&m.LastStatus, &m.TokenDigest, &m.MirroredSeq, &m.Batches, &m.IndexKey, &m.TokenMirrored)
	if errors.Is(err, sql.ErrNoRows) {
		return Meta{}, ErrNotFound
	}
	if err != nil {
		return Meta{}, fmt.Errorf("sessiondb: %w", err)
	}
	m.CreatedAt = time.Unix(0, created).UTC()
	m.UpdatedAt = time.Unix(0, updated).UTC()
	return m, nil
}

func metaArgs(m Meta) []any {
	return []any{m.ID, m.ChannelID, m.Title, m.CreatedAt.UnixNano(), m.UpdatedAt.UnixNano(), m.Turns,
		m.LastSeq, m.LastStatus, m.TokenDigest, m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored}
}

// Put creates or replaces a session's row, and records its token.
func (d *DB) Put(ctx context.Context, m Meta) error {
	return d.Write(ctx, func(tx *Tx) error { return tx.Put(m) })
}

// Put creates or replaces a session's row, and records its token.
func (tx *Tx) Put(m Meta) error {
	if _, err := tx.exec(`INSERT OR REPLACE INTO sessions (`+metaCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, metaArgs(m)...); err != nil {
		return err
	}
	if m.TokenDigest != "" {
		if _, err := tx.exec(`INSERT OR REPLACE INTO tokens (token, session_id) VALUES (?, ?)`, m.TokenDigest, m.ID); err != nil {
			return err
		}
	}
	return nil
}

const getMeta = `SELECT ` + metaCols + ` FROM sessions WHERE id = ?`

// Get returns a session's row, or ErrNotFound.
func (d *DB) Get(ctx context.Context, id string) (Meta, error) {
	return scanMeta(d.queryRow(ctx, getMeta, id))
}

// Get returns a session's row as the write sees it, or ErrNotFound.
func (tx *Tx) Get(id string) (Meta, error) {
	return scanMeta(tx.queryRow(getMeta, id))
}

// SessionOfDigest returns the id of the session whose continuation token
// has the digest (keys.TokenDigest), or ErrNotFound.
func (d *DB) SessionOfDigest(ctx context.Context, digest string) (string, error) {
	var id string
	err := d.queryRow(ctx, `SELECT session_id FROM tokens WHERE token = ?`, digest).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("sessiondb: %w", err)
	}
	return id, nil
}

// Cursor is a position in the newest-first session listing.
type Cursor struct {
	UpdatedAt time.Time
	ID        string
}

// The session listing's queries. The cursor is a row value, so that
// SQLite seeks sessions_by_updated to it: an OR of its two conditions
// (updated_at < u OR updated_at = u AND id < i) scans every session, and a
// page from a cursor took 267 ms instead of 0.1 ms at 1,000,000 sessions.
const (
	listFirst = `SELECT ` + metaCols + ` FROM sessions ORDER BY updated_at DESC, id DESC LIMIT ?`
	listAfter = `SELECT ` + metaCols + ` FROM sessions WHERE (updated_at, id) < (?, ?) ORDER BY updated_at DESC, id DESC LIMIT ?`
)

// List returns up to limit sessions, newest first by UpdatedAt (ties by id,
// descending), starting after the cursor (nil: from the newest).
func (d *DB) List(ctx context.Context, limit int, after *Cursor) ([]Meta, error) {
	var rows *sql.Rows
	var err error
	if after == nil {
		rows, err = d.query(ctx, listFirst, limit)
	} else {
		rows, err = d.query(ctx, listAfter, after.UpdatedAt.UnixNano(), after.ID, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("sessiondb: listing sessions: %w", err)
	}
	defer rows.Close()
	var out []Meta
	for rows.Next() {
		m, err := scanMeta(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Count returns the number of sessions.
func (d *DB) Count(ctx context.Context) (int, error) {
	var n int
	err := d.queryRow(ctx, `SELECT count(*) FROM sessions`).Scan(&n)
	return n, err
}

// Append stores events in one transaction. Each record names its session
// and carries its sequence number; a sequence number already used in the
// session is an error. Append does not touch the session's row; the
// runtime updates it with Record.
func (d *DB) Append(ctx context.Context, recs ...Record) error {
	return d.Write(ctx, func(tx *Tx) error { return tx.Append(recs...) })
}

// AppendNext appends one event to a session, numbering it one past the
// session's last event, and returns its sequence number. It is Append for
// callers that do not track sequence numbers, such as benchmarks.
func (d *DB) AppendNext(ctx context.Context, sessionID, typ string, at time.Time, data []byte) (int64, error) {
	var seq int64
	err := d.Write(ctx, func(tx *Tx) error {
		if err := tx.queryRow(`SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = ?`, sessionID).Scan(&seq); err != nil {
			return err
		}
		return tx.Append(Record{SessionID: sessionID, Seq: seq, At: at, Type: typ, Data: data})
	})
	return seq, err
}

// Record stores events and the session's new state in one transaction:
// the row's title, update time, turn count, last sequence number and last
// status are set from m; its creation time, token and mirror fields are
// left as they are. A missing session is ErrNotFound.
func (d *DB) Record(ctx context.Context, m Meta, recs ...Record) error {
	return d.Write(ctx, func(tx *Tx) error { return tx.Record(m, recs...) })
}

// Record stores events and the session's new state (see DB.Record).
func (tx *Tx) Record(m Meta, recs ...Record) error {
	if err := tx.Append(recs...); err != nil {
		return err
	}
	res, err := tx.exec(`UPDATE sessions SET title = ?, updated_at = ?, turns = ?, last_seq = ?, last_status = ? WHERE id = ?`,
		m.Title, m.UpdatedAt.UnixNano(), m.Turns, m.LastSeq, m.LastStatus, m.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// insertRows is the most events one INSERT statement carries.
const insertRows = 16

// insertEvents[n] is the INSERT of n events.
var insertEvents = func() []string {
	q := make([]string, insertRows+1)
	for n := 1; n <= insertRows; n++ {
		var b strings.Builder
		b.WriteString(`INSERT INTO events (session_id, seq, at, type, data) VALUES `)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`(?,?,?,?,?)`)
		}
		q[n] = b.String()
	}
	return q
}()

// Append stores events (see DB.Append), up to insertRows a statement.
func (tx *Tx) Append(recs ...Record) error {
	for len(recs) > 0 {
		n := min(len(recs), insertRows)
		args := make([]any, 0, 5*n)
		for _, r := range recs[:n] {
			args = append(args, r.SessionID, r.Seq, r.At.UnixNano(), r.Type, r.Data)
		}
		if _, err := tx.exec(insertEvents[n], args...); err != nil {
			if n == 1 {
				return fmt.Errorf("sessiondb: event %d of session %s: %w", recs[0].Seq, recs[0].SessionID, err)
			}
			return fmt.Errorf("sessiondb: events %d to %d of session %s: %w", recs[0].Seq, recs[n-1].Seq, recs[0].SessionID, err)
		}
		recs = recs[n:]
	}
	return nil
}

const (
	eventsAfter = `SELECT seq, at, type, data FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?`
	eventsLast  = `SELECT seq, at, type, data FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT ?`
	eventsRange = `SELECT seq, at, type, data FROM events WHERE session_id = ? AND seq >= ? AND seq <= ? ORDER BY seq`
)

// After returns up to limit events of a session with seq > after, in
// order.
func (d *DB) After(ctx context.Context, sessionID string, after int64, limit int) ([]Record, error) {
	rows, err := d.query(ctx, eventsAfter, sessionID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	return scanRecords(sessionID, rows, false)
}

// Last returns the last n events of a session, in ascending order.
func (d *DB) Last(ctx context.Context, sessionID string, n int) ([]Record, error) {
	rows, err := d.query(ctx, eventsLast, sessionID, n)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	return scanRecords(sessionID, rows, true)
}

// Range returns the events of a session with from <= seq <= to, in order.
func (d *DB) Range(ctx context.Context, sessionID string, from, to int64) ([]Record, error) {
	rows, err := d.query(ctx, eventsRange, sessionID, from, to)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	return scanRecords(sessionID, rows, false)
}

// Range returns events as the write sees them (see DB.Range).
func (tx *Tx) Range(sessionID string, from, to int64) ([]Record, error) {
	rows, err := tx.query(eventsRange, sessionID, from, to)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	return scanRecords(sessionID, rows, false)
}

func scanRecords(sessionID string, rows *sql.Rows, reverse bool) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r := Record{SessionID: sessionID}
		var at int64
		if err := rows.Scan(&r.Seq, &at, &r.Type, &r.Data); err != nil {
			return nil, fmt.Errorf("sessiondb: reading events: %w", err)
		}
		r.At = time.Unix(0, at).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	if reverse {
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out, nil
}

// Delete removes a session, its tokens, its events, its mirror state and
// its forked events.
func (d *DB) Delete(ctx context.Context, id string) error {
	return d.Write(ctx, func(tx *Tx) error { return tx.Delete(id) })
}

// Delete removes a session (see DB.Delete).
func (tx *Tx) Delete(id string) error {
	for _, q := range []string{
		`DELETE FROM mirror WHERE session_id = ?`,
		`DELETE FROM forked_events WHERE session_id = ?`,
		`DELETE FROM events WHERE session_id = ?`,
		`DELETE FROM tokens WHERE session_id = ?`,
		`DELETE FROM sessions WHERE id = ?`,
	} {
		if _, err := tx.exec(q, id); err != nil {
			return err
		}
	}
	return nil
}
