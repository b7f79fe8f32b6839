package sessiondb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// mirrorSchema holds what the runtime knows of each session's copy in the
// store beyond the columns of sessions (mirrored_seq, batches, index_key,
// token_mirrored), and the events of turns that lost the session head to
// another host (forks). A session without a mirror row has never committed
// with a head: its batch id is unknown and its metadata is as far as its
// mirrored events.
const mirrorSchema = `
CREATE TABLE IF NOT EXISTS mirror (
	session_id   TEXT PRIMARY KEY,
	batch_id     TEXT NOT NULL,
	meta_seq     INTEGER NOT NULL,
	pending_id   TEXT NOT NULL,
	pending_seq  INTEGER NOT NULL,
	pending_meta BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS forked_events (
	session_id TEXT NOT NULL,
	fork       INTEGER NOT NULL,
	seq        INTEGER NOT NULL,
	at         INTEGER NOT NULL,
	type       TEXT NOT NULL,
	data       BLOB NOT NULL,
	lost_to    TEXT NOT NULL,
	forked_at  INTEGER NOT NULL,
	PRIMARY KEY (session_id, fork, seq)
) WITHOUT ROWID;
`

// MirrorState is what the runtime knows of a session's copy in the store.
type MirrorState struct {
	// MirroredSeq is the last event committed to the store.
	MirroredSeq int64
	// Batch and BatchID name the session's last batch in the store, the
	// one its head named when this host last committed or read it.
	// BatchID is empty for a batch written before heads existed.
	Batch   int64
	BatchID string
	// IndexKey is the session-index entry last written for the session.
	IndexKey string
	// TokenMirrored is true once the continuation token is in the store.
	TokenMirrored bool
	// MetaSeq is the MirroredSeq the stored metadata and index entry
	// reflect: they are owed while it is below MirroredSeq.
	MetaSeq int64
	// PendingID, PendingSeq and PendingMeta describe a commit whose
	// outcome is not known yet (the store failed): its batch id, its last
	// event and its metadata (JSON), to be retried exactly as it was.
	PendingID   string
	PendingSeq  int64
	PendingMeta []byte
}

// Settled reports whether everything up to the last committed batch is in
// the store: its metadata and index entry, and the token once a batch is.
// A pending commit is not looked at.
func (s MirrorState) Settled() bool {
	return s.MetaSeq >= s.MirroredSeq && (s.TokenMirrored || s.MirroredSeq == 0)
}

// Owes reports whether the store lacks something of the session, given its
// last event: events, a pending commit, the metadata, the index entry or
// the token.
func (s MirrorState) Owes(lastSeq int64) bool {
	return s.PendingID != "" || lastSeq > s.MirroredSeq || s.MetaSeq < s.MirroredSeq ||
		(!s.TokenMirrored && s.MirroredSeq > 0)
}

const mirrorCols = `s.mirrored_seq, s.batches, s.index_key, s.token_mirrored,
	COALESCE(m.batch_id, ''), COALESCE(m.meta_seq, s.mirrored_seq), COALESCE(m.pending_id, ''),
	COALESCE(m.pending_seq, 0), COALESCE(m.pending_meta, x'')`

// getMirror reads a session's row and its mirror state in one query.
const getMirror = `SELECT s.id, s.channel_id, s.title, s.created_at, s.updated_at, s.turns, s.last_seq, s.last_status, s.token,
	` + mirrorCols + ` FROM sessions s LEFT JOIN mirror m ON m.session_id = s.id WHERE s.id = ?`

