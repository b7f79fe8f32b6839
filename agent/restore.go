package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/kv"
	"agentkit/storage"
)

// Restore's concurrency and import batches.
const (
	// restoreWorkers is how many sessions restore reads from the store
	// at once.
	restoreWorkers = 4
	// importBatch and importBatchBytes bound one transaction of imported
	// sessions.
	importBatch      = 128
	importBatchBytes = 8 << 20
)

// restore loads recent sessions from the
// store at start-up, newest first, within the restore policy's caps. It
// reads the session index, so its cost grows with the caps, not with the
// store: the listing stops at the first session older than MaxAge, after
// MaxSessions sessions, or once MaxTotalBytes have been read (a session is
// loaded while the bytes read before it, in index order, are under the
// cap). Each session is read with one List over its folder
// (storage.Sessions.LoadAll), restoreWorkers at a time, and written to
// local disk importBatch sessions a transaction, while the next are read. A session already on
// local disk counts toward MaxSessions; it is read from the store only
// when its index entry says the store is ahead (another host committed
// turns this copy lacks), and then only the missing batches are. A store
// error ends the restore with a warning; the runtime still starts, and
// sessions load on demand.
func (mr *storeMirror) restore(ctx context.Context) error {
	r := mr.r
	if !r.binding.RestoreAtStart() {
		return nil
	}
	p := r.policy.Restore
	cutoff := r.now().Add(-p.MaxAge)
	readCtx, cancel := context.WithCancel(ctx) // ends the reads past the caps
	defer cancel()
	// The index is listed, the sessions read and the batches stored at
	// the same time: picks flow from the listing to the readers and, in
	// index order, to this goroutine, which applies the bytes cap and
	// hands batches to the writer.
	picks := make(chan *restorePick, 2*importBatch)
	var listErr error
	go func() {
		defer close(picks)
		listErr = mr.restorePicks(readCtx, cutoff, p.MaxSessions, picks)
	}()
	var batch []importedSession
	var batchBytes, bytes int64
	var loaded, caught int
	// Each batch is stored while the next ones are read: at most two
	// batches wait for the writer.
	type stored struct {
		n, sessions int
		err         error
	}
	imports := make(chan chan stored, 2)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for ch := range imports {
			s := <-ch
			loaded += s.n
			if s.err != nil {
				r.log.Warn("agent: restore: storing sessions failed", "sessions", s.sessions, "error", s.err)
			}
		}
	}()
	flush := func() {
		if len(batch) == 0 {
			return
		}
		ch := make(chan stored, 1)
		imports <- ch
		go func(batch []importedSession) {
			n, err := mr.importSessions(ctx, batch)
			ch <- stored{n, len(batch), err}
		}(batch)
		batch, batchBytes = nil, 0
	}
	for pk := range picks {
		if bytes >= p.MaxTotalBytes {
			cancel()
			continue // drain: the listing and the readers stop
		}
		bytes += int64(pk.entry.Bytes)
		if pk.local {
			m, ms := pk.m, pk.ms
			if ms.Owes(m.LastSeq) || (pk.entry.Meta.LastSeq <= m.LastSeq && pk.entry.Meta.Batches <= ms.Batch) {
				continue
			}
			n, err := mr.catchUp(ctx, pk.id, ms)
			bytes += n
			if err != nil {
				r.log.Warn("agent: restore: catching up a session failed", "sessionId", pk.id, "error", err)
			} else {
				caught++
			}
			continue
		}
		res := <-pk.result
		bytes += res.bytes
		switch {
		case errors.Is(res.err, ErrSessionMoved):
			// Served by the ledger now: not restored here.
		case errors.Is(res.err, ErrSessionNotFound):
			// A stale index entry of a deleted session.
			if err := mr.sessions.DeleteIndex(ctx, pk.entry.Key); err != nil {
				r.log.Debug("agent: restore: removing a stale session-index entry failed", "error", err)
			}
		case res.err != nil:
			r.log.Warn("agent: restore: loading a session failed", "sessionId", pk.id, "error", res.err)
		default:
			batch = append(batch, res.imp)
			batchBytes += res.bytes
			if len(batch) >= importBatch || batchBytes >= importBatchBytes {
				flush()
			}
		}
	}
	if listErr != nil && readCtx.Err() == nil {
		r.log.Warn("agent: restore stopped: the store failed", "error", listErr)
	}
	cancel()
	flush()
	close(imports)
	<-collected
	if loaded > 0 || caught > 0 {
		r.log.Info("agent: restored sessions from the store", slog.Int("sessions", loaded), slog.Int("caughtUp", caught), slog.Int64("bytes", bytes))
	}
	return nil
}

// restorePick is a session restore considers: its newest index entry, and
// its local row and mirror state when it is on local disk; otherwise the
// read of it from the store, under way (result).
type restorePick struct {
	id     string
	entry  storage.IndexEntry
	local  bool
	m      sessiondb.Meta
	ms     sessiondb.MirrorState
	result chan restoreRead
}

// restoreRead is a session read from the store for restore.
type restoreRead struct {
	imp   importedSession
	bytes int64
	err   error
}

