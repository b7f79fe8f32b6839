package actor

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"agentkit/actor/mergepatch"
)

// MaxPage is the most records Log.After and Log.Last return at once.
const MaxPage = 1000

// Record is one entry of a message history or an event log.
type Record struct {
	// Seq numbers the records of one log, increasing; the first appended
	// record is 1 (records migrated from the key-value layout keep their
	// numbers).
	Seq int64 `json:"seq"`
	// At is when the record was appended.
	At time.Time `json:"at"`
	// Type is the caller's label: a message's role, an event's kind.
	Type string `json:"type"`
	// Data is the record's JSON.
	Data json.RawMessage `json:"data"`
}

// Log is an append-only log of records: an actor's message history or its
// progress events. An actor's own logs live in its system database; a
// HistorySource can supply others.
type Log interface {
	// Append adds a record with the next sequence number and returns it.
	// data must be valid JSON (empty means null). It is durable when
	// Append returns.
	Append(ctx context.Context, typ string, data json.RawMessage) (Record, error)
	// Last returns the newest n records (at most MaxPage), oldest first.
	Last(ctx context.Context, n int) ([]Record, error)
	// After returns up to limit records (at most MaxPage; limit <= 0
	// means MaxPage) with Seq > after, oldest first. The Seq of the last
	// one is the cursor of the next page; an empty page is the end.
	After(ctx context.Context, after int64, limit int) ([]Record, error)
}

// HistorySource supplies the message and event logs of actors whose
// history lives elsewhere: a session actor's messages and events are views
// of the session's own events, not a second copy.
type HistorySource interface {
	// History returns the logs of the actor, or ok false to keep its logs
	// in its system database.
	History(class, id string) (messages, events Log, ok bool)
}

// Messages returns the actor's message history.
func (r *Ref) Messages() Log {
	if hs := r.h.opts.History; hs != nil {
		if m, _, ok := hs.History(r.class, r.id); ok {
			return m
		}
	}
	return &sysLog{r: r, table: "messages", legacyDir: "messages/"}
}

// Events returns the actor's progress events.
func (r *Ref) Events() Log {
	if hs := r.h.opts.History; hs != nil {
		if _, ev, ok := hs.History(r.class, r.id); ok {
			return ev
		}
	}
	return &sysLog{r: r, table: "events", legacyDir: "events/"}
}

// sysLog is a log in a table of the system database.
type sysLog struct {
	r         *Ref
	table     string // messages or events
	legacyDir string // its folder in the key-value layout
}

func (l *sysLog) Append(ctx context.Context, typ string, data json.RawMessage) (Record, error) {
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	d, err := mergepatch.Compact(data, l.table[:len(l.table)-1]+" data")
	if err != nil {
		return Record{}, fmt.Errorf("actor: %w", err)
	}
	rec := Record{At: time.Now().UTC(), Type: typ, Data: d}
	err = l.r.write(ctx, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `INSERT INTO `+l.table+` (seq, at, type, data)
			VALUES ((SELECT coalesce(max(seq), 0) + 1 FROM `+l.table+`), ?, ?, ?) RETURNING seq`,
			rec.At.UnixNano(), typ, []byte(d)).Scan(&rec.Seq)
	})
	if err != nil {
		return Record{}, fmt.Errorf("actor: appending to the %s of %s/%s: %w", l.table, l.r.class, l.r.id, err)
	}
	return rec, nil
}

func (l *sysLog) Last(ctx context.Context, n int) ([]Record, error) {
	n = min(n, MaxPage)
	if n <= 0 {
		return nil, nil
	}
	var recs []Record
	found, err := l.r.read(ctx, func(db *sql.DB) error {
		var err error
		recs, err = queryRecords(ctx, db, `SELECT seq, at, type, data FROM `+l.table+` ORDER BY seq DESC LIMIT ?`, n)
		for i, j := 0, len(recs)-1; i < j; i, j = i+1, j-1 {
			recs[i], recs[j] = recs[j], recs[i]
		}
		return err
	})
	if err != nil || found || !l.r.legacy() {
		return recs, err
	}
	all, err := l.r.legacyRecords(ctx, l.legacyDir)
	if err != nil {
		return nil, err
	}
	return all[max(0, len(all)-n):], nil
}

func (l *sysLog) After(ctx context.Context, after int64, limit int) ([]Record, error) {
	if limit <= 0 || limit > MaxPage {
		limit = MaxPage
	}
	var recs []Record
	found, err := l.r.read(ctx, func(db *sql.DB) error {
		var err error
		recs, err = queryRecords(ctx, db, `SELECT seq, at, type, data FROM `+l.table+` WHERE seq > ? ORDER BY seq LIMIT ?`, after, limit)
		return err
	})
	if err != nil || found || !l.r.legacy() {
		return recs, err
	}
	all, err := l.r.legacyRecords(ctx, l.legacyDir)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, rec := range all {
		if rec.Seq > after && len(out) < limit {
			out = append(out, rec)
		}
	}
	return out, nil
}

func queryRecords(ctx context.Context, db *sql.DB, q string, args ...any) ([]Record, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("actor: reading records: %w", err)
	}
	defer rows.Close()
	var recs []Record
	for rows.Next() {
		var rec Record
		var at int64
		var data []byte
		if err := rows.Scan(&rec.Seq, &at, &rec.Type, &data); err != nil {
			return nil, fmt.Errorf("actor: reading records: %w", err)
		}
		rec.At = time.Unix(0, at).UTC()
		rec.Data = data
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("actor: reading records: %w", err)
	}
	return recs, nil
}