func scanMirror(row interface{ Scan(...any) error }) (Meta, MirrorState, error) {
	var m Meta
	var st MirrorState
	var created, updated int64
	err := row.Scan(&m.ID, &m.ChannelID, &m.Title, &created, &updated, &m.Turns, &m.LastSeq, &m.LastStatus, &m.TokenDigest,
		&st.MirroredSeq, &st.Batch, &st.IndexKey, &st.TokenMirrored,
		&st.BatchID, &st.MetaSeq, &st.PendingID, &st.PendingSeq, &st.PendingMeta)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return m, st, ErrNotFound
		}
		return m, st, fmt.Errorf("sessiondb: %w", err)
	}
	m.CreatedAt = time.Unix(0, created).UTC()
	m.UpdatedAt = time.Unix(0, updated).UTC()
	m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored = st.MirroredSeq, st.Batch, st.IndexKey, st.TokenMirrored
	return m, st, nil
}

// Mirror returns a session's row and its mirror state, or ErrNotFound.
func (d *DB) Mirror(ctx context.Context, id string) (Meta, MirrorState, error) {
	return scanMirror(d.queryRow(ctx, getMirror, id))
}

// Mirror returns a session's row and mirror state as the write sees them.
func (tx *Tx) Mirror(id string) (Meta, MirrorState, error) {
	return scanMirror(tx.queryRow(getMirror, id))
}

// SetMirror records a session's mirror state. A session deleted meanwhile
// is ErrNotFound.
func (d *DB) SetMirror(ctx context.Context, id string, st MirrorState) error {
	return d.Write(ctx, func(tx *Tx) error { return tx.SetMirror(id, st) })
}

