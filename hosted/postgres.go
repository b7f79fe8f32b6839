package hosted

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPoolSize is the least number of PostgreSQL connections the service
// opens when the backend URL has no pool_max_conns (four per CPU when that
// is more).
const DefaultPoolSize = 16

// schemaFormat is the layout of the service's tables this build writes and
// reads, in both backends.
const schemaFormat = 1

// pgLockSpace is the first key of the advisory lock the PostgreSQL backend
// takes while creating its tables ("akhs").
const pgLockSpace = 0x616b6873

// pgStore is the PostgreSQL backend. Every write is one statement (see
// pgWrites), so it costs one round trip, like the pgkv driver's.
type pgStore struct {
	pool    *pgxpool.Pool
	p       string // table prefix
	ep      string
	secrets []string
	sql     pgStatements
}

type pgStatements struct {
	get, forget                                          string
	writes                                               [4]string // by writeOp
	putEval, deleteEval, listEvals                       string
	putSample, putSnapshot, getSnapshot                  string
	appendMemory, memoryReplay, listMemory               string
	listKeys, listValues, listKeysUpper, listValuesUpper string
}

func newPGStatements(p string) pgStatements {
	list := func(cols string, upper bool) string {
		q := "SELECT " + cols + " FROM " + p + "_kv WHERE ns = $1 AND key >= $2 AND key > $3"
		if upper {
			q += " AND key < $5"
		}
		return q + " ORDER BY key LIMIT $4"
	}
	values := fmt.Sprintf("key, CASE WHEN octet_length(value) <= %d THEN value END, octet_length(value)", inlineValueLimit)
	return pgStatements{
		get:    "SELECT value, version FROM " + p + "_kv WHERE ns = $1 AND key = $2",
		writes: pgWrites(p),
		forget: "DELETE FROM " + p + "_requests WHERE at < $1",

		putEval: "INSERT INTO " + p + "_eval_runs (ns, agent, run_id, snapshot) VALUES ($1, $2, $3, $4::json) " +
			"ON CONFLICT (ns, agent, run_id) DO UPDATE SET snapshot = EXCLUDED.snapshot, updated_at = now()",
		deleteEval: "DELETE FROM " + p + "_eval_runs WHERE ns = $1 AND agent = $2 AND run_id = $3",
		listEvals:  "SELECT run_id, snapshot::text FROM " + p + "_eval_runs WHERE ns = $1 AND agent = $2 AND run_id > $3 ORDER BY run_id LIMIT $4",

		putSample: "INSERT INTO " + p + "_ab_samples (ns, agent, experiment, variant, session_id, at, metrics) VALUES ($1, $2, $3, $4, $5, $6, $7::json) " +
			"ON CONFLICT (ns, agent, experiment, session_id, at) DO NOTHING",
		putSnapshot: "INSERT INTO " + p + "_ab_snapshots (ns, agent, snapshot) VALUES ($1, $2, $3::json) " +
			"ON CONFLICT (ns, agent) DO UPDATE SET snapshot = EXCLUDED.snapshot, updated_at = now()",
		getSnapshot: "SELECT snapshot::text FROM " + p + "_ab_snapshots WHERE ns = $1 AND agent = $2",

		// The head row's lock orders appends: an append takes the next
		// number while holding it until commit, so numbers commit in order
		// and a reader paging by number never skips one.
		appendMemory: "WITH dup AS (SELECT seq FROM " + p + "_memory WHERE ns = $1 AND agent = $2 AND request_id = $3), " +
			"h AS (INSERT INTO " + p + "_memory_heads AS h (ns, agent, last) SELECT $1, $2, 1 WHERE NOT EXISTS (SELECT 1 FROM dup) " +
			"ON CONFLICT (ns, agent) DO UPDATE SET last = h.last + 1 RETURNING last), " +
			"ins AS (INSERT INTO " + p + "_memory (ns, agent, seq, request_id, record) SELECT $1, $2, last, $3, $4::json FROM h RETURNING seq) " +
			"SELECT seq, false FROM ins UNION ALL SELECT seq, true FROM dup",
		memoryReplay: "SELECT seq FROM " + p + "_memory WHERE ns = $1 AND agent = $2 AND request_id = $3",
		listMemory:   "SELECT seq, record::text FROM " + p + "_memory WHERE ns = $1 AND agent = $2 AND seq > $3 ORDER BY seq LIMIT $4",

		listKeys:        list("key, NULL::bytea, 0::int", false),
		listValues:      list(values, false),
		listKeysUpper:   list("key, NULL::bytea, 0::int", true),
		listValuesUpper: list(values, true),
	}
}

