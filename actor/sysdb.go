package actor

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"agentkit/internal/privfile"
)

// Format is the system database format this build writes and reads, kept
// in the database's user_version. A database with a higher format was
// written by a newer agentkit and is refused with ErrNewerFormat.
const Format = 1

// The system database's schema. Messages and events are rowid tables keyed
// by their sequence number, so an append, the last N and a page after a
// cursor are each one B-tree descent, whatever the log's length.
const schema = `
CREATE TABLE meta (
	id            INTEGER PRIMARY KEY CHECK (id = 1),
	class         TEXT NOT NULL,
	actor         TEXT NOT NULL,
	created_at    INTEGER NOT NULL,
	migrated_from TEXT NOT NULL,
	migration     TEXT NOT NULL
);
CREATE TABLE state (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	value      BLOB NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE TABLE messages (
	seq  INTEGER PRIMARY KEY,
	at   INTEGER NOT NULL,
	type TEXT NOT NULL,
	data BLOB NOT NULL
);
CREATE TABLE events (
	seq  INTEGER PRIMARY KEY,
	at   INTEGER NOT NULL,
	type TEXT NOT NULL,
	data BLOB NOT NULL
);
CREATE TABLE schedules (
	id         TEXT PRIMARY KEY,
	handler    TEXT NOT NULL,
	payload    BLOB NOT NULL,
	kind       TEXT NOT NULL,
	cron       TEXT NOT NULL,
	due        INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	attempts   INTEGER NOT NULL,
	failed     INTEGER NOT NULL,
	last_error TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX schedules_by_due ON schedules (failed, due);
CREATE TABLE legacy_keys (
	key TEXT PRIMARY KEY
) WITHOUT ROWID;
`

// Migration states in meta.migration.
const (
	migrationNone   = ""       // created fresh
	migrationCopied = "copied" // the key-value layout is copied; its keys are still to delete
	migrationDone   = "done"   // the keys are deleted
)

// dbMeta is the meta row of a system database.
type dbMeta struct {
	class, actor string
	migratedFrom string
	migration    string
}

// dsn builds the database/sql name of a SQLite file. mode is "rw" (the
// file must exist) or "rwc"; immediate makes BEGIN take the write lock at
// once, so a read-modify-write transaction never fails half-way on a lock.
// pragmas are more pragmas, such as "secure_delete(ON)".
func dsn(path, mode, journal, sync string, immediate bool, pragmas ...string) string {
	q := url.Values{}
	q.Set("mode", mode)
	for _, p := range append([]string{"busy_timeout(10000)", "journal_mode(" + journal + ")", "synchronous(" + sync + ")", "cache_size(-512)"}, pragmas...) {
		q.Add("_pragma", p)
	}
	if immediate {
		q.Set("_txlock", "immediate")
	}
	return "file:" + escapePath(path) + "?" + q.Encode()
}

// escapePath escapes what a SQLite URI filename would read as syntax.
func escapePath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23").Replace(p)
}

// openDB opens an existing system database with one connection, checks its
// format and reads its meta row. A missing file is fs.ErrNotExist.
func openDB(ctx context.Context, path, sync string) (*sql.DB, dbMeta, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, dbMeta{}, err
	}
	if err := privfile.TightenSQLite(path); err != nil {
		return nil, dbMeta{}, fmt.Errorf("actor: %w", err)
	}
	db, err := sql.Open("sqlite", dsn(path, "rw", "WAL", sync, true))
	if err != nil {
		return nil, dbMeta{}, fmt.Errorf("actor: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	m, err := checkDB(ctx, db, path)
	if err != nil {
		db.Close()
		return nil, dbMeta{}, err
	}
	return db, m, nil
}

// checkDB refuses a database of a newer format, or not an actor database,
// and reads the meta row.
func checkDB(ctx context.Context, db *sql.DB, path string) (dbMeta, error) {
	var format int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&format); err != nil {
		return dbMeta{}, fmt.Errorf("actor: reading the format of %s: %w", path, err)
	}
	if format > Format {
		return dbMeta{}, &NewerFormatError{Path: path, Format: format}
	}
	if format < 1 {
		return dbMeta{}, fmt.Errorf("actor: %s is not an agentkit actor database (it has no format); move it out of the actors folder", path)
	}
	var m dbMeta
	err := db.QueryRowContext(ctx, "SELECT class, actor, migrated_from, migration FROM meta WHERE id = 1").
		Scan(&m.class, &m.actor, &m.migratedFrom, &m.migration)
	if err != nil {
		return dbMeta{}, fmt.Errorf("actor: reading the meta row of %s: %w", path, err)
	}
	return m, nil
}

