// Package pgkv is the PostgreSQL kv driver, built on pgx v5 and its
// connection pool. Every store is one table; several processes and hosts can
// share it, and its compare-and-set operations are atomic across all of them.
//
// It registers the "postgres" and "postgresql" URL schemes. The URL is a
// libpq connection URL with one extra query parameter, table, which names the
// table (default agentkit_kv) and is removed before the rest reaches pgx:
//
//	postgres://user:secret@db.internal:5432/app?sslmode=verify-full&table=agent_state
//
// Open takes the same connection string (URL or keyword/value form) with the
// table in Options instead. On first use the table is created if missing:
//
//	CREATE TABLE agentkit_kv (
//		key     text COLLATE "C" PRIMARY KEY,
//		value   bytea NOT NULL,
//		version bigint GENERATED ALWAYS AS IDENTITY
//	)
//
// The "C" collation makes the primary key compare bytes, so listings come
// out in the contract's bytewise order. Every write takes the next value of
// the identity sequence as the key's version, so versions are never reused,
// also after a key is deleted and created again. Listing walks the primary
// key by range in pages, so it is complete and ordered without LIKE.
package pgkv

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

// DefaultTable is the table a store uses when neither the URL nor Options
// names one.
const DefaultTable = "agentkit_kv"

// MaxValueSize is the largest value the driver stores, a little under
// PostgreSQL's 1 GB limit for one bytea field (the rest of the message needs
// room too). Larger values fail with an error matching kv.ErrTooLarge before
// anything is sent.
const MaxValueSize = 1<<30 - 1<<20

// DefaultPageSize is how many rows one listing query reads.
const DefaultPageSize = 1000

// inlineValueLimit is the largest value a listing page carries inline. Larger
// values are read one at a time just before they are yielded, so a page of
// big values never sits in memory at once.
const inlineValueLimit = 64 << 10

func init() {
	open := func(ctx context.Context, u *url.URL, o kv.OpenOptions) (*kv.DB, error) {
		conn, opts, err := splitURL(u)
		if err != nil {
			return nil, err
		}
		opts.ReadOnly = o.ReadOnly
		return Open(ctx, conn, opts)
	}
	kv.RegisterOptions("postgres", open)
	kv.RegisterOptions("postgresql", open)
}

// Options configures a store. The zero value (or nil) means the defaults.
type Options struct {
	// Table names the table, DefaultTable when empty. It must be 1 to 63
	// lower-case ASCII letters, digits and underscores, not starting with a
	// digit. The table is looked up in the connection's search_path (set
	// search_path=SCHEMA in the connection string to use another schema).
	Table string
	// PageSize is how many rows one listing query reads, DefaultPageSize
	// when zero.
	PageSize int
	// ReadOnly opens without creating the table: a missing table is an
	// error (kv.OpenOptions.ReadOnly sets it).
	ReadOnly bool
}

// splitURL removes the table parameter from a kv URL and returns the
// connection string for pgx.
func splitURL(u *url.URL) (string, *Options, error) {
	own, rest, err := driverkit.SplitParams(u, "table")
	if err != nil {
		return "", nil, fmt.Errorf("pgkv: %w (the default table is %s)", err, DefaultTable)
	}
	return rest.String(), &Options{Table: own["table"]}, nil
}

var tableRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkTable reports whether name is a usable table name.
func checkTable(name string) error {
	if !tableRe.MatchString(name) {
		return fmt.Errorf("pgkv: table name %q is not usable: use 1 to 63 lower-case letters, digits and underscores, starting with a letter or underscore", name)
	}
	return nil
}

// Store is the PostgreSQL backend for one table. It implements the full core
// and the CAS group, and is safe for concurrent use. Use Open for the
// portable handle; (*kv.DB).Backend returns the *Store.
type Store struct {
	pool     *pgxpool.Pool
	table    string
	pageSize int
	maxValue int               // MaxValueSize; lowered by tests
	secrets  driverkit.Secrets // passwords to scrub from errors
	sql      statements
}

// statements is the SQL of each operation for one table.
type statements struct {
	get, getVersion, put, putIfAbsent, putIfVersion, del string

	list, keys pageQueries
}

// pageQueries read one page of a listing: the first page from the prefix on,
// the next ones after a key; the bounded variants stop before an exclusive
// upper bound.
type pageQueries struct {
	first, next, firstBounded, nextBounded string
}