// restorePicks reads the session index, newest first, up to max sessions
// updated after cutoff, looks each up on local disk, starts reading those
// that are not (restoreWorkers at a time), and sends each to out in index
// order. A local database without sessions (a fresh host) is not looked
// up session by session.
func (mr *storeMirror) restorePicks(ctx context.Context, cutoff time.Time, max int, out chan<- *restorePick) error {
	r := mr.r
	lookUp := true
	if n, err := r.db.Count(ctx); err == nil && n == 0 {
		lookUp = false
	}
	sem := make(chan struct{}, restoreWorkers)
	seen := map[string]bool{}
	count := 0
	for e, err := range mr.sessions.ListIndex(ctx) {
		if storage.IsRecordError(err) {
			r.log.Warn("agent: restore: skipping an unreadable session-index entry", "key", e.Key, "error", err)
			continue
		}
		if err != nil {
			return err
		}
		id := e.Meta.ID
		if seen[id] {
			continue // a stale entry of a session seen newer
		}
		seen[id] = true
		if e.Updated.Before(cutoff) || count >= max {
			break
		}
		count++
		pk := &restorePick{id: id, entry: e}
		if lookUp {
			if m, ms, err := r.db.Mirror(ctx, id); err == nil {
				pk.local, pk.m, pk.ms = true, m, ms
			}
		}
		if !pk.local {
			pk.result = make(chan restoreRead, 1)
			select {
			case sem <- struct{}{}:
				go func() {
					defer func() { <-sem }()
					imp, n, err := mr.readSession(ctx, pk.id)
					pk.result <- restoreRead{imp, n, err}
				}()
			case <-ctx.Done():
				pk.result <- restoreRead{err: ctx.Err()}
			}
		}
		select {
		case out <- pk:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// importedSession is a session read from the store, ready to be stored
// on local disk.
type importedSession struct {
	m    sessiondb.Meta
	recs []sessiondb.Record
	ms   sessiondb.MirrorState
}

// readSession reads a session from the store with one listing of its
// folder and decodes it for local disk. It returns the bytes read. A
// session the store does not have, or has deleted, is ErrSessionNotFound;
// a store failure is ErrStoreUnavailable.
func (mr *storeMirror) readSession(ctx context.Context, id string) (importedSession, int64, error) {
	l, err := mr.sessions.LoadAll(ctx, id)
	return mr.decodeLoaded(id, l, err)
}

// decodeLoaded turns what Load or LoadAll read into a session for local
// disk.
func (mr *storeMirror) decodeLoaded(id string, l storage.Loaded, err error) (importedSession, int64, error) {
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return importedSession{}, l.Bytes, fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	case errors.Is(err, storage.ErrSessionDeleted):
		return importedSession{}, l.Bytes, fmt.Errorf("%w: %s (deleted)", ErrSessionNotFound, id)
	case errors.Is(err, storage.ErrSessionMoved):
		return importedSession{}, l.Bytes, fmt.Errorf("%w: %w", ErrSessionMoved, err)
	case err != nil:
		return importedSession{}, l.Bytes, storeErr("loading session "+id, err)
	}
	recs, last, err := records(id, l.Batches)
	if err != nil {
		return importedSession{}, l.Bytes, err
	}
	ms := mr.loadedState(l.Head, last)
	m := localMeta(l.Head.SessionMeta)
	m.LastSeq = ms.MirroredSeq
	m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored = ms.MirroredSeq, ms.Batch, ms.IndexKey, true
	return importedSession{m: m, recs: recs, ms: ms}, l.Bytes, nil
}

// importSessions stores sessions read from the store on local disk, in
// one transaction, skipping those already here. It returns how many it
// stored.
func (mr *storeMirror) importSessions(ctx context.Context, ss []importedSession) (int, error) {
	r := mr.r
	n := 0
	err := r.db.Write(ctx, func(tx *sessiondb.Tx) error {
		n = 0
		for _, s := range ss {
			ok, err := tx.ImportMirrored(s.m, s.recs, s.ms)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return nil
	})
	for _, s := range ss {
		r.convs.drop(s.m.ID)
		mr.forget(s.m.ID)
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// catchUp adds to a local session the batches the store has beyond it. It
// returns the bytes read.
func (mr *storeMirror) catchUp(ctx context.Context, id string, ms sessiondb.MirrorState) (int64, error) {
	r := mr.r
	l, err := mr.sessions.Load(ctx, id, storage.BatchRef{Number: ms.Batch, ID: ms.BatchID})
	switch {
	case errors.Is(err, storage.ErrSessionDeleted):
		mr.removeDeleted(ctx, id)
		return l.Bytes, nil
	case errors.Is(err, storage.ErrSessionMoved):
		return l.Bytes, nil // served by the ledger now
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
	st.state = nil
	_, err = mr.adopt(ctx, st, id, l)
	return l.Bytes, err
}

// importSession reads a session from the store (its head and batches, or
// for a session from before heads its metadata and batches) and stores it
// on local disk, unless the session is already here. It returns the bytes
// read. A session the store does not have, or has deleted, is
// ErrSessionNotFound; a store failure is ErrStoreUnavailable.
func (mr *storeMirror) importSession(ctx context.Context, id string) (int64, error) {
	l, err := mr.sessions.Load(ctx, id, storage.BatchRef{})
	imp, n, err := mr.decodeLoaded(id, l, err)
	if err != nil {
		return n, err
	}
	_, err = mr.importSessions(ctx, []importedSession{imp})
	return n, err
}

// load loads a session that is not on local disk, on demand
// (ErrSessionNotFound when the store does not have it,
// ErrStoreUnavailable when it fails). Without
// Get in the store, a session not on local disk is not found.
func (mr *storeMirror) load(ctx context.Context, id string) error {
	if !mr.r.caps.Get {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	}
	_, err := mr.importSession(ctx, id)
	return err
}

// removeDeleted removes here a session the store says was deleted (its
// head is a tombstone): its events, token, reminders and workspace. The
// caller holds the session's turn lock, or no turn can run on it.
func (mr *storeMirror) removeDeleted(ctx context.Context, id string) {
	r := mr.r
	r.logger(id).Info("agent: the session was deleted on another host; removing this host's copy")
	if err := r.removeLocal(ctx, id); err != nil {
		r.logger(id).Warn("agent: removing a session deleted on another host failed", "error", err)
	}
	mr.forget(id)
}
