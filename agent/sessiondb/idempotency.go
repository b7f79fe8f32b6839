package sessiondb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// idempotencySchema indexes the Idempotency-Keys of turns. A key travels in
// its turn's turn.started event (the event's JSON holds
// {"idempotency": {"route", "key", "hash"}}), so it moves with the session's
// events to other hosts; the idempotency table is derived from the events
// table by triggers, so every way events arrive (a turn recorded here, a
// session imported from the store) indexes its keys, and every way they
// leave (a deleted session, events replaced) drops them.
const idempotencySchema = `
CREATE TABLE IF NOT EXISTS idempotency (
	route      TEXT NOT NULL,
	key        TEXT NOT NULL,
	session_id TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	hash       TEXT NOT NULL,
	PRIMARY KEY (route, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_by_session ON idempotency (session_id, seq);
CREATE TRIGGER IF NOT EXISTS events_index_idempotency AFTER INSERT ON events
WHEN new.type = 'turn.started'
	AND json_valid(CAST(new.data AS TEXT))
	AND json_type(CAST(new.data AS TEXT), '$.idempotency.key') = 'text'
BEGIN
	INSERT OR IGNORE INTO idempotency (route, key, session_id, seq, hash) VALUES (
		COALESCE(json_extract(CAST(new.data AS TEXT), '$.idempotency.route'), ''),
		json_extract(CAST(new.data AS TEXT), '$.idempotency.key'),
		new.session_id,
		new.seq,
		COALESCE(json_extract(CAST(new.data AS TEXT), '$.idempotency.hash'), ''));
END;
CREATE TRIGGER IF NOT EXISTS events_unindex_idempotency AFTER DELETE ON events
WHEN old.type = 'turn.started'
BEGIN
	DELETE FROM idempotency WHERE session_id = old.session_id AND seq = old.seq;
END;
`

// KeyedTurn is the turn a client's Idempotency-Key started: where its
// turn.started event is, and the hash of the request that sent it.
type KeyedTurn struct {
	Route     string
	Key       string
	SessionID string
	Seq       int64
	Hash      string
}

// KeyedTurn returns the turn that route's Idempotency-Key key started, or
// ErrNotFound.
func (d *DB) KeyedTurn(ctx context.Context, route, key string) (KeyedTurn, error) {
	k := KeyedTurn{Route: route, Key: key}
	err := d.db.QueryRowContext(ctx, `SELECT session_id, seq, hash FROM idempotency WHERE route = ? AND key = ?`, route, key).Scan(&k.SessionID, &k.Seq, &k.Hash)
	if errors.Is(err, sql.ErrNoRows) {
		return KeyedTurn{}, ErrNotFound
	}
	if err != nil {
		return KeyedTurn{}, fmt.Errorf("sessiondb: looking up an idempotency key: %w", err)
	}
	return k, nil
}
