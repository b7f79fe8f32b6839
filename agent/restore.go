package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"agentkit/agent/sessiondb"
	"agentkit/kv"
	"agentkit/storage"
)

// restore implements sessionMirror: it loads recent sessions from the store at start-up, newest first,
// within the restore policy's caps. It reads the session index, so its
// cost grows with the caps, not with the store: the listing stops at the
// first session older than MaxAge, after MaxSessions sessions, or once
// MaxTotalBytes have been read. A session already on local disk counts
// toward MaxSessions; it is read from the store only when its index entry
// says the store is ahead (another host committed turns this copy lacks),
// and then only the missing batches are. A store error ends the restore
// with a warning; the runtime still starts, and sessions load on demand.
func (mr *storeMirror) restore(ctx context.Context) error {
	r := mr.r
	if !r.binding.RestoreAtStart() {
		return nil
	}
	p := r.policy.Restore
	cutoff := r.now().Add(-p.MaxAge)
	seen := map[string]bool{}
	var count, loaded, caught int
	var bytes int64
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for e, err := range mr.sessions.ListIndex(ctx) {
		if storage.IsRecordError(err) {
			r.log.Warn("agent: restore: skipping an unreadable session-index entry", "key", e.Key, "error", err)
			continue
		}
		if err != nil {
			r.log.Warn("agent: restore stopped: the store failed", "error", err, "loaded", loaded)
			break
		}
		id := e.Meta.ID
		if seen[id] {
			continue // a stale entry of a session seen newer
		}
		seen[id] = true
		if e.Updated.Before(cutoff) || count >= p.MaxSessions || bytes >= p.MaxTotalBytes {
			break
		}
		count++
		bytes += int64(e.Bytes)
		if m, ms, err := r.db.Mirror(ctx, id); err == nil {
			// Local disk is kept; the store's newer batches are added to
			// it, unless this host has its own events to commit (the
			// next turn settles those).
			if ms.Owes(m.LastSeq) || (e.Meta.LastSeq <= m.LastSeq && e.Meta.Batches <= ms.Batch) {
				continue
			}
			n, err := mr.catchUp(ctx, id, ms)
			bytes += n
			if err != nil {
				r.log.Warn("agent: restore: catching up a session failed", "sessionId", id, "error", err)
			} else {
				caught++
			}
			continue
		}
		n, err := mr.importSession(ctx, id)
		bytes += n
		switch {
		case errors.Is(err, ErrSessionNotFound):
			// A stale index entry of a deleted session.
			if err := mr.sessions.DeleteIndex(ctx, e.Key); err != nil {
				r.log.Debug("agent: restore: removing a stale session-index entry failed", "error", err)
			}
		case err != nil:
			r.log.Warn("agent: restore: loading a session failed", "sessionId", id, "error", err)
		default:
			loaded++
		}
	}
	if loaded > 0 || caught > 0 {
		r.log.Info("agent: restored sessions from the store", slog.Int("sessions", loaded), slog.Int("caughtUp", caught), slog.Int64("bytes", bytes))
	}
	return nil
}

// catchUp adds to a local session the batches the store has beyond it. It
// returns the bytes read.
func (mr *storeMirror) catchUp(ctx context.Context, id string, ms sessiondb.MirrorState) (int64, error) {
	r := mr.r
	l, err := mr.sessions.Load(ctx, id, storage.BatchRef{Number: ms.Batch, ID: ms.BatchID})
	switch {
	case errors.Is(err, storage.ErrSessionDeleted):
		r.removeDeleted(ctx, id)
		return l.Bytes, nil
	case err != nil:
		return l.Bytes, err
	case len(l.Batches) == 0 && !l.Diverged:
		return l.Bytes, nil
	}
	st, release, err := r.lockSession(ctx, id)
	if err != nil {
		return l.Bytes, err
	}
	defer release()
	st.mirror.Lock()
	defer st.mirror.Unlock()
	return l.Bytes, mr.adopt(ctx, id, l)
}

// importSession reads a session from the store (its head and batches, or
// for a session from before heads its metadata and batches) and stores it
// on local disk, unless the session is already here. It returns the bytes
// read. A session the store does not have, or has deleted, is
// ErrSessionNotFound; a store failure is ErrStoreUnavailable.
func (mr *storeMirror) importSession(ctx context.Context, id string) (int64, error) {
	r := mr.r
	l, err := mr.sessions.Load(ctx, id, storage.BatchRef{})
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return l.Bytes, fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	case errors.Is(err, storage.ErrSessionDeleted):
		return l.Bytes, fmt.Errorf("%w: %s (deleted)", ErrSessionNotFound, id)
	case err != nil:
		return l.Bytes, storeErr("loading session "+id, err)
	}
	recs, last, err := records(id, l.Batches)
	if err != nil {
		return l.Bytes, err
	}
	ms := mr.loadedState(l.Head, last)
	m := localMeta(l.Head.SessionMeta)
	m.LastSeq = ms.MirroredSeq
	m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored = ms.MirroredSeq, ms.Batch, ms.IndexKey, true
	r.convs.drop(id)
	if _, err := r.db.ImportMirrored(ctx, m, recs, ms); err != nil {
		return l.Bytes, err
	}
	return l.Bytes, nil
}

// load implements sessionMirror: it loads a session on demand. Without
// Get in the store, a session not on local disk is not found.
func (mr *storeMirror) load(ctx context.Context, id string) error {
	if !mr.r.caps.Get {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	}
	_, err := mr.importSession(ctx, id)
	return err
}

// resolve implements sessionMirror: it returns the id of the session a continuation token names:
// from local disk, else through the store (the continuation record, then
// the session, loaded onto local disk). A session deleted in the store is
// an unknown token, whatever stray key still names it.
func (mr *storeMirror) resolve(ctx context.Context, token string) (string, error) {
	r := mr.r
	if len(token) > maxTokenLen {
		return "", ErrUnknownToken
	}
	id, err := r.db.SessionOfToken(ctx, token)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, sessiondb.ErrNotFound) {
		return "", err
	}
	if !r.caps.Get {
		return "", ErrUnknownToken
	}
	id, err = mr.sessions.ResolveToken(ctx, token)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return "", ErrUnknownToken
	case storage.IsRecordError(err):
		return "", fmt.Errorf("%w: the stored continuation record is unreadable: %w", ErrStoreUnavailable, err)
	case err != nil:
		return "", storeErr("resolving a continuation token", err)
	}
	if _, err := r.db.Get(ctx, id); err == nil {
		return id, nil
	}
	if _, err := mr.importSession(ctx, id); err != nil {
		if errors.Is(err, ErrSessionNotFound) {
			return "", ErrUnknownToken // the session was deleted
		}
		return "", err
	}
	return id, nil
}

// removeDeleted removes here a session the store says was deleted (its
// head is a tombstone): its events, token, reminders and workspace. The
// caller holds the session's turn lock, or no turn can run on it.
func (r *Runtime) removeDeleted(ctx context.Context, id string) {
	r.logger(id).Info("agent: the session was deleted on another host; removing this host's copy")
	if err := r.removeLocal(ctx, id); err != nil {
		r.logger(id).Warn("agent: removing a session deleted on another host failed", "error", err)
	}
}
