package sessiondb

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
)

// Checkpoint copies the write-ahead log into the database file and
// truncates the log (PRAGMA wal_checkpoint(TRUNCATE)), so that what a
// delete removed no longer lingers in sessions.db-wal. The database runs
// with secure_delete on, so the deleted rows are zeroed in the pages the
// checkpoint writes.
func (d *DB) Checkpoint(ctx context.Context) error {
	return checkpoint(ctx, d.db)
}

// CheckpointFile checkpoints and truncates the write-ahead log of the
// SQLite database at path through a connection of its own, for a database
// another part of the process has open (such as a format-1 kv/kv.db).
func CheckpointFile(ctx context.Context, path string) error {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return fmt.Errorf("sessiondb: opening %s: %w", path, err)
	}
	defer db.Close()
	return checkpoint(ctx, db)
}

func checkpoint(ctx context.Context, db *sql.DB) error {
	var busy, logFrames, done int
	if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logFrames, &done); err != nil {
		return fmt.Errorf("sessiondb: checkpoint: %w", err)
	}
	if busy != 0 {
		return fmt.Errorf("sessiondb: checkpoint: the database is busy (%d of %d log frames copied); the log is truncated at a later checkpoint", done, logFrames)
	}
	return nil
}
