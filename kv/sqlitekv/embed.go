package sqlitekv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"sync"

	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

// The store's SQL, shared by Embedded and by the batch of Open's store.
const (
	nextVersion   = `(SELECT last_version + 1 FROM kv_meta WHERE id = 1)`
	sqlPut        = `INSERT INTO kv (key, value, version) VALUES (?1, ?2, ` + nextVersion + `) ON CONFLICT (key) DO UPDATE SET value = excluded.value, version = excluded.version RETURNING version`
	sqlPutAbsent  = `INSERT INTO kv (key, value, version) VALUES (?1, ?2, ` + nextVersion + `) ON CONFLICT (key) DO NOTHING RETURNING version`
	sqlPutVersion = `UPDATE kv SET value = ?2, version = ` + nextVersion + ` WHERE key = ?1 AND version = ?3 RETURNING version`
	sqlDelete     = `DELETE FROM kv WHERE key = ?1`
	sqlGet        = `SELECT value, version FROM kv WHERE key = ?1`
)

// tableStatements create the store's tables and triggers (see the package
// documentation's Schema).
var tableStatements = []string{
	`CREATE TABLE IF NOT EXISTS kv (
		key     TEXT PRIMARY KEY NOT NULL,
		value   BLOB NOT NULL,
		version INTEGER NOT NULL
	)`,
	`CREATE TABLE IF NOT EXISTS kv_meta (
		id           INTEGER PRIMARY KEY CHECK (id = 1),
		format       INTEGER NOT NULL,
		last_version INTEGER NOT NULL
	)`,
	`INSERT INTO kv_meta (id, format, last_version) VALUES (1, ` + strconv.Itoa(formatVersion) + `, 0) ON CONFLICT (id) DO NOTHING`,
	// Every write sets its row's version to last_version + 1; these record
	// that number as the last one issued, inside the same statement, so the
	// next write draws a fresh one.
	`CREATE TRIGGER IF NOT EXISTS kv_version_insert AFTER INSERT ON kv BEGIN
		UPDATE kv_meta SET last_version = NEW.version WHERE id = 1;
	END`,
	`CREATE TRIGGER IF NOT EXISTS kv_version_update AFTER UPDATE OF version ON kv BEGIN
		UPDATE kv_meta SET last_version = NEW.version WHERE id = 1;
	END`,
}

// Querier is what Embedded runs its statements on: a *sql.DB, *sql.Conn or
// *sql.Tx of the "sqlite" driver (modernc.org/sqlite).
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// CreateTables creates the store's tables in the database q is on, when
// they are missing, and checks their format. A program that keeps the
// store inside a database file of its own calls it once, in a write
// transaction, before using Embedded; the file is then also a store Open
// opens (agentkit kv ls works on it).
func CreateTables(ctx context.Context, q Querier) error {
	for _, s := range tableStatements {
		if _, err := q.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("sqlitekv: creating the store's tables: %w", err)
		}
	}
	rows, err := q.QueryContext(ctx, `SELECT format FROM kv_meta WHERE id = 1`)
	if err != nil {
		return fmt.Errorf("sqlitekv: reading the store's format: %w", err)
	}
	defer rows.Close()
	var format int
	if rows.Next() {
		if err := rows.Scan(&format); err != nil {
			return fmt.Errorf("sqlitekv: reading the store's format: %w", err)
		}
	}
	if format > formatVersion {
		return fmt.Errorf("sqlitekv: the store's tables were written by a newer agentkit (format %d; this build reads format %d); upgrade agentkit", format, formatVersion)
	}
	return rows.Err()
}

