package sessiondb

import (
	"context"
	"database/sql"
	"fmt"

	"agentkit/keys"
)

// AddToken records another continuation token of a session, by its digest
// (keys.TokenDigest): a session may have several (a keyed request answered
// again gets a token of its own).
func (tx *Tx) AddToken(digest, sessionID string) error {
	if !keys.IsTokenDigest(digest) {
		return fmt.Errorf("sessiondb: AddToken takes the token's digest (keys.TokenDigest), not the token")
	}
	_, err := tx.exec(`INSERT OR REPLACE INTO tokens (token, session_id) VALUES (?, ?)`, digest, sessionID)
	return err
}

// digestTokens rewrites the continuation tokens an earlier build stored in
// plain (in the sessions and tokens tables) as their digests, in one
// transaction, then checkpoints the write-ahead log so that no copy of a
// plain token is left in it. It is idempotent: a digest is never a token
// (keys.IsTokenDigest), so a finished migration finds nothing to do, and
// an interrupted one (nothing committed) starts over.
func digestTokens(ctx context.Context, conn *sql.Conn) error {
	var plain int
	err := conn.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM tokens WHERE length(token) != 64) + (SELECT count(*) FROM sessions WHERE token != '' AND length(token) != 64)`).Scan(&plain)
	if err != nil {
		return fmt.Errorf("counting plain tokens: %w", err)
	}
	if plain == 0 {
		return nil
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, table := range []struct{ sel, upd string }{
		{`SELECT token FROM tokens WHERE length(token) != 64`, `UPDATE OR REPLACE tokens SET token = ? WHERE token = ?`},
		{`SELECT DISTINCT token FROM sessions WHERE token != '' AND length(token) != 64`, `UPDATE sessions SET token = ? WHERE token = ?`},
	} {
		rows, err := tx.QueryContext(ctx, table.sel)
		if err != nil {
			return err
		}
		var tokens []string
		for rows.Next() {
			var t string
			if err := rows.Scan(&t); err != nil {
				rows.Close()
				return err
			}
			if !keys.IsTokenDigest(t) {
				tokens = append(tokens, t)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, t := range tokens {
			if _, err := tx.ExecContext(ctx, table.upd, keys.TokenDigest(t), t); err != nil {
				return fmt.Errorf("storing a token's digest: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return fmt.Errorf("checkpointing after the token migration: %w", err)
	}
	return nil
}