func newStatements(table string) statements {
	t := pgx.Identifier{table}.Sanitize()
	query := func(cols, lower string, bounded bool) string {
		q := "SELECT " + cols + " FROM " + t + " WHERE key " + lower + " $1"
		if bounded {
			q += " AND key < $3"
		}
		return q + " ORDER BY key LIMIT $2"
	}
	paged := func(cols string) pageQueries {
		return pageQueries{query(cols, ">=", false), query(cols, ">", false), query(cols, ">=", true), query(cols, ">", true)}
	}
	// Values over inlineValueLimit come back as NULL with their length, and
	// are read on their own when yielded; octet_length does not detoast.
	entry := fmt.Sprintf("key, CASE WHEN octet_length(value) <= %d THEN value END, octet_length(value)", inlineValueLimit)
	return statements{
		get:          "SELECT value FROM " + t + " WHERE key = $1",
		getVersion:   "SELECT value, version FROM " + t + " WHERE key = $1",
		put:          "INSERT INTO " + t + " (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, version = DEFAULT",
		putIfAbsent:  "INSERT INTO " + t + " (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING version",
		putIfVersion: "UPDATE " + t + " SET value = $2, version = DEFAULT WHERE key = $1 AND version = $3 RETURNING version",
		del:          "DELETE FROM " + t + " WHERE key = $1",
		list:         paged(entry),
		keys:         paged("key"),
	}
}

var (
	_ kv.Store       = (*Store)(nil)
	_ kv.CAS         = (*Store)(nil)
	_ kv.AfterLister = (*Store)(nil)
)

// Open connects to PostgreSQL and returns the store in opts.Table (nil opts
// mean the defaults), creating the table if it does not exist. connString is
// anything pgx accepts: a postgres:// URL or keyword/value pairs, with the
// usual PG* environment variables filling gaps. Errors never contain the
// password. Close the returned DB to close its connection pool.
func Open(ctx context.Context, connString string, opts *Options) (*kv.DB, error) {
	s, err := open(ctx, connString, opts)
	if err != nil {
		return nil, err
	}
	return kv.New("postgres", s)
}

func open(ctx context.Context, connString string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := checkTable(o.Table); err != nil {
		return nil, err
	}
	if o.PageSize < 0 {
		return nil, fmt.Errorf("pgkv: PageSize %d is negative; use 0 for the default %d", o.PageSize, DefaultPageSize)
	}
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	secrets := passwordsIn(connString)
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, scrub(fmt.Errorf("pgkv: the connection string does not parse; check its syntax: %w", err), secrets)
	}
	secrets.Add(cfg.ConnConfig.Password)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, scrub(fmt.Errorf("pgkv: %w", err), secrets)
	}
	s := &Store{pool: pool, table: o.Table, pageSize: o.PageSize, maxValue: MaxValueSize, secrets: secrets, sql: newStatements(o.Table)}
	if err := s.ensureTable(ctx, o.ReadOnly); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the connection pool, waiting for connections in use to be
// returned.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// Table returns the name of the store's table.
func (s *Store) Table() string { return s.table }

// Drop removes the store's table and everything in it. The version sequence
// goes with it, so a table created again under the same name starts its
// versions afresh: drop a namespace only when no client still holds its
// versions.
func (s *Store) Drop(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{s.table}.Sanitize())
	return s.err(err)
}

// lockSpace is the first key of the advisory lock taken while creating a
// table ("akkv").
const lockSpace = 0x616b6b76

// ensureTable creates the table when it is missing and checks its columns
// when it exists. Two processes racing to create it serialise on an
// advisory lock, since CREATE TABLE IF NOT EXISTS alone can fail with a
// duplicate-key error when two sessions run it at once.
func (s *Store) ensureTable(ctx context.Context, readOnly bool) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.err(fmt.Errorf("pgkv: connect: %w", err))
	}
	defer conn.Release()
	if enc := conn.Conn().PgConn().ParameterStatus("server_encoding"); enc != "UTF8" && enc != "SQL_ASCII" && enc != "" {
		return fmt.Errorf("pgkv: the database's encoding is %s; keys are UTF-8, so create the database WITH ENCODING 'UTF8'", enc)
	}
	exists, err := s.checkColumns(ctx, conn)
	if err != nil || exists {
		return err
	}
	if readOnly {
		return fmt.Errorf("pgkv: the table %s does not exist (opened read-only, so it was not created); name the table with the table parameter", s.table)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext(current_schema() || '.' || $2))", int32(lockSpace), s.table); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{s.table}.Sanitize()+
			` (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL, version bigint GENERATED ALWAYS AS IDENTITY)`)
		return err
	})
	if err != nil {
		return s.err(fmt.Errorf("pgkv: create table %s: %w", s.table, err))
	}
	_, err = s.checkColumns(ctx, conn)
	return err
}

