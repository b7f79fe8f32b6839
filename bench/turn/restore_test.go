package turnbench

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"agentkit/agent"
	"agentkit/bench/pair"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/sqlitekv"
)

// restoreSessions is how many sessions BenchmarkRestore restores: the
// default restore policy's MaxSessions.
const restoreSessions = 1_000

// restoreTurns is the number of turns of every restored session: one
// event batch each, so a session is its head, its metadata and two
// batches.
const restoreTurns = 2

// rawLister reads every key under a prefix with its value, in key order,
// straight from the store's table through its own client: the reference
// of restore. The key and value passed to fn are valid during the call.
type rawLister interface {
	scan(ctx context.Context, prefix string, fn func(key string, value []byte)) error
	Close() error
}

// prefixEnd is the first key after every key starting with prefix (the
// prefixes here end in '/').
func prefixEnd(prefix string) string {
	return prefix[:len(prefix)-1] + string(prefix[len(prefix)-1]+1)
}

// rows is what both clients' results have in common.
type rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}

// scanRows calls fn for every row of (key, value).
func scanRows(r rows, fn func(string, []byte)) error {
	var k string
	var v []byte
	for r.Next() {
		if err := r.Scan(&k, &v); err != nil {
			return err
		}
		fn(k, v)
	}
	return r.Err()
}

// sqliteLister reads the kv table of a sqlitekv file (see kv/sqlitekv:
// key TEXT PRIMARY KEY, value BLOB) with one prepared range query.
type sqliteLister struct {
	db   *sql.DB
	stmt *sql.Stmt
}

func openSQLiteLister(ctx context.Context, path string) (*sqliteLister, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=query_only(1)")
	if err != nil {
		return nil, err
	}
	stmt, err := db.PrepareContext(ctx, `SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key`)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &sqliteLister{db: db, stmt: stmt}, nil
}

func (l *sqliteLister) scan(ctx context.Context, prefix string, fn func(string, []byte)) error {
	r, err := l.stmt.QueryContext(ctx, prefix, prefixEnd(prefix))
	if err != nil {
		return err
	}
	defer r.Close()
	return scanRows(r, fn)
}

func (l *sqliteLister) Close() error { return errors.Join(l.stmt.Close(), l.db.Close()) }

// pgLister reads a pgkv table (see kv/pgkv: key text COLLATE "C", value
// bytea) with one range query through a pgx pool, which prepares and
// caches the statement.
type pgLister struct {
	pool *pgxpool.Pool
	q    string
}

func openPGLister(ctx context.Context, serverURL, table string) (*pgLister, error) {
	pool, err := pgxpool.New(ctx, serverURL)
	if err != nil {
		return nil, err
	}
	return &pgLister{pool: pool, q: `SELECT key, value FROM ` + pgx.Identifier{table}.Sanitize() + ` WHERE key >= $1 AND key < $2 ORDER BY key`}, nil
}

func (l *pgLister) scan(ctx context.Context, prefix string, fn func(string, []byte)) error {
	r, err := l.pool.Query(ctx, l.q, prefix, prefixEnd(prefix))
	if err != nil {
		return err
	}
	defer r.Close()
	return scanRows(r, fn)
}

func (l *pgLister) Close() error { l.pool.Close(); return nil }

// rawRestoreRead reads exactly the keys restore needs, the best way the
// raw client allows: one range read of the session index, then for every
// session it names one range read of the session's folder (its head,
// metadata and event batches; nothing else is stored there). It returns how many
// sessions and keys it read.
func rawRestoreRead(ctx context.Context, l rawLister, scope keys.Scope) (sessions, n int, err error) {
	prefix := scope.SessionIndexPrefix()
	var segs []string
	err = l.scan(ctx, prefix, func(k string, _ []byte) {
		n++
		if _, seg, ok := keys.ParseSessionIndex(prefix, k); ok {
			segs = append(segs, seg)
		}
	})
	if err != nil {
		return 0, n, err
	}
	if len(segs) != n {
		return 0, n, fmt.Errorf("%d of %d session-index keys are malformed", n-len(segs), n)
	}
	for _, seg := range segs {
		if err := l.scan(ctx, scope.SessionsPrefix()+seg+"/", func(string, []byte) { n++ }); err != nil {
			return sessions, n, err
		}
		sessions++
	}
	return sessions, n, nil
}

// rawCopyBatch is how many sessions one transaction of rawCopy holds, as
// restore's imports do.
const rawCopyBatch = 128