// SetMirror records a session's mirror state (see DB.SetMirror).
func (tx *Tx) SetMirror(id string, st MirrorState) error {
	res, err := tx.exec(`UPDATE sessions SET mirrored_seq = ?, batches = ?, index_key = ?, token_mirrored = ? WHERE id = ?`,
		st.MirroredSeq, st.Batch, st.IndexKey, st.TokenMirrored, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	if st.PendingMeta == nil {
		st.PendingMeta = []byte{}
	}
	_, err = tx.exec(`INSERT OR REPLACE INTO mirror (session_id, batch_id, meta_seq, pending_id, pending_seq, pending_meta) VALUES (?,?,?,?,?,?)`,
		id, st.BatchID, st.MetaSeq, st.PendingID, st.PendingSeq, st.PendingMeta)
	return err
}

// Backlog returns the ids of the sessions the store lacks something of
// (MirrorState.Owes): events not committed (a process that died before its
// turn-end flush, or a store that failed), a pending commit, metadata, an
// index entry or a token.
func (d *DB) Backlog(ctx context.Context) ([]string, error) {
	rows, err := d.query(ctx, `SELECT s.id FROM sessions s LEFT JOIN mirror m ON m.session_id = s.id
		WHERE s.last_seq > s.mirrored_seq OR COALESCE(m.pending_id, '') != ''
		OR COALESCE(m.meta_seq, s.mirrored_seq) < s.mirrored_seq
		OR (s.token_mirrored = 0 AND s.mirrored_seq > 0)`)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("sessiondb: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// Adopt makes the store's history the session's: recs are the store's
// events after the last batch both copies share (all of them when they
// share none), m the session's row as the store has it and st the mirror
// state after it. Local events that the store's do not repeat byte for
// byte, from the first that differs on, are moved to the session's forked
// events (lostTo names the host whose head won) and replaced by the
// store's, all in one transaction. It returns how many local events were
// forked. A session not here is ErrNotFound.
func (d *DB) Adopt(ctx context.Context, m Meta, recs []Record, st MirrorState, lostTo string, now time.Time) (int, error) {
	n, _, err := d.AdoptFork(ctx, m, recs, st, lostTo, now, nil)
	return n, err
}

// ForkRecord makes the event that records a fork in the session's own
// history: forked are the local events that lost (in sequence order),
// after the seq of the last event both copies share; the event takes
// sequence number seq and turn number turn.
type ForkRecord func(forked []Record, after, seq, turn int64) (Record, error)

// AdoptFork is Adopt, and when local events are forked it also appends,
// after the store's events and in the same transaction, the event record
// makes of them (the session's row takes its sequence and turn numbers):
// the fork becomes part of the session's history, which the mirror owes
// the store like any event. It also returns the events it appended, in
// order: the store's that were not here, then the fork's.
func (d *DB) AdoptFork(ctx context.Context, m Meta, recs []Record, st MirrorState, lostTo string, now time.Time, record ForkRecord) (int, []Record, error) {
	var forked int
	var appended []Record
	err := d.Write(ctx, func(tx *Tx) error {
		var err error
		forked, appended, err = tx.adopt(m, recs, st, lostTo, now, record)
		return err
	})
	return forked, appended, err
}

// Adopt makes the store's history the session's (see DB.Adopt).
func (tx *Tx) Adopt(m Meta, recs []Record, st MirrorState, lostTo string, now time.Time) (int, error) {
	n, _, err := tx.adopt(m, recs, st, lostTo, now, nil)
	return n, err
}

func (tx *Tx) adopt(m Meta, recs []Record, st MirrorState, lostTo string, now time.Time, record ForkRecord) (int, []Record, error) {
	var lastSeq int64
	if err := tx.queryRow(`SELECT last_seq FROM sessions WHERE id = ?`, m.ID).Scan(&lastSeq); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil, ErrNotFound
		}
		return 0, nil, err
	}
	// The first local event that differs from the store's.
	from := st.MirroredSeq + 1
	if len(recs) > 0 {
		from = recs[0].Seq
	}
	rows, err := tx.query(`SELECT seq, data FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq`, m.ID, from)
	if err != nil {
		return 0, nil, err
	}
	byStore := map[int64][]byte{}
	for _, r := range recs {
		byStore[r.Seq] = r.Data
	}
	differ := int64(-1)
	for rows.Next() {
		var seq int64
		var data []byte
		if err := rows.Scan(&seq, &data); err != nil {
			rows.Close()
			return 0, nil, err
		}
		if s, ok := byStore[seq]; !ok || !bytes.Equal(s, data) {
			differ = seq
			break
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, nil, err
	}
	forked := 0
	var lost []Record
	keepUpTo := lastSeq // local events up to here equal the store's
	if differ >= 0 && record != nil {
		rows, err := tx.query(`SELECT seq, at, type, data FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq`, m.ID, differ)
		if err != nil {
			return 0, nil, err
		}
		for rows.Next() {
			r := Record{SessionID: m.ID}
			var at int64
			if err := rows.Scan(&r.Seq, &at, &r.Type, &r.Data); err != nil {
				rows.Close()
				return 0, nil, err
			}
			r.At = time.Unix(0, at).UTC()
			lost = append(lost, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, nil, err
		}
	}
	if differ >= 0 {
		keepUpTo = differ - 1
		var fork int64
		if err := tx.queryRow(`SELECT COALESCE(MAX(fork), 0) + 1 FROM forked_events WHERE session_id = ?`, m.ID).Scan(&fork); err != nil {
			return 0, nil, err
		}
		res, err := tx.exec(`INSERT INTO forked_events (session_id, fork, seq, at, type, data, lost_to, forked_at)
			SELECT session_id, ?, seq, at, type, data, ?, ? FROM events WHERE session_id = ? AND seq >= ?`,
			fork, lostTo, now.UnixNano(), m.ID, differ)
		if err != nil {
			return 0, nil, err
		}
		n, _ := res.RowsAffected()
		forked = int(n)
		if _, err := tx.exec(`DELETE FROM events WHERE session_id = ? AND seq >= ?`, m.ID, differ); err != nil {
			return 0, nil, err
		}
	}
	var fresh []Record
	for _, r := range recs {
		if r.Seq > keepUpTo {
			fresh = append(fresh, r)
		}
	}
	if err := tx.Append(fresh...); err != nil {
		return 0, nil, err
	}
	if len(lost) > 0 {
		rec, err := record(lost, differ-1, m.LastSeq+1, m.Turns+1)
		if err != nil {
			return 0, nil, err
		}
		rec.SessionID, rec.Seq = m.ID, m.LastSeq+1
		if err := tx.Append(rec); err != nil {
			return 0, nil, err
		}
		m.LastSeq, m.Turns, m.UpdatedAt = rec.Seq, m.Turns+1, rec.At
		fresh = append(fresh, rec)
	}
	if _, err := tx.exec(`UPDATE sessions SET channel_id = ?, title = ?, created_at = ?, updated_at = ?, turns = ?, last_seq = ?, last_status = ? WHERE id = ?`,
		m.ChannelID, m.Title, m.CreatedAt.UnixNano(), m.UpdatedAt.UnixNano(), m.Turns, m.LastSeq, m.LastStatus, m.ID); err != nil {
		return 0, nil, err
	}
	return forked, fresh, tx.SetMirror(m.ID, st)
}

// ImportMirrored stores a session loaded from the store with its events and
// mirror state, unless the session is already here. It reports whether it
// stored it.
func (d *DB) ImportMirrored(ctx context.Context, m Meta, recs []Record, st MirrorState) (bool, error) {
	var imported bool
	err := d.Write(ctx, func(tx *Tx) error {
		var err error
		imported, err = tx.ImportMirrored(m, recs, st)
		return err
	})
	return imported, err
}

// ImportMirrored stores a session loaded from the store (see
// DB.ImportMirrored). m's mirror fields are taken from st.
func (tx *Tx) ImportMirrored(m Meta, recs []Record, st MirrorState) (bool, error) {
	m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored = st.MirroredSeq, st.Batch, st.IndexKey, st.TokenMirrored
	res, err := tx.exec(`INSERT OR IGNORE INTO sessions (`+metaCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, metaArgs(m)...)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil // already here
	}
	if m.TokenDigest != "" {
		if _, err := tx.exec(`INSERT OR REPLACE INTO tokens (token, session_id) VALUES (?, ?)`, m.TokenDigest, m.ID); err != nil {
			return false, err
		}
	}
	if err := tx.Append(recs...); err != nil {
		return false, err
	}
	if st.PendingMeta == nil {
		st.PendingMeta = []byte{}
	}
	_, err = tx.exec(`INSERT OR REPLACE INTO mirror (session_id, batch_id, meta_seq, pending_id, pending_seq, pending_meta) VALUES (?,?,?,?,?,?)`,
		m.ID, st.BatchID, st.MetaSeq, st.PendingID, st.PendingSeq, st.PendingMeta)
	return err == nil, err
}

// ForkedEvent is one event of a turn that lost the session head to another
// host, kept here.
type ForkedEvent struct {
	Record
	// Fork numbers the session's forks from 1.
	Fork int64
	// LostTo is the host id of the head's winner.
	LostTo string
	// ForkedAt is when the events were moved aside.
	ForkedAt time.Time
}

// Forked returns a session's forked events, by fork then sequence number.
func (d *DB) Forked(ctx context.Context, id string) ([]ForkedEvent, error) {
	rows, err := d.query(ctx, `SELECT fork, seq, at, type, data, lost_to, forked_at FROM forked_events
		WHERE session_id = ? ORDER BY fork, seq`, id)
	if err != nil {
		return nil, fmt.Errorf("sessiondb: %w", err)
	}
	defer rows.Close()
	var out []ForkedEvent
	for rows.Next() {
		f := ForkedEvent{Record: Record{SessionID: id}}
		var at, forkedAt int64
		if err := rows.Scan(&f.Fork, &f.Seq, &at, &f.Type, &f.Data, &f.LostTo, &forkedAt); err != nil {
			return nil, fmt.Errorf("sessiondb: %w", err)
		}
		f.At, f.ForkedAt = time.Unix(0, at).UTC(), time.Unix(0, forkedAt).UTC()
		out = append(out, f)
	}
	return out, rows.Err()
}
