package sessiondb

import (
	"context"
	"database/sql"
	"fmt"
)

// Checkpoint copies the write-ahead log into the database file and
// truncates the log (PRAGMA wal_checkpoint(TRUNCATE)), so that what a
// delete removed no longer lingers in sessions.db-wal. The database runs
// with secure_delete on, so the deleted rows are zeroed in the pages the
// checkpoint writes.
func (d *DB) Checkpoint(ctx context.Context) error {
	return checkpoint(ctx, d.db)
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
