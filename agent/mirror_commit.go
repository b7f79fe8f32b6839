package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/storage"
)

// The store mirror's commit: before a turn the local copy takes what
// other hosts committed (syncHead, adopt); after it the turn's events
// go to the store with the session head's compare-and-set (endTurn,
// commit), with its copies (metadata, index entry, token).

// syncHead brings the local copy up to the store's and returns the
// session's row as it then is (sessiondb.ErrNotFound when the session is
// not here): what other hosts committed is imported, and this host's
// events that lost the session head to them are recorded as a fork. A
// deleted session is ErrSessionNotFound (and is removed here), a moved
// one ErrSessionMoved. A store that does not answer within timeout leaves
// the local copy as it is: answered is then false (as for a store that
// cannot be read). The caller holds the session's turn lock; a turn's
// begin calls it with headTimeout, a read with readHeadTimeout.
func (mr *storeMirror) syncHead(ctx context.Context, st *sessionState, id string, timeout time.Duration) (m sessiondb.Meta, answered bool, err error) {
	r := mr.r
	if !r.caps.Get {
		// A store that cannot be read: nothing to catch up with.
		m, err := r.db.Get(ctx, id)
		return m, false, err
	}
	st.mirror.Lock()
	m, ms, err := mr.state(ctx, id)
	st.mirror.Unlock()
	if err != nil {
		return m, false, err
	}
	if ms.Batch == 0 && ms.PendingID == "" {
		// Never committed: no other host can know the session, and it has
		// no head.
		st.mirror.Lock()
		st.known, st.state = &storage.KnownHead{}, &ms
		st.mirror.Unlock()
		return m, true, nil
	}
	if ms.PendingID != "" {
		// A commit whose outcome is unknown: settle it first, so that the
		// store's copy of it is not taken for another host's.
		mr.flush(ctx, st, id, true)
		st.mirror.Lock()
		m, ms, err = mr.state(ctx, id)
		st.mirror.Unlock()
		if errors.Is(err, sessiondb.ErrNotFound) {
			return m, true, fmt.Errorf("%w: %s (deleted)", ErrSessionNotFound, id)
		} else if err != nil {
			return m, false, err
		}
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l, err := mr.sessions.Load(hctx, id, storage.BatchRef{Number: ms.Batch, ID: ms.BatchID})
	switch {
	case errors.Is(err, storage.ErrSessionDeleted):
		mr.removeDeleted(ctx, id)
		return m, true, fmt.Errorf("%w: %s (deleted on another host)", ErrSessionNotFound, id)
	case errors.Is(err, storage.ErrSessionMoved):
		return m, true, fmt.Errorf("%w: %w", ErrSessionMoved, err)
	case errors.Is(err, kv.ErrNotFound):
		return m, true, nil // not in the store yet
	case err != nil:
		r.logger(id).Warn("agent: the store did not answer; this host's copy of the session is used, and what it lacks is committed when the store answers",
			r.logStoreName(), slog.String("error", err.Error()))
		return m, false, nil
	}
	st.mirror.Lock()
	defer st.mirror.Unlock()
	st.known = known(l)
	if len(l.Batches) == 0 && !l.Diverged {
		st.state = &ms
		return m, true, nil
	}
	if _, err := mr.adopt(ctx, st, id, l); err != nil {
		return m, true, err
	}
	m, err = r.db.Get(ctx, id)
	return m, true, err
}

// adopt makes the store's history the local copy's: the loaded batches
// are appended, and local events that differ from them are moved aside as
// a fork (sessiondb.AdoptFork) and recorded, after the store's, in a
// turn.forked event, which the mirror then commits like any event: a
// forked turn stays in the session's history, on every host. The caller
// holds the session's turn lock and its mirror lock.
func (mr *storeMirror) adopt(ctx context.Context, st *sessionState, id string, l storage.Loaded) (forked int, err error) {
	r := mr.r
	recs, last, err := records(id, l.Batches)
	if err != nil {
		return 0, err
	}
	ms := mr.loadedState(l.Head, last)
	m := localMeta(l.Head.SessionMeta)
	m.LastSeq = ms.MirroredSeq
	n, appended, err := r.db.AdoptFork(ctx, m, recs, ms, l.Head.Writer, r.now(), mr.forkEvent(id, l.Head.Writer))
	mr.saved(id)
	// The session's events changed under its cached conversation (events
	// added, or replaced by others with the same numbers: a fork).
	r.convs.drop(id)
	if err != nil {
		return 0, fmt.Errorf("agent: taking session %s from the store: %w", id, err)
	}
	// A fork is an event of the session's now, which the store lacks.
	mr.setBacklog(id, n > 0)
	// This host's subscribers see what other hosts committed, and the
	// fork, as the local copy takes them.
	for _, rec := range appended {
		if ev, err := decodeEvent(rec); err == nil {
			r.publish(ev)
		}
	}
	if n > 0 {
		st.forks++
		mr.forks.Add(1)
		r.logger(id).Warn("agent: another host committed this session's turns first; this host's events that lost are recorded in a turn.forked event after the store's, and committed like any event",
			slog.Int("forkedEvents", n), slog.String("winner", l.Head.Writer), slog.Int64("storeLastSeq", ms.MirroredSeq))
		r.obs.MirrorForked(id, n)
	} else if len(recs) > 0 {
		r.logger(id).Info("agent: took the turns other hosts committed from the store", slog.Int("events", len(recs)), slog.String("writer", l.Head.Writer))
	}
	return n, nil
}

// forkEvent returns the maker of a session's turn.forked event for events
// of session id that lost the head to host winner (sessiondb.ForkRecord).
func (mr *storeMirror) forkEvent(id, winner string) sessiondb.ForkRecord {
	return func(forked []sessiondb.Record, after, seq, turn int64) (sessiondb.Record, error) {
		ev := Event{SessionID: id, Type: EventTurnForked, Seq: seq, Turn: turn, At: mr.r.now().UTC(), ForkedAfter: after, LostTo: winner}
		for _, rec := range forked {
			ev.Forked = append(ev.Forked, rec.Data)
			var f Event
			if json.Unmarshal(rec.Data, &f) != nil {
				continue
			}
			switch f.Type {
			case EventTurnStarted:
				ev.Message, ev.Status, ev.Result = f.Message, "", ""
			case EventTurnFinished:
				ev.Status, ev.Result = f.Status, f.Result
			}
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return sessiondb.Record{}, err
		}
		return sessiondb.Record{Seq: seq, At: ev.At, Type: ev.Type, Data: data}, nil
	}
}

// created is called, under the turn lock, before the first turn of a
// session this host creates: it has no head, and no store knows it yet.
func (mr *storeMirror) created(st *sessionState, _ string) {
	st.mirror.Lock()
	st.known, st.state = &storage.KnownHead{}, &sessiondb.MirrorState{}
	st.mirror.Unlock()
}

// recorded is called after events are recorded on local disk: it
// (re)starts the debounce timer of
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

// endTurn is the mirror's commit of a turn: it stops the debounce timer and,
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
	r.stopDebounce(st)
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
			// The row this write just stored, and the state syncHead
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
		// The state syncHead read, which nothing changed since; the
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
		req.Copies.TokenDigest = end.meta.TokenDigest
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
		r.logger(m.ID).Error("agent: mirror: the embedded store does not run inside the session database's write; the turn is committed after it", "error", err)
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
		req.Copies.TokenDigest = m.TokenDigest
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
	forkRounds := 0
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
				mr.removeDeleted(ctx, id)
				return false
			case errors.Is(err, storage.ErrSessionMoved):
				mr.moved(id, m)
				return false
			case err != nil:
				mr.writeFailed(ctx, id, err)
				return true
			}
			n, err := mr.adopt(ctx, st, id, l)
			if err != nil {
				log.Warn("agent: mirror: taking the store's history failed", "error", err)
				return true
			}
			st.known = known(l)
			if n == 0 {
				return false
			}
			// This host's turn is a fork now, recorded in an event of its
			// own after the store's: commit it (a few rounds at most; what
			// is left goes to the backlog).
			if forkRounds++; forkRounds > 3 {
				return true
			}
			if m, ms, err = mr.state(ctx, id); err != nil {
				return true
			}
			continue
		case storage.Deleted:
			if !locked {
				return true
			}
			mr.removeDeleted(ctx, id)
			return false
		case storage.Moved:
			mr.moved(id, m)
			return false
		}
	}
}

