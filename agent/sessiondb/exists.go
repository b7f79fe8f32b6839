package sessiondb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"

	"agentkit/internal/privfile"
)

// Exists reports whether the session database at path holds the session
// id. It only reads: it creates nothing and changes no schema, so tools may
// call it beside a running server (agentkit actor does). A missing file
// holds no session.
func Exists(ctx context.Context, path, id string) (bool, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err := privfile.TightenSQLite(path); err != nil {
		return false, fmt.Errorf("sessiondb: %w", err)
	}
	q := url.Values{}
	q.Set("mode", "rw")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "query_only(1)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return false, fmt.Errorf("sessiondb: opening %s: %w", path, err)
	}
	defer db.Close()
	var one int
	err = db.QueryRowContext(ctx, `SELECT 1 FROM sessions WHERE id = ?`, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sessiondb: reading %s: %w", path, err)
	}
	return true, nil
}