// Embedded is the store's tables inside a SQLite database its caller opened
// and manages (CreateTables made them): a program that keeps tables of its
// own in the same file reads and writes keys through it, and can write
// them in its own transactions. It keeps the contract exactly as Open's
// store does (same tables, versions and listings); kvtest checks it.
//
// Its methods run their statements on the Querier given to NewEmbedded,
// prepared once: on a *sql.Conn that holds an open transaction, inside
// that transaction (committed or rolled back with it); otherwise each
// write is a transaction of its own. WriteBatch is atomic either way (a
// savepoint inside the caller's transaction). An Embedded on a *sql.Conn
// is for one goroutine at a time, as the connection is.
type Embedded struct {
	q        Querier
	pageRows int

	mu    sync.Mutex
	stmts map[string]*sql.Stmt
}

var (
	_ kv.Store       = (*Embedded)(nil)
	_ kv.CAS         = (*Embedded)(nil)
	_ kv.AfterLister = (*Embedded)(nil)
	_ kv.Batcher     = (*Embedded)(nil)
)

// NewEmbedded returns the store's operations on q.
func NewEmbedded(q Querier) *Embedded {
	return &Embedded{q: q, pageRows: listPage, stmts: map[string]*sql.Stmt{}}
}

// Close closes the prepared statements (not q).
func (e *Embedded) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for _, st := range e.stmts {
		errs = append(errs, st.Close())
	}
	e.stmts = map[string]*sql.Stmt{}
	return errors.Join(errs...)
}

func (e *Embedded) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st, ok := e.stmts[q]; ok {
		return st, nil
	}
	st, err := e.q.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	e.stmts[q] = st
	return st, nil
}

// write runs a write statement that returns the version it set; no row
// means its condition failed.
func (e *Embedded) write(ctx context.Context, q string, args ...any) (kv.Version, error) {
	st, err := e.stmt(ctx, q)
	if err != nil {
		return "", err
	}
	return scanVersion(st.QueryContext(ctx, args...))
}

// scanVersion reads the version a write statement returned, stepping it to
// its end (where a commit's error surfaces); no row is kv.ErrConflict.
func scanVersion(rows *sql.Rows, err error) (kv.Version, error) {
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var ver int64
	n := 0
	for rows.Next() {
		if err := rows.Scan(&ver); err != nil {
			return "", err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if n == 0 {
		return "", kv.ErrConflict
	}
	return kv.Version(strconv.FormatInt(ver, 10)), nil
}

// parseVersion reads a version this driver issued; anything else can
// never match, so it is a conflict.
func parseVersion(expected kv.Version) (int64, error) {
	want, err := strconv.ParseInt(string(expected), 10, 64)
	if err != nil || strconv.FormatInt(want, 10) != string(expected) {
		return 0, fmt.Errorf("%w: %q is not a version this driver issued", kv.ErrConflict, expected)
	}
	return want, nil
}

// Put creates or overwrites key.
func (e *Embedded) Put(ctx context.Context, key string, value []byte) error {
	_, err := e.write(ctx, sqlPut, key, value)
	return err
}

// PutIfAbsent inserts key only if it has no row.
func (e *Embedded) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	return e.write(ctx, sqlPutAbsent, key, value)
}

// PutIfVersion updates key only if its row has version expected.
func (e *Embedded) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	want, err := parseVersion(expected)
	if err != nil {
		return "", err
	}
	return e.write(ctx, sqlPutVersion, key, value, want)
}

// Delete removes key's row.
func (e *Embedded) Delete(ctx context.Context, key string) error {
	st, err := e.stmt(ctx, sqlDelete)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(ctx, key)
	return err
}

// Get returns the value of key, or kv.ErrNotFound.
func (e *Embedded) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := e.GetWithVersion(ctx, key)
	return v, err
}

// GetWithVersion returns the value of key and its version.
func (e *Embedded) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	st, err := e.stmt(ctx, sqlGet)
	if err != nil {
		return nil, "", err
	}
	var v []byte
	var ver int64
	err = st.QueryRowContext(ctx, key).Scan(&v, &ver)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", kv.ErrNotFound
	}
	if err != nil {
		return nil, "", err
	}
	if v == nil {
		v = []byte{}
	}
	return v, kv.Version(strconv.FormatInt(ver, 10)), nil
}

