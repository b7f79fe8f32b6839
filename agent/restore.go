package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/kv"
)

// restore loads recent sessions from the store at start-up, newest first,
// within the restore policy's caps. It reads the session index, so its
// cost grows with the caps, not with the store: the listing stops at the
// first session older than MaxAge, after MaxSessions sessions, or once
// MaxTotalBytes have been read. A session already on local disk is not
// loaded (local disk wins) but counts toward MaxSessions. A store error
// ends the restore with a warning; the runtime still starts, and sessions
// load on demand.
func (r *Runtime) restore(ctx context.Context) error {
	if !r.binding.RestoreAtStart() {
		return nil
	}
	p := r.policy.Restore
	cutoff := r.now().Add(-p.MaxAge)
	prefix := r.scope.SessionIndexPrefix()
	seen := map[string]bool{}
	var count, loaded int
	var bytes int64
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for e, err := range r.store.List(ctx, prefix) {
		if err != nil {
			r.log.Warn("agent: restore stopped: the store failed", "error", err, "loaded", loaded)
			break
		}
		updated, seg, ok := keys.ParseSessionIndex(prefix, e.Key)
		if !ok {
			r.log.Warn("agent: restore: skipping a malformed session-index key", "key", e.Key)
			continue
		}
		if seen[seg] {
			continue // a stale entry of a session seen newer
		}
		seen[seg] = true
		if updated.Before(cutoff) || count >= p.MaxSessions || bytes >= p.MaxTotalBytes {
			break
		}
		count++
		bytes += int64(len(e.Value))
		var idx metaRecord
		if err := decodeStored("session-index entry "+e.Key, e.Value, &idx); err != nil || idx.ID == "" {
			r.log.Warn("agent: restore: skipping an unreadable session-index entry", "key", e.Key, "error", err)
			continue
		}
		if _, err := r.db.Get(ctx, idx.ID); err == nil {
			continue // local disk wins
		}
		n, err := r.importSession(ctx, idx.ID)
		bytes += n
		switch {
		case errors.Is(err, ErrSessionNotFound):
			// A stale index entry of a deleted session.
		case err != nil:
			r.log.Warn("agent: restore: loading a session failed", "sessionId", idx.ID, "error", err)
		default:
			loaded++
		}
	}
	if loaded > 0 {
		r.log.Info("agent: restored sessions from the store", slog.Int("sessions", loaded), slog.Int64("bytes", bytes))
	}
	return nil
}

