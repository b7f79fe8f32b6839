package sessiondb

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"agentkit/kv"
	"agentkit/kv/sqlitekv"
)

// Store is the embedded default store kept inside the session database:
// the tables of package sqlitekv (kv, kv_meta) in the same file, so a
// store opened with the SQLite driver on the file sees the same keys
// (agentkit kv ls), and the runtime can write the store's records in the
// same transaction as the events they copy (kv.DB.InTx, Store.TxView). It implements
// kv.Store, the CAS group and kv.Batcher. Reads run on the database's
// reading pool; writes go through its writer, each a request of its own
// (grouped with others waiting, as every write is).
type Store struct {
	d *DB
	r *sqlitekv.Embedded // on the reading pool
}

var (
	_ kv.Store    = (*Store)(nil)
	_ kv.CAS      = (*Store)(nil)
	_ kv.Batcher  = (*Store)(nil)
	_ kv.TxViewer = (*Store)(nil)
)

// TxView implements kv.TxViewer: the store as tx, a write of this
// database, sees it. A write of another session database is refused.
func (s *Store) TxView(tx any) (any, error) {
	t, ok := tx.(*Tx)
	switch {
	case !ok:
		return nil, fmt.Errorf("sessiondb: the embedded store runs inside a write of its session database (*sessiondb.Tx), not a %T", tx)
	case t == nil || t.w != s.d.w:
		return nil, errors.New("sessiondb: the write is one of another session database")
	case t.w.kv == nil:
		return nil, errors.New("sessiondb: the embedded store has no tables in this write yet")
	}
	return t.w.kv, nil
}

// Store returns the embedded store, creating its tables on first use.
func (d *DB) Store(ctx context.Context) (*Store, error) {
	d.storeMu.Lock()
	defer d.storeMu.Unlock()
	if d.store != nil {
		return d.store, nil
	}
	err := d.Write(ctx, func(tx *Tx) error {
		if err := sqlitekv.CreateTables(tx.ctx, tx.w.conn); err != nil {
			return err
		}
		tx.w.kv = sqlitekv.NewEmbedded(tx.w.conn)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sessiondb: the embedded store: %w", err)
	}
	d.store = &Store{d: d, r: sqlitekv.NewEmbedded(d.db)}
	return d.store, nil
}

func (s *Store) write(ctx context.Context, fn func(tx *Tx, e *sqlitekv.Embedded) error) error {
	return s.d.Write(ctx, func(tx *Tx) error { return fn(tx, tx.w.kv) })
}

// Put creates or overwrites key.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	return s.write(ctx, func(tx *Tx, e *sqlitekv.Embedded) error { return e.Put(tx.ctx, key, value) })
}

// PutIfAbsent writes key only if it does not exist.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (ver kv.Version, err error) {
	err = s.write(ctx, func(tx *Tx, e *sqlitekv.Embedded) error {
		ver, err = e.PutIfAbsent(tx.ctx, key, value)
		return err
	})
	return ver, err
}

// PutIfVersion writes key only if it exists with version expected.
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (ver kv.Version, err error) {
	err = s.write(ctx, func(tx *Tx, e *sqlitekv.Embedded) error {
		ver, err = e.PutIfVersion(tx.ctx, key, value, expected)
		return err
	})
	return ver, err
}

// Delete removes key.
func (s *Store) Delete(ctx context.Context, key string) error {
	return s.write(ctx, func(tx *Tx, e *sqlitekv.Embedded) error { return e.Delete(tx.ctx, key) })
}

// WriteBatch applies ops atomically, in one write.
func (s *Store) WriteBatch(ctx context.Context, ops []kv.BatchOp) (vers []kv.Version, err error) {
	err = s.write(ctx, func(tx *Tx, e *sqlitekv.Embedded) error {
		vers, err = e.WriteBatch(tx.ctx, ops)
		return err
	})
	return vers, err
}

// Get returns the value of key, or kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) { return s.r.Get(ctx, key) }

// GetWithVersion returns the value of key and its version.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	return s.r.GetWithVersion(ctx, key)
}

// List yields the entries under prefix in key order.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.r.List(ctx, prefix)
}

// ListKeys yields the keys under prefix in key order.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.r.ListKeys(ctx, prefix)
}

// ImportStore copies every key of the SQLite store file at path (a store
// of the SQLite driver: the default store of a format-1 state root) into
// the embedded store, with its version, and raises the embedded store's
// version counter to the file's, so no version is ever issued twice for a
// key. Keys already here are replaced by the file's: copying again after
// an interruption gives the same result. Store must have been called.
// It runs before anything else writes the database.
func (d *DB) ImportStore(ctx context.Context, path string) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sessiondb: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `ATTACH DATABASE ? AS old`, "file:"+path+"?mode=ro"); err != nil {
		return fmt.Errorf("sessiondb: opening %s: %w", path, err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `DETACH DATABASE old`)
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return fmt.Errorf("sessiondb: %w", err)
	}
	for _, q := range []string{
		`INSERT OR REPLACE INTO main.kv (key, value, version) SELECT key, value, version FROM old.kv`,
		`UPDATE main.kv_meta SET last_version = max(
			(SELECT last_version FROM main.kv_meta WHERE id = 1),
			(SELECT last_version FROM old.kv_meta WHERE id = 1),
			(SELECT COALESCE(MAX(version), 0) FROM main.kv)) WHERE id = 1`,
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
			return fmt.Errorf("sessiondb: copying the store at %s: %w", path, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return fmt.Errorf("sessiondb: copying the store at %s: %w", path, err)
	}
	return nil
}
