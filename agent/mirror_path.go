package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
)

// The store mirror as a commit path (serving mode local): a turn runs on
// the host that gets the request, from the local copy brought up to the
// store's (syncHead), and commits with the session head's
// compare-and-set (endTurn); what the store refuses is kept and retried
// (mirror_commit.go, mirror_retry.go).

var _ commitPath = (*storeMirror)(nil)

// submit implements commitPath: it runs the turn now, on this host,
// under the session's turn lock. A keyed request seen before answers
// with its first turn's result (idempotency.go).
func (mr *storeMirror) submit(ctx context.Context, req turnRequest) (TurnResult, error) {
	r := mr.r
	if req.start == nil {
		// The session on local disk (loaded from the store if need be);
		// the turn's begin brings it up to the store's head.
		if _, err := mr.localOrLoad(ctx, req.sessionID); err != nil {
			return TurnResult{}, err
		}
	}
	idem, res, replayed, release, err := r.keyed(ctx, req.route(), req.key, req.hash, req.sessionID, req.token, req.onEvent)
	if err != nil || replayed {
		return res, err
	}
	defer release()
	mc := &mirrorCommit{mr: mr, id: req.sessionID, ifLastSeq: req.ifLastSeq}
	token := req.token
	if req.start != nil {
		now := r.now().UTC()
		token = newToken()
		mc.created = &sessiondb.Meta{
			ID:          newID(),
			ChannelID:   req.start.ChannelID,
			Title:       req.start.Title,
			CreatedAt:   now,
			UpdatedAt:   now,
			TokenDigest: keys.TokenDigest(token),
		}
		mc.id = mc.created.ID
	}
	lockCtx := ctx
	if req.noWait {
		lockCtx = noWaitContext(ctx)
	}
	st, unlock, err := r.lockSession(lockCtx, mc.id)
	if err != nil {
		return TurnResult{}, err
	}
	defer unlock()
	mc.st = st
	res, err = r.runTurn(ctx, mc, turnInput{message: req.message, files: req.files, source: req.source, onEvent: req.onEvent, idem: idem})
	res.ContinuationToken = token
	if err == nil && mc.forked && req.ifLastSeq != 0 {
		// The turn ran and is in the session's history, as a fork: a
		// client that asked to run only after what it saw is told so.
		m, gerr := r.db.Get(context.WithoutCancel(ctx), mc.id)
		if gerr != nil {
			return TurnResult{}, gerr
		}
		return TurnResult{}, &PositionError{SessionID: mc.id, LastSeq: m.LastSeq, IfLastSeq: req.ifLastSeq, Err: ErrTurnForked}
	}
	return res, err
}

// mirrorCommit is a turn's hold on the store mirror.
type mirrorCommit struct {
	mr      *storeMirror
	st      *sessionState
	id      string
	created *sessiondb.Meta // a new session's row, until its first write
	// ifLastSeq is the follow-up's precondition; forked says the turn's
	// commit found another host's turn first and recorded it as a fork.
	ifLastSeq int64
	forked    bool
}

// begin implements turnCommit: the local copy takes the turns other
// hosts committed (syncHead); a new session has no head to read.
func (mc *mirrorCommit) begin(ctx context.Context) (sessiondb.Meta, error) {
	if mc.created != nil {
		mc.mr.created(mc.st, mc.id)
		return *mc.created, nil
	}
	m, answered, err := mc.mr.syncHead(ctx, mc.st, mc.id, headTimeout)
	if errors.Is(err, sessiondb.ErrNotFound) {
		return m, fmt.Errorf("%w: %s (deleted while the turn waited)", ErrSessionNotFound, mc.id)
	}
	if err != nil || mc.ifLastSeq == 0 {
		return m, err
	}
	switch {
	case !answered && mc.mr.r.embedded == nil:
		return m, fmt.Errorf("%w: the store did not answer, so the session's position (ifLastSeq) cannot be checked; retry later", ErrStoreUnavailable)
	case m.LastSeq != mc.ifLastSeq:
		return m, &PositionError{SessionID: mc.id, LastSeq: m.LastSeq, IfLastSeq: mc.ifLastSeq, Err: ErrPreconditionFailed}
	}
	return m, nil
}

// check implements turnCommit: a turn of this host is never fenced.
func (mc *mirrorCommit) check() error { return nil }

// flush implements turnCommit: events are written to the local database
// and published, and the debounce timer (re)started.
func (mc *mirrorCommit) flush(t *turn) error { return mc.write(t, nil) }

// write is writeLocal with the session's new row the first time, and the
// mirror told.
func (mc *mirrorCommit) write(t *turn, extra func(*sessiondb.Tx) error) error {
	if len(t.pending) == 0 && extra == nil {
		return nil
	}
	if err := t.writeLocal(mc.created, extra); err != nil {
		return err
	}
	mc.created = nil
	mc.mr.recorded(mc.st, mc.id)
	return nil
}

// commit implements turnCommit: the turn's last events are written with
// the mirror's part of them, and the store gets what it lacks (endTurn).
// Only a failed local write fails the turn.
func (mc *mirrorCommit) commit(ctx context.Context, t *turn) error {
	mc.st.mirror.Lock()
	forks := mc.st.forks
	mc.st.mirror.Unlock()
	err := mc.mr.endTurn(context.WithoutCancel(ctx), mc.st, mc.id, turnEnd{
		meta: t.meta, recs: t.recs,
		write: func(extra func(*sessiondb.Tx) error) error { return mc.write(t, extra) },
	})
	mc.st.mirror.Lock()
	mc.forked = mc.st.forks != forks
	mc.st.mirror.Unlock()
	return err
}