// rawCopy is the floor of restore: rawRestoreRead's reads, and the least a
// restore must add to them, every value read written durably to a fresh
// local SQLite file with the runtime's durability (WAL, synchronous=FULL),
// as it was read (no decoding), through one prepared INSERT, rawCopyBatch
// sessions a transaction. It returns how many keys it copied.
func rawCopy(ctx context.Context, l rawLister, scope keys.Scope, path string) (n int, err error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, `CREATE TABLE copy (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID`); err != nil {
		return 0, err
	}
	ins, err := db.PrepareContext(ctx, `INSERT INTO copy (key, value) VALUES (?, ?)`)
	if err != nil {
		return 0, err
	}
	defer ins.Close()
	var tx *sql.Tx
	var st *sql.Stmt
	copyKV := func(k string, v []byte) {
		if err != nil {
			return
		}
		n++
		_, err = st.ExecContext(ctx, k, v)
	}
	begin := func() {
		if tx, err = db.BeginTx(ctx, nil); err == nil {
			st = tx.StmtContext(ctx, ins)
		}
	}
	prefix := scope.SessionIndexPrefix()
	var segs []string
	begin()
	if err != nil {
		return n, err
	}
	if err := l.scan(ctx, prefix, func(k string, v []byte) {
		copyKV(k, v)
		if _, seg, ok := keys.ParseSessionIndex(prefix, k); ok {
			segs = append(segs, seg)
		}
	}); err != nil {
		return n, errors.Join(err, tx.Rollback())
	}
	for i, seg := range segs {
		if serr := l.scan(ctx, scope.SessionsPrefix()+seg+"/", copyKV); serr != nil {
			return n, errors.Join(serr, tx.Rollback())
		}
		if (i+1)%rawCopyBatch == 0 || i == len(segs)-1 {
			if err != nil {
				return n, errors.Join(err, tx.Rollback())
			}
			if err = tx.Commit(); err != nil {
				return n, err
			}
			if i < len(segs)-1 {
				if begin(); err != nil {
					return n, err
				}
			}
		}
	}
	return n, err
}

// restoreStore is a store holding the mirrored sessions of an agent, and
// a raw client on the same table.
type restoreStore struct {
	store    *kv.DB
	raw      rawLister
	sessions int
	keys     int // the keys restore needs: index entries, heads, metadata, batches
}

// buildRestoreStore makes the sqlitekv file path hold n sessions of
// turns turns each, as a runtime mirrors them. It runs one session through
// a runtime on a state root in dir (the template: its head, metadata,
// event batches, session-index entry and continuation token are what the
// runtime wrote), then copies the template's keys and values n-1 times,
// each copy with another session id and token digest put in place of the
// template's wherever they appear. The copies are written with
// synchronous=NORMAL (no fsync per key) to build quickly; the store is
// then reopened with the default, synchronous=FULL.
func buildRestoreStore(ctx context.Context, dir, path string, n, turns int) (*kv.DB, error) {
	store, err := sqlitekv.Open(ctx, path, &sqlitekv.Options{Synchronous: sqlitekv.SyncNormal})
	if err != nil {
		return nil, err
	}
	err = func() error {
		builder := filepath.Join(dir, "builder")
		rt, err := openRuntime(ctx, builder, store, nil)
		if err != nil {
			return err
		}
		res, err := rt.StartSession(ctx, agent.StartRequest{Message: text(0)})
		for t := 1; err == nil && t < turns; t++ {
			_, err = rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: text(t)})
		}
		if err == nil && rt.Info().MirrorDropped != 0 {
			err = fmt.Errorf("%d mirror writes were dropped", rt.Info().MirrorDropped)
		}
		if err := errors.Join(err, rt.Close(), os.RemoveAll(builder)); err != nil {
			return err
		}
		var template []kv.Entry
		digest := keys.TokenDigest(res.ContinuationToken) // the store has only the token's digest
		for e, err := range store.List(ctx, keys.Root) {
			if err != nil {
				return err
			}
			if k, err := keys.Parse(e.Key); err == nil && k.Family == keys.FamilyMigration {
				continue // the agent's, not the session's: once is enough
			}
			if !strings.Contains(e.Key, res.SessionID) && !strings.Contains(e.Key, digest) {
				return fmt.Errorf("the template's key %s names neither its session nor its token's digest", e.Key)
			}
			template = append(template, e)
		}
		if want := turns + 4; len(template) != want {
			return fmt.Errorf("the template session left %d keys in the store; want %d (head, metadata, %d batches, index entry, token)", len(template), want, turns)
		}
		for i := 1; i < n; i++ {
			id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			sum := sha256.Sum256([]byte(id))
			token := base64.RawURLEncoding.EncodeToString(sum[:])[:len(res.ContinuationToken)]
			r := strings.NewReplacer(res.SessionID, id, digest, keys.TokenDigest(token))
			for _, e := range template {
				if err := store.Put(ctx, r.Replace(e.Key), []byte(r.Replace(string(e.Value)))); err != nil {
					return err
				}
			}
		}
		return nil
	}()
	if err := errors.Join(err, store.Close()); err != nil {
		return nil, err
	}
	return sqlitekv.Open(ctx, path, nil)
}