// NewerFormatError means an actor database was written by a newer
// agentkit. It matches ErrNewerFormat.
type NewerFormatError struct {
	Path   string
	Format int
}

// Error says to upgrade.
func (e *NewerFormatError) Error() string {
	return fmt.Sprintf("actor: %s has format %d, and this agentkit reads format %d or older; upgrade agentkit (never serve this actor with an older build)", e.Path, e.Format, Format)
}

// Is makes errors.Is(err, ErrNewerFormat) true.
func (e *NewerFormatError) Is(target error) bool { return target == ErrNewerFormat }

// createDB makes the system database at path, complete or not at all: it
// builds it under a temporary name (schema, meta row, and whatever fill
// adds, in one transaction), closes it, then links it to path, which fails
// if path exists, and syncs the folder. It returns fs.ErrExist when another
// creator won.
func createDB(ctx context.Context, path string, m dbMeta, fill func(*sql.Tx) error) error {
	dir := filepath.Dir(path)
	if err := mkdirs(dir); err != nil {
		return err
	}
	removeStaleTemps(path)
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := fmt.Sprintf("%s.tmp-%d-%s", path, os.Getpid(), hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("actor: creating %s: %w", tmp, err)
	}
	f.Close()
	defer removeTemp(tmp)
	if err := buildDB(ctx, tmp, m, fill); err != nil {
		return err
	}
	hook("built")
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fs.ErrExist
		}
		return fmt.Errorf("actor: moving the new database into place at %s: %w", path, err)
	}
	hook("linked")
	if err := os.Remove(tmp); err != nil {
		return fmt.Errorf("actor: removing %s: %w", tmp, err)
	}
	return syncDir(dir)
}

func buildDB(ctx context.Context, tmp string, m dbMeta, fill func(*sql.Tx) error) error {
	db, err := sql.Open("sqlite", dsn(tmp, "rw", "DELETE", "FULL", true))
	if err != nil {
		return fmt.Errorf("actor: opening %s: %w", tmp, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("actor: building %s: %w", tmp, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("actor: building %s: %w", tmp, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO meta (id, class, actor, created_at, migrated_from, migration) VALUES (1, ?, ?, ?, ?, ?)`,
		m.class, m.actor, time.Now().UnixNano(), m.migratedFrom, m.migration); err != nil {
		return fmt.Errorf("actor: building %s: %w", tmp, err)
	}
	if fill != nil {
		if err := fill(tx); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", Format)); err != nil {
		return fmt.Errorf("actor: building %s: %w", tmp, err)
	}
	hook("filled")
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("actor: building %s: %w", tmp, err)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil || !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("actor: %s cannot use WAL mode (got %q, %v); keep the state root on a local file system", tmp, mode, err)
	}
	return db.Close()
}

// removeTemp removes a temporary database and whatever SQLite left beside
// it.
func removeTemp(tmp string) {
	for _, s := range []string{"", "-journal", "-wal", "-shm"} {
		os.Remove(tmp + s)
	}
}

// removeStaleTemps removes the temporary databases that creators which
// are no longer running left beside path (a temporary name holds its
// creator's process id).
func removeStaleTemps(path string) {
	matches, _ := filepath.Glob(path + ".tmp-*")
	for _, m := range matches {
		pid, _, ok := strings.Cut(strings.TrimPrefix(m, path+".tmp-"), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || n == os.Getpid() || processAlive(n) {
			continue
		}
		removeTemp(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "-journal"), "-wal"), "-shm"))
	}
}

// processAlive reports whether a process with the id runs.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// mkdirs creates dir and its missing parents owner-only (0700), syncing
// each parent that gained an entry.
func mkdirs(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirs(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("actor: creating %s: %w", dir, err)
	}
	return syncDir(parent)
}

// syncDir fsyncs a folder, so a file created or renamed in it survives a
// power cut.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("actor: syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("actor: syncing %s: %w", dir, err)
	}
	return nil
}

// touch0600 creates path owner-only if missing, so SQLite (which gives its
// journal files the database's mode) never makes a world-readable file,
// and takes group and other permissions off an existing one and its -wal,
// -shm and -journal files.
func touch0600(path string) error {
	if err := privfile.CreateSQLite(path); err != nil {
		return fmt.Errorf("actor: %w", err)
	}
	return nil
}
