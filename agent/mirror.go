package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/memory"
	"agentkit/storage"
)

// Timing of the session mirror.
const (
	// mirrorTimeout bounds the store operations of one flush.
	mirrorTimeout = 30 * time.Second
	// headTimeout bounds the read of the session head before a turn: a
	// store slower than that lets the turn run from the local copy.
	headTimeout = 10 * time.Second
	// retryMin and retryMax bound the background retry's back-off, which
	// doubles after each round that leaves writes owed.
	retryMin = time.Second
	retryMax = 5 * time.Minute
)

// sessionMirror is how a session's turns reach the store beyond this
// host's disk, and how turns other hosts committed reach this host. The
// runtime calls it around every turn, under the session's turn lock; it
// is the one seam between the turn loop and the store's session records,
// so another commit path can take its place.
type sessionMirror interface {
	// beforeTurn brings the local copy up to the store's and returns the
	// session's row as it then is (sessiondb.ErrNotFound when the session
	// is not here): what other hosts
	// committed is imported, and this host's events that lost the session
	// head to them are moved aside as a fork. A deleted session is
	// ErrSessionNotFound (and is removed here). A store that does not
	// answer lets the turn run from the local copy.
	beforeTurn(ctx context.Context, st *sessionState, id string) (sessiondb.Meta, error)
	// created is called, under the turn lock, before the first turn of a
	// session this host creates: no store can know the session yet.
	created(st *sessionState, id string)
	// recorded is called after events are recorded on local disk.
	recorded(st *sessionState, id string)
	// endTurn writes a turn's last events with write, adding to that
	// transaction what the mirror wants written with them (extra), then
	// writes what the store lacks of the session. A failed write is
	// returned: the turn fails. The store's failures are kept and retried.
	endTurn(ctx context.Context, st *sessionState, id string, end turnEnd) error
	// deleteSession deletes the session from the store for every host.
	deleteSession(ctx context.Context, m sessiondb.Meta) error
	// load loads a session that is not on local disk (ErrSessionNotFound
	// when the store does not have it, ErrStoreUnavailable when it fails).
	load(ctx context.Context, id string) error
	// resolve returns the session a continuation token names, loading it
	// when it is not on local disk (ErrUnknownToken, ErrStoreUnavailable).
	resolve(ctx context.Context, token string) (string, error)
	// restore loads recent sessions at start-up, within the policy's caps.
	restore(ctx context.Context) error
	// flushBacklog writes what the store lacks of every session, at
	// start-up.
	flushBacklog(ctx context.Context) error
	// start runs background work (the retry of failed writes) until ctx
	// ends; Open calls it once.
	start(ctx context.Context)
	// forget drops what the mirror keeps in memory of a session removed
	// here.
	forget(id string)
	// save writes the mirror state kept in memory (all of it when wait is
	// set: Close calls it once no turn runs).
	save(ctx context.Context, wait bool)
	// stats reports the failed writes, the sessions in the backlog and
	// the forks since Open.
	stats() (failed int64, backlog int, forks int64)
}

// storeMirror mirrors sessions to the store through the record layer
// (storage.Sessions): each batch is committed with the session head's
// compare-and-set (storage.Sessions.Commit), so a host never overwrites
// newer turns another host committed. What the store refused is kept (the
// local database knows what was committed) and retried at the next turn,
// at the next start, and in the background with back-off, until it lands.
type storeMirror struct {
	r        *Runtime
	sessions *storage.Sessions

	failed atomic.Int64
	forks  atomic.Int64

	mu      sync.Mutex
	backlog map[string]bool // sessions the store lacks something of
	wake    chan struct{}
	// unsaved holds, per session, a mirror state whose commit reached the
	// store but is not yet written to the local database: it goes with the
	// session's next local write of its mirror state (the next turn's last
	// write), or with the background saver's (saveInterval, grouping every
	// session waiting), or at Close. Until then it is the session's mirror
	// state (state reads it). Losing it (a crash) leaves the pending commit
	// recorded before the commit, which the next flush retries and finds
	// landed. An entry is read and changed only under its session's
	// mirror lock; mu guards the map.
	unsaved map[string]sessiondb.MirrorState
}

// saveInterval is how long a committed mirror state waits in memory for
// the session's next write before the background saver writes it.
const saveInterval = time.Second

var _ sessionMirror = (*storeMirror)(nil)

func newStoreMirror(r *Runtime, sessions *storage.Sessions) *storeMirror {
	return &storeMirror{r: r, sessions: sessions, backlog: map[string]bool{}, wake: make(chan struct{}, 1), unsaved: map[string]sessiondb.MirrorState{}}
}