// pgSchema creates the tables. %[1]s is the prefix.
const pgSchema = `
CREATE TABLE IF NOT EXISTS %[1]s_meta (
	id     int PRIMARY KEY CHECK (id = 1),
	format int NOT NULL,
	epoch  text NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS %[1]s_version AS bigint;
CREATE TABLE IF NOT EXISTS %[1]s_kv (
	ns      text COLLATE "C" NOT NULL,
	key     text COLLATE "C" NOT NULL,
	value   bytea NOT NULL,
	version bigint NOT NULL,
	PRIMARY KEY (ns, key)
);
CREATE TABLE IF NOT EXISTS %[1]s_requests (
	ns      text NOT NULL,
	id      text NOT NULL,
	key     text COLLATE "C" NOT NULL,
	op      smallint NOT NULL,
	status  smallint NOT NULL,
	version bigint,
	at      timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (ns, id)
);
CREATE INDEX IF NOT EXISTS %[1]s_requests_at ON %[1]s_requests USING brin (at);
CREATE TABLE IF NOT EXISTS %[1]s_eval_runs (
	ns         text NOT NULL,
	agent      text NOT NULL,
	run_id     text COLLATE "C" NOT NULL,
	snapshot   json NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (ns, agent, run_id)
);
CREATE TABLE IF NOT EXISTS %[1]s_ab_samples (
	ns         text NOT NULL,
	agent      text NOT NULL,
	experiment text NOT NULL,
	variant    text NOT NULL,
	session_id text NOT NULL,
	at         timestamptz NOT NULL,
	metrics    json NOT NULL,
	PRIMARY KEY (ns, agent, experiment, session_id, at)
);
CREATE TABLE IF NOT EXISTS %[1]s_ab_snapshots (
	ns         text NOT NULL,
	agent      text NOT NULL,
	snapshot   json NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (ns, agent)
);
CREATE TABLE IF NOT EXISTS %[1]s_memory_heads (
	ns    text NOT NULL,
	agent text NOT NULL,
	last  bigint NOT NULL,
	PRIMARY KEY (ns, agent)
);
CREATE TABLE IF NOT EXISTS %[1]s_memory (
	ns         text NOT NULL,
	agent      text NOT NULL,
	seq        bigint NOT NULL,
	request_id text NOT NULL,
	at         timestamptz NOT NULL DEFAULT now(),
	record     json NOT NULL,
	PRIMARY KEY (ns, agent, seq),
	UNIQUE (ns, agent, request_id)
);
`

func openPostgres(ctx context.Context, rawURL string) (*pgStore, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, errors.New("hosted: the PostgreSQL URL does not parse; check its escaping")
	}
	q := u.Query()
	prefix, err := tablePrefix(q)
	if err != nil {
		return nil, err
	}
	u.RawQuery = q.Encode()
	s := &pgStore{p: prefix, sql: newPGStatements(prefix)}
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			s.secrets = append(s.secrets, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
	}
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, s.err(fmt.Errorf("hosted: the PostgreSQL URL is not usable: %w", err))
	}
	if !q.Has("pool_max_conns") {
		// The service multiplexes many clients; a connection is held for
		// one statement, plus the time its goroutine waits to run, so
		// pgx's default of four caps throughput long before the database
		// does.
		cfg.MaxConns = int32(max(DefaultPoolSize, 4*runtime.NumCPU()))
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, s.err(fmt.Errorf("hosted: PostgreSQL: %w", err))
	}
	if err := s.ensureSchema(ctx); err != nil {
		s.pool.Close()
		return nil, err
	}
	return s, nil
}