// checkColumns reports whether the table exists, and fails when it exists
// without the columns the driver needs.
func (s *Store) checkColumns(ctx context.Context, conn *pgxpool.Conn) (bool, error) {
	rows, err := conn.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod), coalesce(c.collname, ''), a.attidentity::text, pg_get_expr(d.adbin, d.adrelid)
		FROM pg_attribute a
		LEFT JOIN pg_collation c ON c.oid = a.attcollation
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, pgx.Identifier{s.table}.Sanitize())
	if err != nil {
		return false, s.err(fmt.Errorf("pgkv: inspect table %s: %w", s.table, err))
	}
	type column struct{ typ, coll, identity, def string }
	cols := map[string]column{}
	for rows.Next() {
		var name string
		var c column
		var def *string
		if err := rows.Scan(&name, &c.typ, &c.coll, &c.identity, &def); err != nil {
			rows.Close()
			return false, s.err(fmt.Errorf("pgkv: inspect table %s: %w", s.table, err))
		}
		if def != nil {
			c.def = *def
		}
		cols[name] = c
	}
	if err := rows.Err(); err != nil {
		return false, s.err(fmt.Errorf("pgkv: inspect table %s: %w", s.table, err))
	}
	if len(cols) == 0 {
		return false, nil
	}
	var problems []string
	if c, ok := cols["key"]; !ok || c.typ != "text" || c.coll != "C" {
		problems = append(problems, `key must be text COLLATE "C"`)
	}
	if c, ok := cols["value"]; !ok || c.typ != "bytea" {
		problems = append(problems, "value must be bytea")
	}
	if c, ok := cols["version"]; !ok || c.typ != "bigint" || (c.identity == "" && !strings.HasPrefix(c.def, "nextval(")) {
		problems = append(problems, "version must be a bigint identity column")
	}
	if len(problems) > 0 {
		return true, fmt.Errorf("pgkv: table %s exists but is not a kv table (%s); name another table with the table parameter", s.table, strings.Join(problems, "; "))
	}
	return true, nil
}

func versionOf(n int64) kv.Version { return kv.Version(strconv.FormatInt(n, 10)) }

func (s *Store) checkSize(value []byte) error {
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: %d bytes is over the PostgreSQL driver's limit of %d bytes", kv.ErrTooLarge, len(value), s.maxValue)
	}
	return nil
}

// Put creates or overwrites key with a new version.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.checkSize(value); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, s.sql.put, key, value)
	return s.err(err)
}

// Get returns the value of key, or an error matching kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	var v []byte
	err := s.pool.QueryRow(ctx, s.sql.get, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, kv.ErrNotFound
	}
	if err != nil {
		return nil, s.err(err)
	}
	return v, nil
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	_, err := s.pool.Exec(ctx, s.sql.del, key)
	return s.err(err)
}

// GetWithVersion returns the value of key and its version, or an error
// matching kv.ErrNotFound.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	var v []byte
	var n int64
	err := s.pool.QueryRow(ctx, s.sql.getVersion, key).Scan(&v, &n)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, "", kv.ErrNotFound
	}
	if err != nil {
		return nil, "", s.err(err)
	}
	return v, versionOf(n), nil
}

// PutIfAbsent writes key only if it does not exist; otherwise the error
// matches kv.ErrConflict.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	var n int64
	err := s.pool.QueryRow(ctx, s.sql.putIfAbsent, key, value).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: %w", kv.ErrConflict, kv.ErrExists)
	}
	if err != nil {
		return "", s.err(err)
	}
	return versionOf(n), nil
}

// PutIfVersion writes key only if it exists with version expected; otherwise
// (a missing key and a token this driver never issued included) the error
// matches kv.ErrConflict. A failure whose outcome is unknown, such as a
// timeout, is returned as it is and never as a conflict.
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	want, perr := strconv.ParseInt(string(expected), 10, 64)
	if perr != nil || want <= 0 || versionOf(want) != expected {
		return "", fmt.Errorf("%w: the version is not one this driver issued", kv.ErrConflict)
	}
	var n int64
	err := s.pool.QueryRow(ctx, s.sql.putIfVersion, key, value, want).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: the key is missing or its version changed", kv.ErrConflict)
	}
	if err != nil {
		return "", s.err(err)
	}
	return versionOf(n), nil
}