// List yields the entries under prefix in key order, a page at a time;
// each page is read whole before it is yielded.
func (e *Embedded) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return e.pages(ctx, prefix, "", true)
}

// ListAfter is List from the first key after after.
func (e *Embedded) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return e.pages(ctx, prefix, after, true)
}

// ListKeys yields the keys under prefix in key order.
func (e *Embedded) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return e.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter is ListKeys from the first key after after.
func (e *Embedded) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for en, err := range e.pages(ctx, prefix, after, false) {
			if !yield(en.Key, err) || err != nil {
				return
			}
		}
	}
}

func (e *Embedded) pages(ctx context.Context, prefix, from string, withValue bool) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		cols := "key"
		if withValue {
			cols = "key, value"
		}
		end, bounded := driverkit.PrefixEnd(prefix)
		after, first := prefix, true
		if from >= prefix {
			after, first = from, false
		}
		for {
			q := "SELECT " + cols + " FROM kv WHERE key > ?1"
			if first {
				q = "SELECT " + cols + " FROM kv WHERE key >= ?1"
			}
			args := []any{after, e.pageRows}
			if bounded {
				q += " AND key < ?3"
				args = append(args, end)
			}
			q += " ORDER BY key LIMIT ?2"
			page, err := e.page(ctx, q, args, withValue)
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			for _, en := range page {
				if !yield(en, nil) {
					return
				}
			}
			if len(page) < e.pageRows {
				return
			}
			after, first = page[len(page)-1].Key, false
		}
	}
}

func (e *Embedded) page(ctx context.Context, q string, args []any, withValue bool) ([]kv.Entry, error) {
	st, err := e.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var page []kv.Entry
	for rows.Next() {
		var en kv.Entry
		if withValue {
			err = rows.Scan(&en.Key, &en.Value)
		} else {
			err = rows.Scan(&en.Key)
		}
		if err != nil {
			return nil, err
		}
		if withValue && en.Value == nil {
			en.Value = []byte{}
		}
		page = append(page, en)
	}
	return page, rows.Err()
}

// WriteBatch applies ops atomically: inside a savepoint on a connection or
// transaction (so inside the caller's transaction when it holds one), in a
// transaction of its own on a pool.
func (e *Embedded) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	if db, ok := e.q.(*sql.DB); ok {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		inner := NewEmbedded(tx)
		defer inner.Close()
		vers, err := inner.writeBatch(ctx, ops)
		if err != nil {
			return nil, err
		}
		return vers, tx.Commit()
	}
	return e.writeBatch(ctx, ops)
}

func (e *Embedded) writeBatch(ctx context.Context, ops []kv.BatchOp) (vers []kv.Version, err error) {
	q := e.q
	if _, err := q.ExecContext(ctx, "SAVEPOINT kv_batch"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_, _ = q.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO kv_batch")
		}
		if _, rerr := q.ExecContext(context.WithoutCancel(ctx), "RELEASE kv_batch"); rerr != nil && err == nil {
			vers, err = nil, rerr
		}
	}()
	vers = make([]kv.Version, len(ops))
	for i, op := range ops {
		var err error
		switch op.Kind {
		case kv.BatchPut:
			vers[i], err = e.write(ctx, sqlPut, op.Key, op.Value)
		case kv.BatchPutIfAbsent:
			vers[i], err = e.write(ctx, sqlPutAbsent, op.Key, op.Value)
		case kv.BatchPutIfVersion:
			var want int64
			if want, err = parseVersion(op.Version); err == nil {
				vers[i], err = e.write(ctx, sqlPutVersion, op.Key, op.Value, want)
			}
		case kv.BatchDelete:
			err = e.Delete(ctx, op.Key)
		default:
			err = fmt.Errorf("sqlitekv: op %d of the batch has kind %v", i, op.Kind)
		}
		if err != nil {
			if errors.Is(err, kv.ErrConflict) {
				return nil, &kv.BatchError{Index: i, Err: err}
			}
			return nil, err
		}
	}
	return vers, nil
}