// ensureSchema creates the tables when they are missing, under an advisory
// lock so two services starting together agree, and reads the epoch.
func (s *pgStore) ensureSchema(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.err(fmt.Errorf("hosted: connect to PostgreSQL: %w", err))
	}
	defer conn.Release()
	if enc := conn.Conn().PgConn().ParameterStatus("server_encoding"); enc != "UTF8" && enc != "SQL_ASCII" && enc != "" {
		return fmt.Errorf("hosted: the database's encoding is %s; keys are UTF-8, so create the database WITH ENCODING 'UTF8'", enc)
	}
	if ok, err := s.readMeta(ctx, conn.Conn()); err != nil || ok {
		return err
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext(current_schema() || '.' || $2))", int32(pgLockSpace), s.p); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(pgSchema, s.p)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+s.p+"_meta (id, format, epoch) VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING", schemaFormat, newEpoch())
		return err
	})
	if err != nil {
		return s.err(fmt.Errorf("hosted: create the tables %s_*: %w", s.p, err))
	}
	if ok, err := s.readMeta(ctx, conn.Conn()); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("hosted: the table %s_meta has no row after creating it", s.p)
		}
		return err
	}
	return nil
}

// readMeta reads the format and epoch; false when the tables do not exist.
func (s *pgStore) readMeta(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.p+"_meta").Scan(&exists); err != nil {
		return false, s.err(fmt.Errorf("hosted: inspect the tables: %w", err))
	}
	if !exists {
		return false, nil
	}
	var format int
	err := conn.QueryRow(ctx, "SELECT format, epoch FROM "+s.p+"_meta WHERE id = 1").Scan(&format, &s.ep)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, s.err(fmt.Errorf("hosted: read %s_meta (is this another program's table?): %w", s.p, err))
	case format > schemaFormat:
		return false, fmt.Errorf("hosted: the tables %s_* were written by a newer agentkit (format %d; this build reads format %d); upgrade agentkit", s.p, format, schemaFormat)
	}
	return true, nil
}

func (s *pgStore) kind() string  { return "postgres" }
func (s *pgStore) epoch() string { return s.ep }
func (s *pgStore) close()        { s.pool.Close() }

func (s *pgStore) ping(ctx context.Context) error {
	var one int
	return s.err(s.pool.QueryRow(ctx, "SELECT 1").Scan(&one))
}

func (s *pgStore) get(ctx context.Context, ns, key string) ([]byte, int64, error) {
	var v []byte
	var ver int64
	err := s.pool.QueryRow(ctx, s.sql.get, ns, key).Scan(&v, &ver)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, errNotFound
	}
	return v, ver, s.err(err)
}