// List yields the entries under prefix in ascending bytewise key order. It
// reads PageSize rows per query, each page starting after the last key of
// the one before, so a key that exists throughout the listing is yielded
// exactly once however other keys change. No connection is held while the
// caller's loop body runs. Values over 64 KiB are read one at a time as they
// are yielded; one deleted in the meantime is skipped.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter is List from the first key after after: the first page's query
// starts there on the primary key's index.
func (s *Store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	type row struct {
		key   string
		value []byte
		size  int64
	}
	read := func(rows pgx.Rows, page []row) ([]row, error) {
		var r row
		_, err := pgx.ForEachRow(rows, []any{&r.key, &r.value, &r.size}, func() error {
			page = append(page, r)
			return nil
		})
		return page, err
	}
	return func(yield func(kv.Entry, error) bool) {
		for page, err := range pages(ctx, s, prefix, after, s.sql.list, read, func(r row) string { return r.key }) {
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			for _, r := range page {
				v := r.value
				if v == nil && r.size > 0 {
					v, err = s.Get(ctx, r.key)
					if errors.Is(err, kv.ErrNotFound) {
						continue // deleted since the page was read
					}
					if err != nil {
						yield(kv.Entry{}, err)
						return
					}
				}
				if !yield(kv.Entry{Key: r.key, Value: v}, nil) {
					return
				}
			}
		}
	}
}

// ListKeys yields the keys under prefix in ascending bytewise order, paged
// as List is.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter is ListKeys from the first key after after.
func (s *Store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		read := func(rows pgx.Rows, page []string) ([]string, error) {
			var k string
			_, err := pgx.ForEachRow(rows, []any{&k}, func() error {
				page = append(page, k)
				return nil
			})
			return page, err
		}
		for page, err := range pages(ctx, s, prefix, after, s.sql.keys, read, func(k string) string { return k }) {
			if err != nil {
				yield("", err)
				return
			}
			for _, k := range page {
				if !yield(k, nil) {
					return
				}
			}
		}
	}
}

// pages runs the keyset pagination shared by List and ListKeys: each query
// reads up to PageSize+1 rows in key order after the previous page's last
// key (the extra row only tells whether another page follows), and rows
// past the prefix end the walk. The first page starts after from when from
// sorts at or after the prefix. read appends a query's rows to a page; the
// page slice is reused.
func pages[T any](ctx context.Context, s *Store, prefix, from string, q pageQueries, read func(pgx.Rows, []T) ([]T, error), key func(T) string) iter.Seq2[[]T, error] {
	return func(yield func([]T, error) bool) {
		upper, bounded := driverkit.PrefixEnd(prefix)
		sql, after := q.first, prefix
		if bounded {
			sql = q.firstBounded
		}
		if from >= prefix {
			sql, after = q.next, from
			if bounded {
				sql = q.nextBounded
			}
		}
		var page []T
		for {
			args := []any{after, s.pageSize + 1}
			if bounded {
				args = append(args, upper)
			}
			rows, err := s.pool.Query(ctx, sql, args...)
			if err == nil {
				page, err = read(rows, page[:0])
			}
			if err != nil {
				yield(nil, s.err(err))
				return
			}
			more := len(page) > s.pageSize
			if more {
				page = page[:s.pageSize]
			}
			// Without an upper bound the query runs past the prefix.
			for i, r := range page {
				if !strings.HasPrefix(key(r), prefix) {
					page, more = page[:i], false
					break
				}
			}
			if !yield(page, nil) || !more {
				return
			}
			sql, after = q.next, key(page[len(page)-1])
			if bounded {
				sql = q.nextBounded
			}
		}
	}
}

// err scrubs credentials from a pgx error. Connection errors carry the whole
// connection configuration, password included, so they are replaced by
// their message (which names only the user and database).
func (s *Store) err(err error) error {
	if err == nil {
		return nil
	}
	return scrub(err, s.secrets)
}

// scrub returns err unless its message or a connection error in its chain
// could expose one of secrets; then it returns a plain error with the
// secrets masked, which still unwraps to the cause of the connection error
// (a *pgconn.ConnectError holds the whole configuration, password included,
// for anyone who asks errors.As).
func scrub(err error, secrets driverkit.Secrets) error {
	if err == nil {
		return nil
	}
	msg, leaks := secrets.Mask(err.Error())
	var ce *pgconn.ConnectError
	if !leaks && !errors.As(err, &ce) {
		return err
	}
	var cause error
	if ce != nil {
		cause = ce.Unwrap()
		if _, hit := secrets.Mask(fmt.Sprint(cause)); hit {
			cause = nil
		}
	}
	return &scrubbedError{msg: msg, cause: cause}
}

// scrubbedError is an error whose message has had credentials removed.
type scrubbedError struct {
	msg   string
	cause error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.cause }

// passwordsIn returns the password of a URL-form connection string.
func passwordsIn(connString string) driverkit.Secrets {
	var s driverkit.Secrets
	if u, err := url.Parse(connString); err == nil && u.User != nil {
		p, _ := u.User.Password()
		s.Add(p)
	}
	return s
}