// openSQLiteRestore builds n sessions in a sqlitekv store file in dir.
func openSQLiteRestore(ctx context.Context, dir string, n, turns int) (*restoreStore, error) {
	path := filepath.Join(dir, "store.db")
	store, err := buildRestoreStore(ctx, dir, path, n, turns)
	if err != nil {
		return nil, err
	}
	raw, err := openSQLiteLister(ctx, path)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return &restoreStore{store: store, raw: raw, sessions: n, keys: n * (3 + turns)}, nil
}

// copyToPG copies every key of src to a fresh pgkv table of the
// PostgreSQL server, in one COPY (restore reads keys and values only; the
// table's versions are its own).
func copyToPG(ctx context.Context, tb testing.TB, src *restoreStore) (*restoreStore, func(context.Context) error, error) {
	store, table, drop, err := openPG(ctx, tb)
	if err != nil {
		return nil, nil, err
	}
	var rows [][]any
	for e, err := range src.store.List(ctx, keys.Root) {
		if err != nil {
			return nil, nil, errors.Join(err, drop(ctx))
		}
		rows = append(rows, []any{e.Key, e.Value})
	}
	raw, err := openPGLister(ctx, pgServer(tb), table)
	if err != nil {
		return nil, nil, errors.Join(err, drop(ctx))
	}
	release := func(ctx context.Context) error { return errors.Join(raw.Close(), drop(ctx)) }
	if _, err := raw.pool.CopyFrom(ctx, pgx.Identifier{table}, []string{"key", "value"}, pgx.CopyFromRows(rows)); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("copying the sessions to PostgreSQL: %w", err), release(ctx))
	}
	return &restoreStore{store: store, raw: raw, sessions: src.sessions, keys: src.keys}, release, nil
}

// restoreOps returns the three sides of BenchmarkRestore on rs:
//
//   - restore: agent.Open on a fresh state root whose store is rs, with
//     the default restore policy (1,000 sessions at most), which restores
//     every session before it returns;
//   - open: agent.Open on a fresh state root with restore off: the fixed
//     cost of opening a runtime that restore adds to;
//   - raw: rawRestoreRead on the raw client.
//
// The runtimes are closed and their folders removed after each call,
// untimed, once restore's result is checked: every session is on local
// disk with its events.
func restoreOps(ctx context.Context, dir string, rs *restoreStore, scope keys.Scope) []pair.Op {
	var rt *agent.Runtime
	var root string
	fresh := func(i int) error {
		root = filepath.Join(dir, fmt.Sprintf("root-%d", i))
		return nil
	}
	open := func(off bool) func(int) error {
		return func(int) error {
			cfg, err := runtimeConfig(root, rs.store, nil)
			if err != nil {
				return err
			}
			cfg.Policy.Restore.Off = off
			rt, err = agent.Open(ctx, cfg)
			return err
		}
	}
	closeRT := func(want int) func(int) error {
		return func(int) error {
			page, err := rt.ListSessions(ctx, agent.MaxPageSize, "")
			if err == nil && len(page.Sessions) != want {
				err = fmt.Errorf("the runtime opened with %d sessions on local disk; want %d", len(page.Sessions), want)
			}
			if err == nil && want > 0 {
				s := page.Sessions[len(page.Sessions)-1]
				if s.LastSeq != int64(3*restoreTurnsOf(rs)) {
					err = fmt.Errorf("restored session %s has %d events; want %d", s.ID, s.LastSeq, 3*restoreTurnsOf(rs))
				}
			}
			return errors.Join(err, rt.Close(), os.RemoveAll(root))
		}
	}
	return []pair.Op{
		{Name: "restore", Before: fresh, Run: open(false), After: closeRT(rs.sessions)},
		{Name: "open", Before: fresh, Run: open(true), After: closeRT(0)},
		{Name: "raw", Run: func(int) error {
			sessions, n, err := rawRestoreRead(ctx, rs.raw, scope)
			if err == nil && (sessions != rs.sessions || n != rs.keys) {
				err = fmt.Errorf("the raw client read %d sessions and %d keys; want %d and %d", sessions, n, rs.sessions, rs.keys)
			}
			return err
		}},
		{Name: "floor", Before: fresh, Run: func(i int) error {
			if err := os.MkdirAll(root, 0o755); err != nil {
				return err
			}
			n, err := rawCopy(ctx, rs.raw, scope, filepath.Join(root, "copy.db"))
			if err == nil && n != rs.keys {
				err = fmt.Errorf("the raw copy wrote %d keys; want %d", n, rs.keys)
			}
			return err
		}, After: func(int) error { return os.RemoveAll(root) }},
	}
}

