package actor

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
)

// SQL returns the actor's own SQL database (actors/{class}/{id}/data.db,
// SQLite in WAL mode with the Host's synchronous setting), separate from
// the system database that holds its state, logs and tasks. The author
// owns its schema. The same *sql.DB is returned on every call until the
// Host closes it; do not close it yourself. Its connections close when
// idle for Options.IdleTimeout, so an idle actor holds no file open.
// Calling SQL creates the actor's folder and the file.
func (r *Ref) SQL(ctx context.Context) (*sql.DB, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := r.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if db, ok := h.data[r.key]; ok {
		return db, nil
	}
	if err := mkdirs(r.dir); err != nil {
		return nil, err
	}
	path := filepath.Join(r.dir, dataFile)
	if err := touch0600(path); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn(path, "rw", "WAL", h.sync, false))
	if err != nil {
		return nil, fmt.Errorf("actor: opening %s: %w", path, err)
	}
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(h.opts.IdleTimeout)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("actor: opening %s: %w", path, err)
	}
	h.data[r.key] = db
	return db, nil
}
