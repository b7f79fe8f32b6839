package actor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Delete removes the actor from this host: its folder (the system database
// with its state, logs and scheduled tasks, and the author's SQL database),
// its entry in the schedule index (zeroed, and checkpointed out of the
// index's write-ahead log, so no file names the actor) and, for an actor
// of the legacy class,
// its records and migration marker in the key-value layout. It waits for
// the actor's calls in progress to end (or ctx to), and no call opens the
// actor until Delete returns; afterwards the actor reads as new. Deleting
// an actor that has nothing stored is not an error. Options.WriteCheck does
// not apply: a delete never leaves state behind for another host to miss.
//
// The author's *sql.DB returned by SQL is closed; a caller still holding
// it gets errors from it.
func (r *Ref) Delete(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h := r.h
	return h.pool.remove(ctx, r.key, func() error {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return ErrClosed
		}
		data := h.data[r.key]
		delete(h.data, r.key)
		h.mu.Unlock()
		var errs []error
		if data != nil {
			errs = append(errs, data.Close())
		}
		if err := os.RemoveAll(r.dir); err != nil {
			errs = append(errs, fmt.Errorf("actor: removing %s: %w", r.dir, err))
		} else if err := syncDir(filepath.Dir(r.dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if idx, err := h.openIndex(ctx, false); err != nil {
			return err
		} else if idx != nil {
			if err := h.indexSet(ctx, r.class, r.id, time.Time{}, false); err != nil {
				return err
			}
			// Out of the write-ahead log too, where the old page still
			// names the actor.
			if _, err := idx.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
				return fmt.Errorf("actor: checkpointing the schedule index: %w", err)
			}
		}
		if r.legacy() {
			return r.deleteLegacy(ctx)
		}
		return nil
	})
}

// deleteLegacy deletes every key under the actor's prefix in the key-value
// layout, the migration marker last, so a failure half-way leaves the
// marker that keeps other hosts from serving the actor empty.
func (r *Ref) deleteLegacy(ctx context.Context) error {
	prefix, err := r.legacyPrefix()
	if err != nil {
		return err
	}
	store := r.h.opts.Store
	var ks []string
	marker := false
	for k, err := range store.ListKeys(ctx, prefix) {
		if err != nil {
			return fmt.Errorf("actor: listing %s: %w", prefix, err)
		}
		if k == prefix+markerName {
			marker = true
		} else {
			ks = append(ks, k)
		}
	}
	if marker {
		ks = append(ks, prefix+markerName)
	}
	for _, k := range ks {
		if err := store.Delete(ctx, k); err != nil {
			return fmt.Errorf("actor: deleting %s: %w", k, err)
		}
	}
	return nil
}