// pgWrites returns the statement of each write operation. Each is one
// statement, so one transaction and one round trip:
//
//   - prev reads the request id's record. When there is one, nothing else
//     happens and the record is the answer.
//   - w is the write itself, drawing its version from the sequence.
//   - rec records the request id, the key, the operation and the outcome.
//   - async turns off the wait for the WAL flush when the write changed
//     nothing (a conflict, a delete of a missing key): its record only
//     stops a delayed copy from applying later, and a pgkv client's
//     conflict costs no flush either.
//
// Two copies of one request running at once both find no record; the
// second to insert its record fails on the primary key once the first
// commits, which rolls its write back, and the service runs it again to
// answer from the record. Within a statement, rec follows w, so the second
// copy waits on the key's row lock first and the two never deadlock.
//
// Parameters: $1 ns, $2 key, $3 request id, then $4 value and $5 expected
// version where the operation has them. The row: the record's key, op,
// status and version when replayed, then the new version (null when
// nothing was written).
func pgWrites(p string) [4]string {
	prev := "WITH prev AS (SELECT key, op, status, version FROM " + p + "_requests WHERE ns = $1 AND id = $3), "
	none := "NOT EXISTS (SELECT 1 FROM prev)"
	rec := func(op writeOp, status string) string {
		return "rec AS (INSERT INTO " + p + "_requests (ns, id, key, op, status, version) " +
			"SELECT $1, $3, $2, " + fmt.Sprint(int(op)) + ", " + status + ", (SELECT version FROM w) WHERE " + none + "), "
	}
	async := "async AS (SELECT set_config('synchronous_commit', 'off', true) WHERE " + none + " AND NOT EXISTS (SELECT 1 FROM w)) "
	result := "SELECT (SELECT key FROM prev), (SELECT op FROM prev), (SELECT status FROM prev), (SELECT version FROM prev), " +
		"(SELECT version FROM w), (SELECT count(*) FROM async)"
	insert := "INSERT INTO " + p + "_kv AS t (ns, key, value, version) SELECT $1, $2, $4, nextval('" + p + "_version') WHERE " + none
	var q [4]string
	q[opPut] = prev + "w AS (" + insert +
		" ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version RETURNING t.version), " +
		rec(opPut, "0") + async + result
	q[opPutIfAbsent] = prev + "w AS (" + insert + " ON CONFLICT (ns, key) DO NOTHING RETURNING t.version), " +
		rec(opPutIfAbsent, "CASE WHEN EXISTS (SELECT 1 FROM w) THEN 0 ELSE 1 END") + async + result
	q[opPutIfVersion] = prev + "w AS (UPDATE " + p + "_kv AS t SET value = $4, version = nextval('" + p + "_version') " +
		"WHERE t.ns = $1 AND t.key = $2 AND t.version = $5 AND " + none + " RETURNING t.version), " +
		rec(opPutIfVersion, "CASE WHEN EXISTS (SELECT 1 FROM w) THEN 0 ELSE 2 END") + async + result
	q[opDelete] = prev + "w AS (DELETE FROM " + p + "_kv AS t WHERE t.ns = $1 AND t.key = $2 AND " + none + " RETURNING NULL::bigint AS version), " +
		rec(opDelete, "0") + async + result
	return q
}

func (s *pgStore) write(ctx context.Context, w writeReq) (writeResult, error) {
	value := w.value
	if value == nil {
		value = []byte{}
	}
	args := []any{w.ns, w.key, w.reqID}
	switch w.op {
	case opPut, opPutIfAbsent:
		args = append(args, value)
	case opPutIfVersion:
		args = append(args, value, w.expected)
	}
	for attempt := 1; ; attempt++ {
		var (
			prevKey              *string
			prevOp, prevStatus   *int16
			prevVersion, version *int64
			async                int64
			res                  writeResult
		)
		err := s.pool.QueryRow(ctx, s.sql.writes[w.op], args...).Scan(&prevKey, &prevOp, &prevStatus, &prevVersion, &version, &async)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.TableName == s.p+"_requests" && attempt < 3 {
			continue // a copy of this request committed first: answer from its record
		}
		if err != nil {
			return res, s.err(err)
		}
		switch {
		case prevKey != nil:
			res.replayed = true
			if *prevKey != w.key || writeOp(*prevOp) != w.op {
				res.status = statusReused
			} else {
				res.status = writeStatus(*prevStatus)
				if prevVersion != nil {
					res.version = *prevVersion
				}
			}
		case version != nil:
			res.version = *version
		case w.op == opPutIfAbsent:
			res.status = statusExists
		case w.op == opPutIfVersion:
			res.status = statusMismatch
		}
		return res, nil
	}
}

func (s *pgStore) list(ctx context.Context, ns, prefix, after string, limit int, values bool) ([]row, bool, error) {
	upper, bounded := successor(prefix)
	var sql string
	switch {
	case values && bounded:
		sql = s.sql.listValuesUpper
	case values:
		sql = s.sql.listValues
	case bounded:
		sql = s.sql.listKeysUpper
	default:
		sql = s.sql.listKeys
	}
	args := []any{ns, prefix, after, limit + 1}
	if bounded {
		args = append(args, upper)
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, false, s.err(err)
	}
	defer rows.Close()
	var page []row
	inline := 0
	more := false
	for rows.Next() {
		if len(page) == limit || inline >= pageValueBytes {
			more = true
			break
		}
		var r row
		var size int32
		if err := rows.Scan(&r.key, &r.value, &size); err != nil {
			return nil, false, s.err(err)
		}
		r.size = int64(size)
		if values && r.value == nil && r.size == 0 {
			r.value = []byte{}
		}
		inline += len(r.value)
		page = append(page, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, s.err(err)
	}
	return page, more, nil
}

func (s *pgStore) forgetRequests(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, s.sql.forget, before)
	return tag.RowsAffected(), s.err(err)
}

