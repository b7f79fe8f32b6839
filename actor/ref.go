package actor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"agentkit/actor/mergepatch"
)

// Ref is an untyped reference to one actor: its state as JSON, its message
// and event logs, its scheduled tasks and its own SQL database. Actor[S]
// embeds it and adds typed state; servers and tools that handle JSON use it
// directly. A Ref is cheap (it opens nothing) and safe for concurrent use.
type Ref struct {
	h     *Host
	cls   *classInfo // nil for a class this host does not define
	class string
	id    string
	dir   string // actors/{class}/{id}
	key   string // the pool key
}

// Class returns the actor's class name.
func (r *Ref) Class() string { return r.class }

// ID returns the actor's id.
func (r *Ref) ID() string { return r.id }

func (r *Ref) systemPath() string { return filepath.Join(r.dir, systemFile) }

// legacy reports whether the actor may have records in the key-value
// layout.
func (r *Ref) legacy() bool { return r.h.opts.Store != nil && r.class == r.h.opts.LegacyClass }

func (r *Ref) classInfo() (*classInfo, error) {
	if r.cls == nil {
		return nil, fmt.Errorf("%w: %q is not defined on this host; define it with actor.Define", ErrUnknownClass, r.class)
	}
	return r.cls, nil
}

// read runs fn on the actor's database when it exists. found is false,
// and fn not run, when it does not: the caller then reads the key-value
// layout (migrated reports whether that is allowed) or the defaults.
func (r *Ref) read(ctx context.Context, fn func(db *sql.DB) error) (found bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	e, err := r.h.pool.acquire(ctx, r.key, func() (*sql.DB, dbMeta, error) {
		db, m, err := openDB(ctx, r.systemPath(), r.h.sync)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, dbMeta{}, errAbsent
		}
		return db, m, err
	})
	if errors.Is(err, errAbsent) {
		if r.legacy() {
			if err := r.checkMarkerForRead(ctx); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer r.h.pool.release(e)
	return true, fn(e.db)
}

// acquireWrite returns the actor's entry, creating its database (and
// migrating its key-value records) if it does not exist, and finishing a
// migration a crash interrupted. The caller releases it.
func (r *Ref) acquireWrite(ctx context.Context) (*entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if check := r.h.opts.WriteCheck; check != nil {
		if err := check(ctx, r.class, r.id); err != nil {
			return nil, err
		}
	}
	e, err := r.h.pool.acquire(ctx, r.key, func() (*sql.DB, dbMeta, error) {
		for try := 0; ; try++ {
			db, m, err := openDB(ctx, r.systemPath(), r.h.sync)
			if !errors.Is(err, fs.ErrNotExist) || try == 3 {
				return db, m, err
			}
			// Missing: create it. ErrExist means another process
			// created it first; open that one.
			if err := r.create(ctx); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, dbMeta{}, err
			}
		}
	})
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if !e.swept {
		// A creator killed between moving its database into place and
		// removing the temporary name left that name behind.
		removeStaleTemps(r.systemPath())
		e.swept = true
	}
	if e.meta.migration == migrationCopied {
		err = r.finishMigration(ctx, e)
	}
	e.mu.Unlock()
	if err != nil {
		r.h.pool.release(e)
		return nil, err
	}
	return e, nil
}

// write runs fn in one immediate transaction of the actor's database,
// creating it first if needed, and commits: with synchronous=full the
// change is on disk when write returns.
func (r *Ref) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	e, err := r.acquireWrite(ctx)
	if err != nil {
		return err
	}
	defer r.h.pool.release(e)
	return inTx(ctx, e.db, fn)
}

func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("actor: %w", err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("actor: commit: %w", err)
	}
	return nil
}

// create makes the actor's database: migrated from the key-value layout
// when it holds records of this actor, empty otherwise.
func (r *Ref) create(ctx context.Context) error {
	if r.legacy() {
		migrated, err := r.migrate(ctx)
		if err != nil || migrated {
			return err
		}
	}
	return createDB(ctx, r.systemPath(), dbMeta{class: r.class, actor: r.id}, nil)
}

// StateJSON returns the actor's state as JSON: the stored value, or the
// class's initial state when nothing was stored.
func (r *Ref) StateJSON(ctx context.Context) ([]byte, error) {
	c, err := r.classInfo()
	if err != nil {
		return nil, err
	}
	var v []byte
	found, err := r.read(ctx, func(db *sql.DB) error {
		var err error
		v, err = loadState(ctx, db)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !found && r.legacy() {
		if v, err = r.legacyState(ctx); err != nil {
			return nil, err
		}
	}
	if v == nil {
		return c.initial()
	}
	return v, nil
}

// loadState reads the stored state; nil when none is stored.
func loadState(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) ([]byte, error) {
	var v []byte
	err := q.QueryRowContext(ctx, "SELECT value FROM state WHERE id = 1").Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("actor: reading the state: %w", err)
	}
	return v, nil
}

func storeState(ctx context.Context, tx *sql.Tx, v []byte) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO state (id, value, updated_at) VALUES (1, ?, ?)
		ON CONFLICT (id) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`, v, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("actor: writing the state: %w", err)
	}
	return nil
}

// PatchStateJSON applies an RFC 7396 merge patch to the actor's state and
// returns the new state. The read, the merge and the write are one
// transaction, so concurrent patches of one actor are applied one after
// the other and none is lost. An invalid patch is refused with a
// *mergepatch.SyntaxError naming the position, and a result the class's
// state type cannot hold with ErrInvalidState; neither stores anything nor
// creates the actor's database.
func (r *Ref) PatchStateJSON(ctx context.Context, patch []byte) ([]byte, error) {
	c, err := r.classInfo()
	if err != nil {
		return nil, err
	}
	if err := mergepatch.Validate(patch, "patch"); err != nil {
		return nil, fmt.Errorf("actor: %w", err)
	}
	if !r.HasDatabase() {
		// A first write creates the database: check the result first, so
		// a refused patch leaves no file behind.
		cur, err := r.StateJSON(ctx)
		if err != nil {
			return nil, err
		}
		next, err := mergepatch.Apply(cur, patch)
		if err != nil {
			return nil, fmt.Errorf("%w: the stored state: %w", ErrInvalidState, err)
		}
		if err := c.check(next); err != nil {
			return nil, err
		}
	}
	var out []byte
	err = r.write(ctx, func(tx *sql.Tx) error {
		cur, err := loadState(ctx, tx)
		if err != nil {
			return err
		}
		if cur == nil {
			if cur, err = c.initial(); err != nil {
				return err
			}
		}
		next, err := mergepatch.Apply(cur, patch)
		if err != nil {
			return fmt.Errorf("%w: the stored state: %w", ErrInvalidState, err)
		}
		if err := c.check(next); err != nil {
			return err
		}
		out = next
		return storeState(ctx, tx, next)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReplaceStateJSON replaces the actor's whole state with state, which must
// be valid JSON that the class's state type can hold (ErrInvalidState).
func (r *Ref) ReplaceStateJSON(ctx context.Context, state []byte) error {
	c, err := r.classInfo()
	if err != nil {
		return err
	}
	v, err := mergepatch.Compact(state, "state")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidState, err)
	}
	if err := c.check(v); err != nil {
		return err
	}
	return r.write(ctx, func(tx *sql.Tx) error { return storeState(ctx, tx, v) })
}

// HasDatabase reports whether the actor's database exists on this host.
// An actor that was never written has none.
func (r *Ref) HasDatabase() bool {
	_, err := os.Stat(r.systemPath())
	return err == nil
}