// moved gives up committing a session that moved to the session ledger:
// what this host has beyond the store's copy cannot go there any more.
// The mark is placed only once every host of serving mode local has
// written what it owed (agentkit flush), so this happens only to a host
// that kept serving the session after the move.
func (mr *storeMirror) moved(id string, m sessiondb.Meta) {
	mr.r.logger(id).Error("agent: mirror: the session moved to serving mode ledger while this host of serving mode local still had events of it to commit; they stay on this host only",
		slog.Int64("lastSeq", m.LastSeq))
}

// stopDebounce stops the session's debounce flush, if one is set.
func (r *Runtime) stopDebounce(st *sessionState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
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
			req.Copies.TokenDigest = m.TokenDigest
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
		if err := mr.sessions.PutToken(ctx, m.TokenDigest, m.ID); err != nil {
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

// deleteSession deletes the session from the store for every host: the head becomes a tombstone and
// the session's other keys are removed (storage.Sessions.Delete).
func (mr *storeMirror) deleteSession(ctx context.Context, m sessiondb.Meta) error {
	tomb := storage.Head{SessionMeta: storage.SessionMeta{ID: m.ID, UpdatedAt: mr.r.now().UTC()}, Writer: mr.r.hostID}
	if err := mr.sessions.Delete(ctx, tomb, m.TokenDigest, m.IndexKey); err != nil {
		return storeErr("deleting session "+m.ID, err)
	}
	mr.setBacklog(m.ID, false)
	return nil
}