func (s *pgStore) putEval(ctx context.Context, ns, agent, runID string, snapshot []byte) error {
	_, err := s.pool.Exec(ctx, s.sql.putEval, ns, agent, runID, string(snapshot))
	return s.err(err)
}

func (s *pgStore) deleteEval(ctx context.Context, ns, agent, runID string) error {
	_, err := s.pool.Exec(ctx, s.sql.deleteEval, ns, agent, runID)
	return s.err(err)
}

func (s *pgStore) listEvals(ctx context.Context, ns, agent, after string, limit int) ([]evalRow, bool, error) {
	rows, err := s.pool.Query(ctx, s.sql.listEvals, ns, agent, after, limit+1)
	if err != nil {
		return nil, false, s.err(err)
	}
	var out []evalRow
	var doc string
	var r evalRow
	_, err = pgx.ForEachRow(rows, []any{&r.runID, &doc}, func() error {
		r.snapshot = []byte(doc)
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, false, s.err(err)
	}
	out, more := page(out, limit)
	return out, more, nil
}

func (s *pgStore) putSample(ctx context.Context, ns string, x sample) error {
	_, err := s.pool.Exec(ctx, s.sql.putSample, ns, x.agent, x.experiment, x.variant, x.sessionID, x.at, string(x.metrics))
	return s.err(err)
}

func (s *pgStore) putSnapshot(ctx context.Context, ns, agent string, doc []byte) error {
	_, err := s.pool.Exec(ctx, s.sql.putSnapshot, ns, agent, string(doc))
	return s.err(err)
}

func (s *pgStore) getSnapshot(ctx context.Context, ns, agent string) ([]byte, error) {
	var doc string
	err := s.pool.QueryRow(ctx, s.sql.getSnapshot, ns, agent).Scan(&doc)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNotFound
	}
	if err != nil {
		return nil, s.err(err)
	}
	return []byte(doc), nil
}

func (s *pgStore) appendMemory(ctx context.Context, ns, agent, reqID string, record []byte) (int64, bool, error) {
	var seq int64
	var replayed bool
	err := s.pool.QueryRow(ctx, s.sql.appendMemory, ns, agent, reqID, string(record)).Scan(&seq, &replayed)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		// A copy of this append committed while this one ran: answer
		// with its number.
		err = s.pool.QueryRow(ctx, s.sql.memoryReplay, ns, agent, reqID).Scan(&seq)
		replayed = true
	}
	if err != nil {
		return 0, false, s.err(err)
	}
	return seq, replayed, nil
}

func (s *pgStore) listMemory(ctx context.Context, ns, agent string, after int64, limit int) ([]memoryRow, bool, error) {
	rows, err := s.pool.Query(ctx, s.sql.listMemory, ns, agent, after, limit+1)
	if err != nil {
		return nil, false, s.err(err)
	}
	var out []memoryRow
	var doc string
	var r memoryRow
	_, err = pgx.ForEachRow(rows, []any{&r.seq, &doc}, func() error {
		r.record = []byte(doc)
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, false, s.err(err)
	}
	out, more := page(out, limit)
	return out, more, nil
}

// err removes the password from an error: pgx's connection errors carry
// the whole configuration.
func (s *pgStore) err(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	leak := false
	for _, sec := range s.secrets {
		if sec != "" && strings.Contains(msg, sec) {
			msg = strings.ReplaceAll(msg, sec, "[redacted]")
			leak = true
		}
	}
	var ce *pgconn.ConnectError
	if !leak && !errors.As(err, &ce) {
		return err
	}
	return errors.New(msg)
}