// restoreTurnsOf is the turns of every session of rs.
func restoreTurnsOf(rs *restoreStore) int { return rs.keys/rs.sessions - 3 }

// BenchmarkRestore alternates, on the embedded SQLite store (a sqlitekv
// file, WAL, synchronous=FULL) and on PostgreSQL (kv/pgkv), a runtime's
// start-up restore of 1,000 sessions of two turns (a runtime opened on a
// fresh state root), the same open with restore off, the raw client
// reading the session index and every session's folder (rawRestoreRead:
// 1 + 1,000 range reads, 5,000 keys: what restore reads), and the floor,
// those reads plus every value written durably to a local SQLite file
// (rawCopy). It reports restore/raw (the target: at most 2),
// restore/floor, floor/raw and restore-open/raw, the restore's own share.
func BenchmarkRestore(b *testing.B) {
	scope, err := keys.Agent(agentName)
	if err != nil {
		b.Fatal(err)
	}
	sqliteStore := func(b *testing.B) *restoreStore {
		return shared(b, "restore/sqlite", func(ctx context.Context, dir string) (*restoreStore, func(context.Context) error, error) {
			rs, err := openSQLiteRestore(ctx, dir, restoreSessions, restoreTurns)
			if err != nil {
				return nil, nil, err
			}
			return rs, func(context.Context) error { return errors.Join(rs.raw.Close(), rs.store.Close()) }, nil
		})
	}
	for _, db := range []string{"sqlite", "postgres"} {
		b.Run("store="+db, func(b *testing.B) {
			rs := sqliteStore(b)
			if db == "postgres" {
				rs = shared(b, "restore/postgres", func(ctx context.Context, _ string) (*restoreStore, func(context.Context) error, error) {
					return copyToPG(ctx, b, rs)
				})
			}
			t := pair.Loop(b, restoreOps(b.Context(), b.TempDir(), rs, scope),
				pair.Ratio{Num: "restore", Den: "raw"},
				pair.Ratio{Num: "restore", Den: "floor"},
				pair.Ratio{Num: "floor", Den: "raw"},
				pair.Ratio{Num: "open", Den: "raw"})
			if raw := t.Mean("raw"); raw > 0 {
				b.ReportMetric(float64(t.Mean("restore")-t.Mean("open"))/float64(raw), "restore-open/raw")
			}
		})
	}
}

// TestRestoreSidesReadTheSameSessions builds a few sessions on both
// stores and runs BenchmarkRestore's sides: restore loads every session
// with its events (checked after each call), and the raw client reads the
// index entry, head, metadata and batches of each.
func TestRestoreSidesReadTheSameSessions(t *testing.T) {
	ctx := t.Context()
	scope, err := keys.Agent(agentName)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const sessions = 6
	rs, err := openSQLiteRestore(ctx, dir, sessions, restoreTurns)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.store.Close()
	defer rs.raw.Close()
	stores := map[string]*restoreStore{"sqlite": rs}
	if !testing.Short() {
		pg, drop, err := copyToPG(ctx, t, rs)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := drop(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		stores["postgres"] = pg
	}
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			if s.keys != sessions*(3+restoreTurns) {
				t.Fatalf("the fixture counts %d keys; want %d", s.keys, sessions*(3+restoreTurns))
			}
			for i, op := range restoreOps(ctx, t.TempDir(), s, scope) {
				for _, f := range []func(int) error{op.Before, op.Run, op.After} {
					if f == nil {
						continue
					}
					if err := f(i); err != nil {
						t.Fatalf("%s: %v", op.Name, err)
					}
				}
			}
		})
	}
}
