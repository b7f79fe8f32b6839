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
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
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
	// Token is the session's continuation token.
	Token string
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

// DB is an open session database. It is safe for concurrent use.
type DB struct {
	db *sql.DB
}

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
	token      TEXT PRIMARY KEY,
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
// is in WAL mode with synchronous=FULL: an appended event is on disk when
// Append returns. secure_delete is on: a deleted session's rows are
// overwritten with zeros, not left in the file's free space.
func Open(ctx context.Context, path string) (*DB, error) {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "secure_delete(ON)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sessiondb: opening %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, schema+mirrorSchema+idempotencySchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("sessiondb: preparing %s: %w", path, err)
	}
	return &DB{db: db}, nil
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

const metaCols = `id, channel_id, title, created_at, updated_at, turns, last_seq, last_status, token, mirrored_seq, batches, index_key, token_mirrored`

func scanMeta(row interface{ Scan(...any) error }) (Meta, error) {
	var m Meta
	var created, updated int64
	err := row.Scan(&m.ID, &m.ChannelID, &m.Title, &created, &updated, &m.Turns, &m.LastSeq,
		&m.LastStatus, &m.Token, &m.MirroredSeq, &m.Batches, &m.IndexKey, &m.TokenMirrored)
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
		m.LastSeq, m.LastStatus, m.Token, m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored}
}

// Put creates or replaces a session's row, and records its token.
func (d *DB) Put(ctx context.Context, m Meta) error {
	return d.tx(ctx, func(tx *sql.Tx) error {
		return putTx(ctx, tx, m)
	})
}

func putTx(ctx context.Context, tx *sql.Tx, m Meta) error {
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO sessions (`+metaCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, metaArgs(m)...); err != nil {
		return err
	}
	if m.Token != "" {
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO tokens (token, session_id) VALUES (?, ?)`, m.Token, m.ID); err != nil {
			return err
		}
	}
	return nil
}

// Get returns a session's row, or ErrNotFound.
func (d *DB) Get(ctx context.Context, id string) (Meta, error) {
	return scanMeta(d.db.QueryRowContext(ctx, `SELECT `+metaCols+` FROM sessions WHERE id = ?`, id))
}

// SessionOfToken returns the id of the session a continuation token names,
// or ErrNotFound.
func (d *DB) SessionOfToken(ctx context.Context, token string) (string, error) {
	var id string
	err := d.db.QueryRowContext(ctx, `SELECT session_id FROM tokens WHERE token = ?`, token).Scan(&id)
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

// List returns up to limit sessions, newest first by UpdatedAt (ties by id,
// descending), starting after the cursor (nil: from the newest).
func (d *DB) List(ctx context.Context, limit int, after *Cursor) ([]Meta, error) {
	var rows *sql.Rows
	var err error
	if after == nil {
		rows, err = d.db.QueryContext(ctx, `SELECT `+metaCols+` FROM sessions ORDER BY updated_at DESC, id DESC LIMIT ?`, limit)
	} else {
		u := after.UpdatedAt.UnixNano()
		rows, err = d.db.QueryContext(ctx, `SELECT `+metaCols+` FROM sessions
			WHERE updated_at < ? OR (updated_at = ? AND id < ?)
			ORDER BY updated_at DESC, id DESC LIMIT ?`, u, u, after.ID, limit)
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
	err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM sessions`).Scan(&n)
	return n, err
}

// Append stores events in one transaction. Each record names its session
// and carries its sequence number; a sequence number already used in the
// session is an error. Append does not touch the session's row; the
// runtime updates it with Record.
func (d *DB) Append(ctx context.Context, recs ...Record) error {
	return d.tx(ctx, func(tx *sql.Tx) error { return appendTx(ctx, tx, recs) })
}

// AppendNext appends one event to a session, numbering it one past the
// session's last event, and returns its sequence number. It is Append for
// callers that do not track sequence numbers, such as benchmarks.
func (d *DB) AppendNext(ctx context.Context, sessionID, typ string, at time.Time, data []byte) (int64, error) {
	var seq int64
	err := d.tx(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session_id = ?`, sessionID).Scan(&seq); err != nil {
			return err
		}
		return appendTx(ctx, tx, []Record{{SessionID: sessionID, Seq: seq, At: at, Type: typ, Data: data}})
	})
	return seq, err
}

// Record stores events and the session's new state in one transaction:
// the row's title, update time, turn count, last sequence number and last
// status are set from m; its creation time, token and mirror fields are
// left as they are. A missing session is ErrNotFound.
func (d *DB) Record(ctx context.Context, m Meta, recs ...Record) error {
	return d.tx(ctx, func(tx *sql.Tx) error {
		if err := appendTx(ctx, tx, recs); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE sessions SET title = ?, updated_at = ?, turns = ?, last_seq = ?, last_status = ? WHERE id = ?`,
			m.Title, m.UpdatedAt.UnixNano(), m.Turns, m.LastSeq, m.LastStatus, m.ID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return ErrNotFound
		}
		return nil
	})
}

func appendTx(ctx context.Context, tx *sql.Tx, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	st, err := tx.PrepareContext(ctx, `INSERT INTO events (session_id, seq, at, type, data) VALUES (?,?,?,?,?)`)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, r := range recs {
		if _, err := st.ExecContext(ctx, r.SessionID, r.Seq, r.At.UnixNano(), r.Type, r.Data); err != nil {
			return fmt.Errorf("event %d of session %s: %w", r.Seq, r.SessionID, err)
		}
	}
	return nil
}

// After returns up to limit events of a session with seq > after, in
// order.
func (d *DB) After(ctx context.Context, sessionID string, after int64, limit int) ([]Record, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT seq, at, type, data FROM events
		WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?`, sessionID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	return scanRecords(sessionID, rows, false)
}

// Last returns the last n events of a session, in ascending order.
func (d *DB) Last(ctx context.Context, sessionID string, n int) ([]Record, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT seq, at, type, data FROM events
		WHERE session_id = ? ORDER BY seq DESC LIMIT ?`, sessionID, n)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: reading events: %w", err)
	}
	return scanRecords(sessionID, rows, true)
}

// Range returns the events of a session with from <= seq <= to, in order.
func (d *DB) Range(ctx context.Context, sessionID string, from, to int64) ([]Record, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT seq, at, type, data FROM events
		WHERE session_id = ? AND seq >= ? AND seq <= ? ORDER BY seq`, sessionID, from, to)
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
	return d.tx(ctx, func(tx *sql.Tx) error {
		if err := deleteMirrorTx(ctx, tx, id); err != nil {
			return err
		}
		for _, q := range []string{
			`DELETE FROM events WHERE session_id = ?`,
			`DELETE FROM tokens WHERE session_id = ?`,
			`DELETE FROM sessions WHERE id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		return nil
	})
}

func (d *DB) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sessiondb: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		if errors.Is(err, ErrNotFound) || strings.HasPrefix(err.Error(), "sessiondb:") {
			return err
		}
		return fmt.Errorf("sessiondb: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sessiondb: commit: %w", err)
	}
	return nil
}
