package sessiondb

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"agentkit/keys"
)

// TestPlainTokensOfAnEarlierBuildBecomeDigests: a session database an
// earlier build wrote, with plain continuation tokens in both tables, is
// rewritten at Open: the tokens still resolve, and no file of the
// database holds one. Opening again changes nothing.
func TestPlainTokensOfAnEarlierBuildBecomeDigests(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sessions.db")
	db, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	const tokA, tokB = "plain-token-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "plain-token-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO sessions (id, channel_id, title, created_at, updated_at, turns, last_seq, last_status, token, mirrored_seq, batches, index_key, token_mirrored) VALUES ('a', 'http', '', 0, 0, 1, 1, '', '` + tokA + `', 0, 0, '', 0)`,
		`INSERT INTO sessions (id, channel_id, title, created_at, updated_at, turns, last_seq, last_status, token, mirrored_seq, batches, index_key, token_mirrored) VALUES ('b', 'http', '', 0, 0, 1, 1, '', '` + tokB + `', 0, 0, '', 0)`,
		`INSERT INTO tokens (token, session_id) VALUES ('` + tokA + `', 'a'), ('` + tokB + `', 'b')`,
	} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	raw.Close()
	for range 2 {
		db, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		noPlainTokens(t, path, tokA, tokB) // while the database is open
		for tok, want := range map[string]string{tokA: "a", tokB: "b"} {
			if id, err := db.SessionOfDigest(ctx, keys.TokenDigest(tok)); err != nil || id != want {
				t.Errorf("SessionOfToken(%s) = %q, %v; want %q", tok[:13], id, err, want)
			}
		}
		if m, err := db.Get(ctx, "a"); err != nil || m.TokenDigest != keys.TokenDigest(tokA) {
			t.Errorf("session a's row: %+v, %v; want the digest of its token", m, err)
		}
		db.Close()
	}
	noPlainTokens(t, path, tokA, tokB)
}

// noPlainTokens fails the test if a file of the database at path holds
// one of tokens.
func noPlainTokens(t *testing.T, path string, tokens ...string) {
	t.Helper()
	files, _ := filepath.Glob(path + "*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range tokens {
			if bytes.Contains(b, []byte(tok)) {
				t.Errorf("%s still holds a plain token", filepath.Base(f))
			}
		}
	}
}