// session implements commitPath: the local row, brought up to the
// store's head (turns other hosts committed, forks among them), else the
// session loaded from the store (when the store can Get). With the
// embedded default store no other host writes, and while a turn of the
// session runs here its end brings the copy up to date: the local row is
// read as it is. A store that does not answer within readHeadTimeout
// leaves the local copy as it is.
func (mr *storeMirror) session(ctx context.Context, id string) (sessiondb.Meta, error) {
	r := mr.r
	m, err := r.db.Get(ctx, id)
	if err == nil {
		if r.embedded != nil || !r.caps.Get {
			return m, nil
		}
		st, release, ok := r.tryLockSession(id)
		if !ok {
			return m, nil
		}
		defer release()
		m, _, err := mr.syncHead(ctx, st, id, readHeadTimeout)
		if errors.Is(err, sessiondb.ErrNotFound) {
			err = fmt.Errorf("%w: %s", ErrSessionNotFound, id)
		}
		return m, err
	}
	if !errors.Is(err, sessiondb.ErrNotFound) {
		return m, err
	}
	if err := mr.load(ctx, id); err != nil {
		return m, err
	}
	return r.db.Get(ctx, id)
}

// localOrLoad returns a session's local row, loading the session from the
// store when it is not here (no head read when it is).
func (mr *storeMirror) localOrLoad(ctx context.Context, id string) (sessiondb.Meta, error) {
	r := mr.r
	m, err := r.db.Get(ctx, id)
	if err == nil || !errors.Is(err, sessiondb.ErrNotFound) {
		return m, err
	}
	if err := mr.load(ctx, id); err != nil {
		return m, err
	}
	return r.db.Get(ctx, id)
}

// list implements commitPath: the sessions on this host's disk.
func (mr *storeMirror) list(ctx context.Context, limit int, c *cursor) (SessionPage, error) {
	return mr.r.listLocal(ctx, limit, c)
}

// listLocal lists the sessions on this host's disk, newest first by
// update time.
func (r *Runtime) listLocal(ctx context.Context, limit int, c *cursor) (SessionPage, error) {
	var after *sessiondb.Cursor
	if c != nil {
		after = &sessiondb.Cursor{UpdatedAt: time.Unix(0, c.U), ID: c.I}
	}
	rows, err := r.db.List(ctx, limit+1, after)
	if err != nil {
		return SessionPage{}, err
	}
	page := SessionPage{Sessions: []Session{}}
	for i, m := range rows {
		if i == limit {
			last := rows[limit-1]
			b, _ := json.Marshal(cursor{U: last.UpdatedAt.UnixNano(), I: last.ID})
			page.NextCursor = base64.RawURLEncoding.EncodeToString(b)
			break
		}
		page.Sessions = append(page.Sessions, sessionOf(m))
	}
	return page, nil
}

// remove implements commitPath: under the session's turn and mirror
// locks, the head becomes a tombstone (deleteSession), then the local
// copy goes.
func (mr *storeMirror) remove(ctx context.Context, id string) error {
	r := mr.r
	st, release, err := r.lockSession(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	r.stopDebounce(st)
	st.mirror.Lock()
	defer st.mirror.Unlock()
	m, err := r.db.Get(ctx, id)
	if err != nil {
		if errors.Is(err, sessiondb.ErrNotFound) {
			return ErrSessionNotFound
		}
		return err
	}
	if err := mr.deleteSession(ctx, m); err != nil {
		return err
	}
	err = r.removeLocal(ctx, id)
	mr.forget(id)
	return err
}

// follow implements commitPath: a session's events reach subscribers as
// this host records them, and, on a store other hosts share, what they
// commit (forks among it) as this host takes it: a follower reads the
// session's head every followInterval while it has subscribers, and takes
// the turns it lacks. The returned function starts it; the caller holds
// r.mu.
func (mr *storeMirror) follow(id string) func() {
	r := mr.r
	if r.embedded != nil || !r.caps.Get {
		return func() {}
	}
	return func() {
		if r.closed.Load() || mr.follows[id] != nil {
			return
		}
		ctx, cancel := context.WithCancel(r.bg)
		mr.follows[id] = cancel
		tickUntil(ctx, &mr.followWG, followInterval, func() bool {
			if st, release, ok := r.tryLockSession(id); ok {
				_, _, err := mr.syncHead(ctx, st, id, readHeadTimeout)
				release()
				if errors.Is(err, ErrSessionNotFound) {
					r.closeSubscribers(id)
					return false
				}
			}
			return true
		})
	}
}

// followInterval is how often a local-mode follower reads the head of a
// session with subscribers.
const followInterval = time.Second

// unfollow implements commitPath: the follower stops. The caller holds
// r.mu.
func (mr *storeMirror) unfollow(id string) {
	if cancel := mr.follows[id]; cancel != nil {
		cancel()
		delete(mr.follows, id)
	}
}

// drain implements commitPath: a turn runs on the request that started
// it, and nothing is queued here.
func (mr *storeMirror) drain() {}

// stop implements commitPath: nothing runs that must hand over.
func (mr *storeMirror) stop() {}

// close implements commitPath: the followers have stopped, and the
// mirror states kept in memory are saved, once no turn runs.
func (mr *storeMirror) close() {
	mr.followWG.Wait()
	mr.save(context.Background(), true)
}

// openMirror prepares serving mode local at Open: what the store lacks of
// every session is written, then recent sessions are restored.
func (mr *storeMirror) open(ctx context.Context) error {
	if err := mr.flushBacklog(ctx); err != nil {
		return err
	}
	return mr.restore(ctx)
}