// storeMeta is a session row as the store's metadata, naming batch.
func storeMeta(m sessiondb.Meta, batch int64) storage.SessionMeta {
	return storage.SessionMeta{
		ID: m.ID, ChannelID: m.ChannelID, Title: m.Title,
		CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, Turns: m.Turns,
		LastSeq: m.LastSeq, LastStatus: m.LastStatus, Batches: batch,
		ContinuationToken: m.Token,
	}
}

// localMeta is the store's metadata as a session row.
func localMeta(h storage.SessionMeta) sessiondb.Meta {
	return sessiondb.Meta{
		ID: h.ID, ChannelID: h.ChannelID, Title: h.Title,
		CreatedAt: h.CreatedAt.UTC(), UpdatedAt: h.UpdatedAt.UTC(),
		Turns: h.Turns, LastSeq: h.LastSeq, LastStatus: h.LastStatus,
		Token: h.ContinuationToken,
	}
}

// records decodes the events of loaded batches for the local database,
// returning them and the highest sequence number.
func records(id string, batches []storage.Batch) ([]sessiondb.Record, int64, error) {
	var recs []sessiondb.Record
	var last int64
	for _, b := range batches {
		for _, raw := range b.Events {
			var ev struct {
				Seq  int64     `json:"seq"`
				Type string    `json:"type"`
				At   time.Time `json:"at"`
			}
			if err := json.Unmarshal(raw, &ev); err != nil || ev.Seq <= 0 {
				return nil, 0, fmt.Errorf("%w: an event in batch %d of session %s is damaged", ErrStoreUnavailable, b.Number, id)
			}
			recs = append(recs, sessiondb.Record{SessionID: id, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: raw})
			last = max(last, ev.Seq)
		}
	}
	slices.SortFunc(recs, func(a, b sessiondb.Record) int { return int(a.Seq - b.Seq) })
	recs = slices.CompactFunc(recs, func(a, b sessiondb.Record) bool { return a.Seq == b.Seq })
	return recs, last, nil
}

// state returns a session's row and mirror state: the local database's,
// or the state kept in memory since its last commit (unsaved). The caller
// holds the session's mirror lock.
func (mr *storeMirror) state(ctx context.Context, id string) (sessiondb.Meta, sessiondb.MirrorState, error) {
	m, ms, err := mr.r.db.Mirror(ctx, id)
	if err != nil {
		return m, ms, err
	}
	if u, ok := mr.unsavedState(id); ok {
		ms = u
		m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored = u.MirroredSeq, u.Batch, u.IndexKey, u.TokenMirrored
	}
	return m, ms, nil
}

func (mr *storeMirror) unsavedState(id string) (sessiondb.MirrorState, bool) {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	u, ok := mr.unsaved[id]
	return u, ok
}

// keep holds a committed mirror state in memory until it is saved.
func (mr *storeMirror) keep(id string, ms sessiondb.MirrorState) {
	mr.mu.Lock()
	mr.unsaved[id] = ms
	mr.mu.Unlock()
}

// forget implements sessionMirror.
func (mr *storeMirror) forget(id string) { mr.saved(id) }

// saved forgets the state kept in memory: the local database has it (or a
// newer one), or the session is gone.
func (mr *storeMirror) saved(id string) {
	mr.mu.Lock()
	delete(mr.unsaved, id)
	mr.mu.Unlock()
}