// importSession reads a session's metadata and event batches from the
// store and stores them on local disk, unless the session is already here.
// It returns the bytes read. A session the store does not have is
// ErrSessionNotFound; a store failure is ErrStoreUnavailable.
func (r *Runtime) importSession(ctx context.Context, id string) (int64, error) {
	metaKey, err := r.scope.SessionMeta(id)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrSessionNotFound, err)
	}
	data, err := r.store.Get(ctx, metaKey)
	if errors.Is(err, kv.ErrNotFound) {
		return 0, fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	}
	if err != nil {
		return 0, storeErr("loading session "+id, err)
	}
	read := int64(len(data))
	var mr metaRecord
	if err := decodeStored("metadata of session "+id, data, &mr); err != nil {
		return read, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	if mr.ID != id {
		return read, fmt.Errorf("%w: the stored metadata at %s names session %q", ErrStoreUnavailable, metaKey, mr.ID)
	}
	var recs []sessiondb.Record
	last := mr.LastSeq
	for b := int64(1); b <= mr.Batches; b++ {
		key, _ := r.scope.EventBatch(id, uint64(b))
		data, err := r.store.Get(ctx, key)
		if errors.Is(err, kv.ErrNotFound) {
			continue // a dropped mirror write
		}
		if err != nil {
			return read, storeErr("loading session "+id, err)
		}
		read += int64(len(data))
		var br batchRecord
		if err := decodeStored("event batch "+key, data, &br); err != nil {
			return read, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		for _, raw := range br.Events {
			var ev Event
			if err := json.Unmarshal(raw, &ev); err != nil || ev.Seq <= 0 {
				return read, fmt.Errorf("%w: an event in %s is damaged", ErrStoreUnavailable, key)
			}
			recs = append(recs, sessiondb.Record{SessionID: id, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: raw})
			last = max(last, ev.Seq)
		}
	}
	indexKey, _ := r.scope.SessionIndex(mr.UpdatedAt, id)
	m := sessiondb.Meta{
		ID: id, ChannelID: mr.ChannelID, Title: mr.Title,
		CreatedAt: mr.CreatedAt.UTC(), UpdatedAt: mr.UpdatedAt.UTC(),
		Turns: mr.Turns, LastSeq: last, LastStatus: mr.LastStatus,
		Token: mr.ContinuationToken, MirroredSeq: last, Batches: mr.Batches,
		IndexKey: indexKey, TokenMirrored: true,
	}
	if _, err := r.db.Import(ctx, m, recs); err != nil {
		return read, err
	}
	return read, nil
}

// loadFromStore loads a session on demand. Without Get in the store, a
// session not on local disk is not found.
func (r *Runtime) loadFromStore(ctx context.Context, id string) error {
	if !r.caps.Get {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	}
	_, err := r.importSession(ctx, id)
	return err
}

// resolveToken returns the id of the session a continuation token names:
// from local disk, else through the store (the continuation key, then the
// session's metadata and events, loaded onto local disk).
func (r *Runtime) resolveToken(ctx context.Context, token string) (string, error) {
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
	key, err := r.scope.Continuation(token)
	if err != nil {
		return "", ErrUnknownToken
	}
	data, err := r.store.Get(ctx, key)
	if errors.Is(err, kv.ErrNotFound) {
		return "", ErrUnknownToken
	}
	if err != nil {
		return "", storeErr("resolving a continuation token", r.redactErr(err))
	}
	var cr continuationRecord
	if err := decodeStored("continuation record", data, &cr); err != nil || cr.SessionID == "" {
		return "", fmt.Errorf("%w: the stored continuation record is unreadable: %v", ErrStoreUnavailable, err)
	}
	if _, err := r.db.Get(ctx, cr.SessionID); err == nil {
		return cr.SessionID, nil
	}
	if _, err := r.importSession(ctx, cr.SessionID); err != nil {
		if errors.Is(err, ErrSessionNotFound) {
			return "", ErrUnknownToken // the session was deleted
		}
		return "", err
	}
	return cr.SessionID, nil
}

// deleteFromStore removes a session's keys from the store: its index
// entry, token, event batches and metadata, in that order, so that an
// interrupted delete never leaves an index entry without its session.
// Without Delete in the store, the keys stay and a warning is logged.
func (r *Runtime) deleteFromStore(ctx context.Context, m sessiondb.Meta) error {
	if !r.caps.Delete {
		if m.Batches > 0 {
			r.logger(m.ID).Warn("agent: the store has no Delete; the deleted session's records stay in it", "store", r.binding.Name())
		}
		return nil
	}
	var dels []string
	if m.IndexKey != "" {
		dels = append(dels, m.IndexKey)
	}
	if k, err := r.scope.Continuation(m.Token); err == nil && m.Token != "" {
		dels = append(dels, k)
	}
	if r.caps.List {
		prefix, _ := r.scope.EventsPrefix(m.ID)
		for e, err := range r.store.List(ctx, prefix) {
			if err != nil {
				return storeErr("listing the session's event batches", err)
			}
			dels = append(dels, e.Key)
		}
	} else {
		for b := int64(1); b <= m.Batches; b++ {
			k, _ := r.scope.EventBatch(m.ID, uint64(b))
			dels = append(dels, k)
		}
	}
	if k, err := r.scope.SessionMeta(m.ID); err == nil {
		dels = append(dels, k)
	}
	for _, k := range dels {
		if err := r.store.Delete(ctx, k); err != nil {
			return storeErr("deleting session "+m.ID, r.redactErr(err))
		}
	}
	return nil
}