// save implements sessionMirror: it writes the mirror states kept in
// memory, of every session whose mirror lock it gets (all of them when
// wait is set), in one write of the local database.
func (mr *storeMirror) save(ctx context.Context, wait bool) {
	r := mr.r
	mr.mu.Lock()
	ids := make([]string, 0, len(mr.unsaved))
	for id := range mr.unsaved {
		ids = append(ids, id)
	}
	mr.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	states := map[string]sessiondb.MirrorState{}
	for _, id := range ids {
		st, unref := r.refSession(id)
		if wait {
			st.mirror.Lock()
		} else if !st.mirror.TryLock() {
			unref()
			continue // a flush of the session is under way: it saves the state
		}
		defer unref()
		defer st.mirror.Unlock()
		if ms, ok := mr.unsavedState(id); ok {
			states[id] = ms
		}
	}
	err := r.db.Write(ctx, func(tx *sessiondb.Tx) error {
		for id, ms := range states {
			if err := tx.SetMirror(id, ms); err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		r.log.Warn("agent: mirror: saving mirror states failed; the pending commits they settle are retried", "error", err)
		return
	}
	for id := range states {
		mr.saved(id)
	}
}

// loadedState is the mirror state of a session just read from the store.
func (mr *storeMirror) loadedState(h storage.Head, last int64) sessiondb.MirrorState {
	seq := max(h.LastSeq, last)
	indexKey, _ := mr.sessions.IndexKey(h.ID, h.UpdatedAt)
	return sessiondb.MirrorState{
		MirroredSeq: seq, Batch: h.Batches, BatchID: h.BatchID,
		IndexKey: indexKey, TokenMirrored: true, MetaSeq: seq,
	}
}

// beforeTurn implements sessionMirror.
func (mr *storeMirror) beforeTurn(ctx context.Context, st *sessionState, id string) (sessiondb.Meta, error) {
	r := mr.r
	if !r.caps.Get {
		// A store that cannot be read: nothing to catch up with.
		return r.db.Get(ctx, id)
	}
	st.mirror.Lock()
	m, ms, err := mr.state(ctx, id)
	st.mirror.Unlock()
	if err != nil {
		return m, err
	}
	if ms.Batch == 0 && ms.PendingID == "" {
		// Never committed: no other host can know the session, and it has
		// no head.
		st.mirror.Lock()
		st.known, st.state = &storage.KnownHead{}, &ms
		st.mirror.Unlock()
		return m, nil
	}
	if ms.PendingID != "" {
		// A commit whose outcome is unknown: settle it first, so that the
		// store's copy of it is not taken for another host's.
		mr.flush(ctx, st, id, true)
		st.mirror.Lock()
		m, ms, err = mr.state(ctx, id)
		st.mirror.Unlock()
		if errors.Is(err, sessiondb.ErrNotFound) {
			return m, fmt.Errorf("%w: %s (deleted)", ErrSessionNotFound, id)
		} else if err != nil {
			return m, err
		}
	}
	hctx, cancel := context.WithTimeout(ctx, headTimeout)
	defer cancel()
	l, err := mr.sessions.Load(hctx, id, storage.BatchRef{Number: ms.Batch, ID: ms.BatchID})
	switch {
	case errors.Is(err, storage.ErrSessionDeleted):
		r.removeDeleted(ctx, id)
		return m, fmt.Errorf("%w: %s (deleted on another host)", ErrSessionNotFound, id)
	case errors.Is(err, kv.ErrNotFound):
		return m, nil // not in the store yet
	case err != nil:
		r.logger(id).Warn("agent: the store did not answer before the turn; the turn runs from this host's copy and is committed when the store answers",
			r.logStoreName(), slog.String("error", err.Error()))
		return m, nil
	}
	st.mirror.Lock()
	defer st.mirror.Unlock()
	st.known = known(l)
	if len(l.Batches) == 0 && !l.Diverged {
		st.state = &ms
		return m, nil
	}
	if err := mr.adopt(ctx, id, l); err != nil {
		return m, err
	}
	return r.db.Get(ctx, id)
}

// adopt makes the store's history the local copy's: the loaded batches
// are appended, and local events that differ from them are moved aside as
// a fork (sessiondb.Adopt). The caller holds the session's turn lock and
// its mirror lock.
func (mr *storeMirror) adopt(ctx context.Context, id string, l storage.Loaded) error {
	r := mr.r
	recs, last, err := records(id, l.Batches)
	if err != nil {
		return err
	}
	ms := mr.loadedState(l.Head, last)
	m := localMeta(l.Head.SessionMeta)
	m.LastSeq = ms.MirroredSeq
	n, err := r.db.Adopt(ctx, m, recs, ms, l.Head.Writer, r.now())
	mr.saved(id)
	// The session's events changed under its cached conversation (events
	// added, or replaced by others with the same numbers: a fork).
	r.convs.drop(id)
	if err != nil {
		return fmt.Errorf("agent: taking session %s from the store: %w", id, err)
	}
	mr.setBacklog(id, false)
	if n > 0 {
		mr.forks.Add(1)
		r.logger(id).Warn("agent: another host committed this session's turns first; this host's events that lost are kept here as a fork (sessions.db, table forked_events) and the session goes on from the store's history",
			slog.Int("forkedEvents", n), slog.String("winner", l.Head.Writer), slog.Int64("storeLastSeq", ms.MirroredSeq))
		r.obs.MirrorForked(id, n)
	} else if len(recs) > 0 {
		r.logger(id).Info("agent: took the turns other hosts committed from the store", slog.Int("events", len(recs)), slog.String("writer", l.Head.Writer))
	}
	return nil
}

// created implements sessionMirror: a new session has no head.
func (mr *storeMirror) created(st *sessionState, _ string) {
	st.mirror.Lock()
	st.known, st.state = &storage.KnownHead{}, &sessiondb.MirrorState{}
	st.mirror.Unlock()
}

// recorded implements sessionMirror: it (re)starts the debounce timer of
// a busy session, so its events reach the store that long after the last
// one even while the turn runs.
func (mr *storeMirror) recorded(st *sessionState, id string) {
	r := mr.r
	d := r.policy.Debounce
	if d <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.timer != nil {
		st.timer.Reset(d)
		return
	}
	st.timer = time.AfterFunc(d, func() {
		exit, err := r.enter()
		if err != nil {
			return
		}
		defer exit()
		mr.flush(r.bg, st, id, false)
	})
}

// endTurn implements sessionMirror: it stops the debounce timer and,
// holding the session's mirror lock, writes the turn's last events with
// the mirror's part of them:
//
//   - with the embedded default store (in the session database), the
//     whole commit of the turn's events (batch, head, copies, mirror state)
//     goes in the events' own transaction: one commit, one fsync, for the
//     turn's events and their copy in the store;
//   - with another store, the pending commit (its batch id, last event and
//     metadata) is recorded with the events, so it is known before it can
//     reach the store (an answer lost with the process is then never taken
//     for another host's write), and the commit follows.
//
// A session with an earlier commit still unsettled (a pending commit, or
// owed copies) goes the general way: flush after the write.
func (mr *storeMirror) endTurn(ctx context.Context, st *sessionState, id string, end turnEnd) error {
	r := mr.r
	write := end.write
	r.mu.Lock()
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	r.mu.Unlock()
	st.mirror.Lock()
	defer st.mirror.Unlock()
	if done, err := mr.endTurnAlongside(ctx, st, id, end); done {
		return err
	}
	var committed bool // the commit went in the events' transaction
	var fresh string   // the pending commit recorded with the events
	unsaved, hasUnsaved := mr.unsavedState(id)
	var wroteState bool // the write carries the session's mirror state
	known := st.state
	st.state = nil
	err := write(func(tx *sessiondb.Tx) error {
		var m sessiondb.Meta
		var ms sessiondb.MirrorState
		if known != nil {
			// The row this write just stored, and the state beforeTurn
			// read, which nothing changed since.
			m, ms = end.meta, *known
		} else {
			var err error
			if m, ms, err = tx.Mirror(id); err != nil {
				return nil
			}
			if hasUnsaved {
				ms = unsaved
			}
		}
		if ms.PendingID != "" || !ms.Settled() || m.LastSeq <= ms.MirroredSeq {
			return nil // flushed the general way below
		}
		if r.embedded != nil {
			var err error
			committed, err = mr.commitInTx(ctx, tx, st, m, ms, end.recs)
			wroteState = committed
			return err
		}
		if !r.caps.Get {
			return nil
		}
		req, err := mr.newCommit(m, &ms)
		if err != nil {
			return nil
		}
		if err := tx.SetMirror(id, ms); err != nil {
			return err
		}
		fresh, wroteState = req.BatchID, true
		return nil
	})
	if err != nil {
		return err
	}
	if wroteState {
		mr.saved(id)
	}
	if committed {
		mr.setBacklog(id, false)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
	defer cancel()
	mr.setBacklog(id, mr.commit(ctx, st, id, true, fresh))
	return nil
}

// turnEnd is a turn's last write, as endTurn gets it: the session's row
// after the turn, the events not yet on disk, and the write of both (with
// the mirror's part, extra, in the same transaction).
type turnEnd struct {
	meta  sessiondb.Meta
	recs  []sessiondb.Record
	write func(extra func(*sessiondb.Tx) error) error
}

// endTurnAlongside is endTurn for a store with the batch capability other
// than the embedded one: the commit to the store runs at the same time as
// the local write of the turn's events and its pending record, instead of
// after it, so a turn waits for the slower of the two writes rather than
// for both. The order they finish in does not matter: the batch and head
// land together or not at all; if the store's lands and the local write
// does not (a crash, a disk failure), the events were never published, and
// the session's next turn takes them from the store like any commit it
// lacks; if the local write lands and the store's does not, the pending
// record is retried. done is false when the session does not qualify (no
// batch capability, an earlier commit unsettled): endTurn goes on the
// general way, nothing written yet.
func (mr *storeMirror) endTurnAlongside(ctx context.Context, st *sessionState, id string, end turnEnd) (done bool, err error) {
	r := mr.r
	if r.embedded != nil || !r.caps.Batch || !r.caps.Get || len(end.recs) == 0 {
		return false, nil
	}
	var prev sessiondb.Meta
	var ms sessiondb.MirrorState
	if st.state != nil {
		// The state beforeTurn read, which nothing changed since; the
		// events on disk before this write are the turn's row's less the
		// ones it writes.
		prev, ms = sessiondb.Meta{ID: id, LastSeq: end.meta.LastSeq - int64(len(end.recs))}, *st.state
	} else {
		var err error
		prev, ms, err = mr.state(ctx, id)
		if end.meta.Turns == 1 && errors.Is(err, sessiondb.ErrNotFound) {
			prev, ms, err = sessiondb.Meta{ID: id}, sessiondb.MirrorState{}, nil // created by this write
		}
		if err != nil {
			return false, nil
		}
	}
	if ms.PendingID != "" || !ms.Settled() {
		return false, nil
	}
	st.state = nil
	var events []json.RawMessage
	if prev.LastSeq > ms.MirroredSeq {
		earlier, err := r.db.Range(ctx, id, ms.MirroredSeq+1, prev.LastSeq)
		if err != nil {
			return false, nil
		}
		for _, rec := range earlier {
			events = append(events, rec.Data)
		}
	}
	for _, rec := range end.recs {
		events = append(events, rec.Data)
	}
	if int64(len(events)) != end.meta.LastSeq-ms.MirroredSeq {
		return false, nil // not one contiguous run of events: the general way
	}
	req, err := mr.newCommit(end.meta, &ms)
	if err != nil {
		return false, nil
	}
	req.Events, req.Known = events, st.known
	req.Copies = &storage.Copies{PrevIndexKey: ms.IndexKey}
	if !ms.TokenMirrored {
		req.Copies.Token = end.meta.Token
	}
	type answer struct {
		res storage.CommitResult
		err error
	}
	answered := make(chan answer, 1)
	cctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
	defer cancel()
	go func() {
		res, err := mr.sessions.Commit(cctx, req)
		answered <- answer{res, err}
	}()
	werr := end.write(func(tx *sessiondb.Tx) error { return tx.SetMirror(id, ms) })
	a := <-answered
	st.known = nil
	if werr != nil {
		return true, werr
	}
	mr.saved(id)
	switch {
	case a.err != nil:
		mr.writeFailed(ctx, id, a.err)
		mr.setBacklog(id, true)
	case a.res.Outcome == storage.Committed && a.res.Copied:
		ms.MirroredSeq, ms.Batch, ms.BatchID = ms.PendingSeq, a.res.Batch.Number, a.res.Batch.ID
		ms.PendingID, ms.PendingSeq, ms.PendingMeta = "", 0, nil
		ms.IndexKey, ms.MetaSeq, ms.TokenMirrored = a.res.IndexKey, ms.MirroredSeq, true
		mr.keep(id, ms)
		if a.res.Version != "" {
			st.known = &storage.KnownHead{Head: a.res.Head, Version: a.res.Version}
		}
		mr.setBacklog(id, false)
	default:
		// Behind, deleted, or landed without its copies: the general
		// commit settles the pending record (reading the head again).
		mr.setBacklog(id, mr.commit(cctx, st, id, true, ""))
	}
	return true, nil
}

// commitInTx commits a session's new events to the embedded default store
// inside tx, the session database's transaction that wrote them: the
// record layer's Commit through the store as tx sees it (one atomic batch:
// the event batch, the head, the metadata, the index entry, the token),
// then the mirror state. fresh are the events tx wrote, which are the
// events to commit when none before them waits. It reports whether it
// committed; anything else (another writer's head, a tombstone) leaves
// the store's records as they were (the batch is atomic), and the session
// to the general flush. A failure to save the mirror state after the
// commit fails the whole write.
func (mr *storeMirror) commitInTx(ctx context.Context, tx *sessiondb.Tx, st *sessionState, m sessiondb.Meta, ms sessiondb.MirrorState, fresh []sessiondb.Record) (bool, error) {
	r := mr.r
	known := st.known
	st.known = nil
	db, err := r.txStore(tx)
	if err != nil {
		return false, nil
	}
	recs := fresh
	if int64(len(recs)) != m.LastSeq-ms.MirroredSeq {
		if recs, err = tx.Range(m.ID, ms.MirroredSeq+1, m.LastSeq); err != nil || len(recs) == 0 {
			return false, nil
		}
	}
	req := storage.CommitRequest{
		Writer: r.hostID, Base: storage.BatchRef{Number: ms.Batch, ID: ms.BatchID},
		Meta: storeMeta(m, 0), BatchID: storage.NewBatchID(), Known: known,
		Copies: &storage.Copies{PrevIndexKey: ms.IndexKey},
	}
	if !ms.TokenMirrored {
		req.Copies.Token = m.Token
	}
	for _, rec := range recs {
		req.Events = append(req.Events, rec.Data)
	}
	res, err := mr.sessions.On(db).Commit(ctx, req)
	if err != nil {
		r.logger(m.ID).Warn("agent: mirror: committing with the turn's events failed; committed after them", "error", err)
		return false, nil
	}
	if res.Outcome != storage.Committed || !res.Copied {
		return false, nil
	}
	ms.MirroredSeq, ms.Batch, ms.BatchID = m.LastSeq, res.Batch.Number, res.Batch.ID
	ms.IndexKey, ms.MetaSeq, ms.TokenMirrored = res.IndexKey, m.LastSeq, true
	if err := tx.SetMirror(m.ID, ms); err != nil {
		return false, err // the store's records and the events go together
	}
	if res.Version != "" {
		st.known = &storage.KnownHead{Head: res.Head, Version: res.Version}
	}
	return true, nil
}

// flush writes what the store lacks of a session and records whether it
// still lacks something (the backlog). locked says the caller holds the
// session's turn lock: only then is a lost head resolved (the turn moved
// aside as a fork) or a tombstone applied, because both rewrite the local
// copy; otherwise the next flush under the lock does it.
func (mr *storeMirror) flush(ctx context.Context, st *sessionState, id string, locked bool) {
	st.mirror.Lock()
	defer st.mirror.Unlock()
	ctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
	defer cancel()
	mr.setBacklog(id, mr.commit(ctx, st, id, locked, ""))
}

// commit commits the session's events not yet in the store, batch by
// batch, then writes its metadata, index entry and token if they are owed.
// It reports whether the store still lacks something. The caller holds
// the session's mirror lock.
//
// A committed batch is saved locally with the next write of the mirror
// state (the next batch's pending record, or the metadata's), not on its
// own: if the process stops in between, the pending record it still holds
// is retried and found landed. fresh names a pending commit recorded by
// this process that never reached the store: it is its first attempt, not
// a retry, so the head the turn read before it is used.
func (mr *storeMirror) commit(ctx context.Context, st *sessionState, id string, locked bool, fresh string) (owes bool) {
	r := mr.r
	st.state = nil
	log := r.logger(id)
	m, ms, err := mr.state(ctx, id)
	if errors.Is(err, sessiondb.ErrNotFound) {
		mr.saved(id)
		return false
	}
	if err != nil {
		log.Warn("agent: mirror: reading the session failed", "error", err)
		return true
	}
	dirty := false // ms holds a committed batch not yet saved
	defer func() {
		if dirty {
			// Saved with the session's next write of its mirror state, or
			// by the background saver (see unsaved).
			mr.keep(id, ms)
		}
	}()
	for {
		req, ok, err := mr.nextCommit(ctx, m, &ms)
		if err != nil {
			log.Warn("agent: mirror: preparing a batch failed", "error", err)
			return true
		}
		if !ok {
			owes, saved := mr.writeRecords(ctx, m, ms)
			if saved {
				dirty = false
			}
			return owes
		}
		dirty = false // nextCommit saved ms with the new pending batch
		if fresh != "" && req.BatchID == fresh {
			req.Retry = false
		}
		req.Known = st.known
		res, err := mr.sessions.Commit(ctx, req)
		st.known = nil
		if err != nil {
			mr.writeFailed(ctx, id, err)
			return true
		}
		switch res.Outcome {
		case storage.Committed:
			ms.MirroredSeq, ms.Batch, ms.BatchID = ms.PendingSeq, res.Batch.Number, res.Batch.ID
			ms.PendingID, ms.PendingSeq, ms.PendingMeta = "", 0, nil
			if res.Copied {
				ms.IndexKey, ms.MetaSeq, ms.TokenMirrored = res.IndexKey, ms.MirroredSeq, true
			}
			dirty = true
			if res.Version != "" {
				st.known = &storage.KnownHead{Head: res.Head, Version: res.Version}
			}
			if m, err = r.db.Get(ctx, id); err != nil {
				dirty = false
				return !errors.Is(err, sessiondb.ErrNotFound)
			}
		case storage.Behind:
			if !locked {
				return true
			}
			l, err := mr.sessions.Load(ctx, id, storage.BatchRef{Number: ms.Batch, ID: ms.BatchID})
			switch {
			case errors.Is(err, storage.ErrSessionDeleted):
				r.removeDeleted(ctx, id)
				return false
			case err != nil:
				mr.writeFailed(ctx, id, err)
				return true
			}
			if err := mr.adopt(ctx, id, l); err != nil {
				log.Warn("agent: mirror: taking the store's history failed", "error", err)
				return true
			}
			st.known = known(l)
			return false
		case storage.Deleted:
			if !locked {
				return true
			}
			r.removeDeleted(ctx, id)
			return false
		}
	}
}

// known is the head a Load read, for the next commit (nil without a
// version: a store without the CAS group, or a session with no head).
func known(l storage.Loaded) *storage.KnownHead {
	if l.Version == "" {
		return nil
	}
	return &storage.KnownHead{Head: l.Head, Version: l.Version}
}

// nextCommit builds the next commit of a session: the pending one, retried
// exactly as it was, or a new batch of the events after the last
// committed one, recorded as pending before it can reach the store. ok is
// false when there is nothing to commit. On a store with the batch
// capability the commit carries the session's copies (metadata, index
// entry, token) when every earlier one is in the store.
func (mr *storeMirror) nextCommit(ctx context.Context, m sessiondb.Meta, ms *sessiondb.MirrorState) (storage.CommitRequest, bool, error) {
	r := mr.r
	var req storage.CommitRequest
	switch {
	case ms.PendingID != "":
		req = storage.CommitRequest{Writer: r.hostID, Base: storage.BatchRef{Number: ms.Batch, ID: ms.BatchID}}
		if err := json.Unmarshal(ms.PendingMeta, &req.Meta); err != nil {
			return req, false, fmt.Errorf("the pending commit's metadata is damaged: %w", err)
		}
		req.BatchID, req.Retry = ms.PendingID, true
	case m.LastSeq > ms.MirroredSeq:
		var err error
		if req, err = mr.newCommit(m, ms); err != nil {
			return req, false, err
		}
		if err := r.db.SetMirror(ctx, m.ID, *ms); err != nil {
			return req, false, err
		}
		mr.saved(m.ID)
	default:
		return req, false, nil
	}
	if r.caps.Batch && ms.Settled() {
		req.Copies = &storage.Copies{PrevIndexKey: ms.IndexKey}
		if !ms.TokenMirrored {
			req.Copies.Token = m.Token
		}
	}
	recs, err := r.db.Range(ctx, m.ID, ms.MirroredSeq+1, ms.PendingSeq)
	if err != nil {
		return req, false, err
	}
	for _, rec := range recs {
		req.Events = append(req.Events, rec.Data)
	}
	if len(req.Events) == 0 {
		return req, false, fmt.Errorf("events %d to %d of the pending commit are not on local disk", ms.MirroredSeq+1, ms.PendingSeq)
	}
	return req, true, nil
}

// newCommit starts a new commit of the session's events after the last
// committed one: it sets ms's pending commit (a new batch id, the last
// event, the metadata), for the caller to save before the commit can reach
// the store.
func (mr *storeMirror) newCommit(m sessiondb.Meta, ms *sessiondb.MirrorState) (storage.CommitRequest, error) {
	req := storage.CommitRequest{Writer: mr.r.hostID, Base: storage.BatchRef{Number: ms.Batch, ID: ms.BatchID}}
	req.Meta = storeMeta(m, 0)
	req.BatchID = storage.NewBatchID()
	meta, err := json.Marshal(req.Meta)
	if err != nil {
		return req, err
	}
	ms.PendingID, ms.PendingSeq, ms.PendingMeta = req.BatchID, m.LastSeq, meta
	return req, nil
}

// writeRecords writes the session's metadata, index entry and token when
// the store lacks them, once its events are committed, and saves the
// mirror state. It reports whether the store still lacks something and
// whether it saved the state.
func (mr *storeMirror) writeRecords(ctx context.Context, m sessiondb.Meta, ms sessiondb.MirrorState) (owes, saved bool) {
	r := mr.r
	if !ms.Owes(m.LastSeq) {
		return false, false
	}
	if ms.MirroredSeq == 0 || m.LastSeq > ms.MirroredSeq || ms.PendingID != "" {
		return ms.Owes(m.LastSeq), false
	}
	meta := storeMeta(m, ms.Batch)
	if ms.MetaSeq < ms.MirroredSeq {
		if err := mr.sessions.PutMeta(ctx, meta); err != nil {
			mr.writeFailed(ctx, m.ID, err)
		} else if key, err := mr.sessions.PutIndex(ctx, meta); err != nil {
			mr.writeFailed(ctx, m.ID, err)
		} else {
			if ms.IndexKey != "" && ms.IndexKey != key {
				// A stale entry left behind is harmless: readers check the
				// session itself.
				if err := mr.sessions.DeleteIndex(ctx, ms.IndexKey); err != nil {
					r.logger(m.ID).Warn("agent: mirror: removing the previous session-index entry failed; it stays as a harmless stale entry", "error", err)
				}
			}
			ms.IndexKey, ms.MetaSeq = key, ms.MirroredSeq
		}
	}
	if !ms.TokenMirrored {
		// Without it, other hosts cannot resolve the token.
		if err := mr.sessions.PutToken(ctx, m.Token, m.ID); err != nil {
			mr.writeFailed(ctx, m.ID, err)
		} else {
			ms.TokenMirrored = true
		}
	}
	if err := r.db.SetMirror(ctx, m.ID, ms); err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
		r.logger(m.ID).Warn("agent: mirror: saving the mirror state failed", "error", err)
		return true, true
	}
	mr.saved(m.ID)
	return ms.Owes(m.LastSeq), true
}

// writeFailed logs and counts a mirror write the store refused. The write
// is not dropped: the session stays in the backlog.
func (mr *storeMirror) writeFailed(ctx context.Context, id string, err error) {
	r := mr.r
	n := mr.failed.Add(1)
	key := ""
	var ke *kv.Error
	if errors.As(err, &ke) {
		key = keys.Redact(ke.Key)
	}
	r.logger(id).LogAttrs(ctx, slog.LevelWarn, "agent: mirror write failed; kept and retried",
		r.logStoreName(), slog.String("key", key),
		slog.String("error", err.Error()), slog.Int64("failed_total", n))
	r.obs.MirrorDropped(key, err)
}

// setBacklog records whether the store lacks something of a session, tells
// the Observer when the count changes, and wakes the background retry.
func (mr *storeMirror) setBacklog(id string, owes bool) {
	mr.mu.Lock()
	changed := mr.backlog[id] != owes
	if owes {
		mr.backlog[id] = true
	} else {
		delete(mr.backlog, id)
	}
	n := len(mr.backlog)
	mr.mu.Unlock()
	if changed {
		mr.r.obs.MirrorBacklog(n)
	}
	if owes {
		select {
		case mr.wake <- struct{}{}:
		default:
		}
	}
}

// pending returns the sessions in the backlog, in id order.
func (mr *storeMirror) pending() []string {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	ids := make([]string, 0, len(mr.backlog))
	for id := range mr.backlog {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (mr *storeMirror) owes(id string) bool {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	return mr.backlog[id]
}

// stats implements sessionMirror.
func (mr *storeMirror) stats() (int64, int, int64) {
	mr.mu.Lock()
	n := len(mr.backlog)
	mr.mu.Unlock()
	return mr.failed.Load(), n, mr.forks.Load()
}

// flushBacklog flushes every session the store lacks something of, at
// start-up: events recorded before the process stopped (a SIGKILL mid-turn)
// or refused by the store. No turn runs yet. After the first session the
// store still refuses, the others are only put in the backlog, for the
// background retry: a store that is down delays the start by one
// mirrorTimeout at most.
func (mr *storeMirror) flushBacklog(ctx context.Context) error {
	ids, err := mr.r.db.Backlog(ctx)
	if err != nil {
		return err
	}
	for i, id := range ids {
		st, release, err := mr.r.lockSession(ctx, id)
		if err != nil {
			return err
		}
		mr.flush(ctx, st, id, true)
		release()
		if mr.owes(id) {
			for _, rest := range ids[i+1:] {
				mr.setBacklog(rest, true)
			}
			break
		}
	}
	return nil
}

// start implements sessionMirror: the background retry. While sessions are
// in the backlog it flushes them, first retryMin after a failure, doubling
// the wait after each round that leaves writes owed, up to retryMax. A
// session whose turn is running is skipped: the turn's end flushes it.
func (mr *storeMirror) start(ctx context.Context) {
	r := mr.r
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		tick := time.NewTicker(saveInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				mr.save(ctx, false)
			}
		}
	}()
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		backoff := retryMin
		for {
			if len(mr.pending()) == 0 {
				backoff = retryMin
				select {
				case <-ctx.Done():
					return
				case <-mr.wake:
					continue
				}
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			clean := true
			for _, id := range mr.pending() {
				st, release, ok := r.tryLockSession(id)
				if !ok {
					continue
				}
				mr.flush(ctx, st, id, true)
				release()
				if mr.owes(id) {
					clean = false
				}
			}
			if ctx.Err() != nil {
				return
			}
			if clean {
				backoff = retryMin
			} else {
				backoff = min(2*backoff, retryMax)
			}
		}
	}()
}

// deleteSession implements sessionMirror: the head becomes a tombstone and
// the session's other keys are removed (storage.Sessions.Delete).
func (mr *storeMirror) deleteSession(ctx context.Context, m sessiondb.Meta) error {
	tomb := storage.Head{SessionMeta: storage.SessionMeta{ID: m.ID, UpdatedAt: mr.r.now().UTC()}, Writer: mr.r.hostID}
	if err := mr.sessions.Delete(ctx, tomb, m.Token, m.IndexKey); err != nil {
		return storeErr("deleting session "+m.ID, err)
	}
	mr.setBacklog(m.ID, false)
	return nil
}

// memoryTurn converts a finished turn for the memory journal.
func memoryTurn(t TurnInfo) memory.TurnInfo {
	mt := memory.TurnInfo{
		SessionID: t.SessionID, ChannelID: t.ChannelID, Title: t.Title,
		UserMessage: t.UserMessage, Result: t.Result, Usage: t.Usage,
		FinishedAt: t.FinishedAt,
	}
	if t.Status == StatusFailed {
		mt.Err = failure(t.Result)
	}
	return mt
}

// failure is a turn's failure message as an error.
type failure string

func (f failure) Error() string { return string(f) }
