package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/ledger"
	"agentkit/storage"
)

// The ledger as a commit path (serving mode ledger): a request is a
// message delivered to the session's inbox; the host holding the
// session's lease runs its turn (ledger_turn.go) from the committed
// transcript and commits it with the ledger's fenced commit. Reads,
// listings and streams come from the committed transcripts, on every
// host.

// ledgerPath is the ledger's commit path.
type ledgerPath struct {
	r   *Runtime
	led *ledger.Ledger
	// follows holds, per session with subscribers, the follower streaming
	// its commits (guarded by r.mu); followWG counts followers.
	follows  map[string]*follower
	followWG sync.WaitGroup
	// ix is the session index the listing reads (ledger_index.go), nil
	// when the agent's store cannot list.
	ix *ledgerIndex
}

var _ commitPath = (*ledgerPath)(nil)

// Ledger returns the session ledger in serving mode ledger, nil in serving
// mode local. Tools that do not serve turns (dead letters, metrics) use it.
func (r *Runtime) Ledger() *ledger.Ledger { return r.led }

// openLedger opens the session ledger over the coordination store (the
// agent's, or Config.Ledger.Store). ledger.Open runs the start-up check:
// a store without the whole CAS group, with a process-local CAS table, or
// the memory driver outside tests is refused, naming the CAS group.
func (r *Runtime) openLedger() (*ledgerPath, error) {
	o := r.cfg.Ledger
	store := o.Store
	if store == nil && r.embedded != nil {
		return nil, errors.New("agent: serving mode ledger coordinates several hosts through one shared store, and the embedded default store lives in this host's state root; " +
			"set Config.Store (storage: in agentkit.yaml) to a shared store such as postgres://, redis:// or nats://, or Config.Ledger.Store (ledger.store:)")
	}
	if store == nil {
		if err := r.binding.RequireCoordination(); err != nil {
			return nil, fmt.Errorf("agent: serving mode ledger: %w", err)
		}
		store = r.binding.DB()
	}
	lp := &ledgerPath{r: r, follows: map[string]*follower{}}
	lp.ix = newLedgerIndex(lp, r.agentStore)
	var swept func(context.Context, ledger.SessionInfo)
	if lp.ix != nil {
		swept = lp.ix.swept
	}
	host := o.HostID
	if host == "" {
		// A new id for every Open: a restarted host must not take the
		// leases its previous process held for its own.
		host = r.hostID + "-" + newToken()[:8]
	}
	led, err := ledger.Open(ledger.Options{
		Store: store, Agent: r.agent.Name, Handler: lp.handle, HostID: host, Tuning: o.Tuning,
		AllowProcessLocal: o.AllowProcessLocal, Logger: r.log,
		OnDeliver: o.OnDeliver, Swept: swept,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: serving mode ledger: %w", err)
	}
	r.led = led
	lp.led = led
	return lp, nil
}

// start implements commitPath: the ledger's janitor runs until ctx ends.
func (lp *ledgerPath) start(ctx context.Context) {
	r := lp.r
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		if err := lp.led.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("agent: the ledger's janitor stopped", "error", err)
		}
	}()
	if lp.ix != nil {
		r.bgWG.Add(1)
		go func() {
			defer r.bgWG.Done()
			lp.ix.run(ctx)
		}()
	}
}

// drain implements commitPath: the ledger takes no new turn (each runner
// hands its session over with its queued messages once its running turn
// ends) and refuses new deliveries (ledger.Ledger.Drain).
func (lp *ledgerPath) drain() { lp.led.Drain() }

// stop implements commitPath: the sessions this host holds are handed
// over to the other hosts; running turns finish (and commit) first, for
// at most the lease.
func (lp *ledgerPath) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), lp.led.Lease())
	defer cancel()
	if err := lp.led.Close(ctx); err != nil {
		lp.r.log.Warn("agent: closing the ledger", "error", err)
	}
	if lp.ix != nil {
		// The entries of the turns that committed while closing, and the
		// writes still queued; what fails is repaired by later listings.
		fctx, fcancel := context.WithTimeout(context.Background(), indexWriteTimeout)
		defer fcancel()
		lp.ix.flush(fctx)
	}
}

// close implements commitPath: the followers have stopped.
func (lp *ledgerPath) close() { lp.followWG.Wait() }

// stats implements commitPath: the ledger owes the store nothing, and
// never forks.
func (lp *ledgerPath) stats() (int64, int, int64) { return 0, 0, 0 }

// flushOwed implements commitPath: a turn counts only once committed, so
// nothing is ever owed.
func (lp *ledgerPath) flushOwed(context.Context) (int, error) { return 0, nil }

// ledgerErr maps a ledger error to the runtime's errors.
func ledgerErr(id string, err error) error {
	var be *ledger.BusyError
	switch {
	case errors.As(err, &be):
		return &InboxFullError{SessionID: id, Pending: be.Pending, RetryAfter: be.RetryAfter, Keys: be.Keys}
	case errors.Is(err, ledger.ErrDeleted), errors.Is(err, ledger.ErrUnknownSession):
		return fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	case errors.Is(err, ledger.ErrTooLarge):
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	case errors.Is(err, ledger.ErrDeadLettered):
		return fmt.Errorf("%w: %w", ErrDeadLettered, err)
	case errors.Is(err, ledger.ErrClosed):
		return ErrClosed
	}
	return storeErr("the session ledger", err)
}

// submit implements commitPath: a new session's continuation token is
// written to the store (and awaited) before its first message is
// delivered, so every host resolves the token once any host answers; a
// follow-up is delivered only to a session the ledger has (a token of a
// session served in serving mode local names none, and a delivery would
// create an empty one); a reminder's firing is delivered with the
// reminder's id as the event id (a reminder claimed twice is one event)
// and not waited for.
func (lp *ledgerPath) submit(ctx context.Context, req turnRequest) (TurnResult, error) {
	r := lp.r
	msg := ledgerMessage{V: ledgerFormat, Source: req.source, Message: req.message, Files: req.files, Hash: req.hash}
	if req.source == SourceReminder {
		payload, _ := json.Marshal(msg)
		if _, err := lp.led.Deliver(ctx, req.sessionID, ledger.Event{ID: "reminder/" + req.reminder, Payload: payload, Keyed: true}); err != nil {
			return TurnResult{}, ledgerErr(req.sessionID, err)
		}
		return TurnResult{SessionID: req.sessionID, Queued: true, EventID: "reminder/" + req.reminder}, nil
	}
	id, eventID, token := req.sessionID, req.key, req.token
	if req.start != nil {
		id, eventID = newID(), newID()
		if req.key != "" {
			id, eventID = keyedSessionID(r.agent.Name, req.key), req.key
		}
		token = newToken()
		if err := r.agentStore.Sessions().PutToken(ctx, keys.TokenDigest(token), id); err != nil {
			return TurnResult{}, storeErr("writing the continuation token", err)
		}
		msg.Start = &ledgerSession{ChannelID: req.start.ChannelID, Title: req.start.Title, CreatedAt: r.now().UTC(), TokenDigest: keys.TokenDigest(token)}
	} else {
		if _, err := lp.led.Transcript(ctx, id, math.MaxUint64, 1); err != nil {
			adopted := false
			if errors.Is(err, ledger.ErrUnknownSession) {
				// A session of serving mode local is adopted at its first
				// follow-up here.
				var aerr error
				if adopted, aerr = lp.adopt(ctx, id); aerr != nil {
					return TurnResult{}, aerr
				}
			}
			if !adopted {
				if errors.Is(err, ledger.ErrDeleted) || errors.Is(err, ledger.ErrUnknownSession) {
					return TurnResult{}, fmt.Errorf("%w: %w", ErrSessionNotFound, err)
				}
				return TurnResult{}, storeErr("reading the session", err)
			}
		}
		if req.ifLastSeq != 0 {
			// Turns never fork here: the precondition is the committed
			// transcript's end as the message is queued.
			m, err := lp.session(ctx, id)
			if err != nil {
				return TurnResult{}, err
			}
			if m.LastSeq != req.ifLastSeq {
				return TurnResult{}, &PositionError{SessionID: id, LastSeq: m.LastSeq, IfLastSeq: req.ifLastSeq, Err: ErrPreconditionFailed}
			}
		}
		if eventID == "" {
			eventID = newID()
		}
	}
	return lp.deliver(ctx, id, eventID, req.key != "", token, msg, req.onEvent)
}

// deliver delivers a message to a session's inbox (its event id is
// the client's Idempotency-Key, keyed: kept for the ledger's
// IdempotencyWindow, or a new id) and answers: the committed
// turn when this host runs it (waiting for its commit) or when the event
// was already consumed; Queued with the event id when another host holds
// the session, or when the wait ends first (the message is acknowledged
// either way).
func (lp *ledgerPath) deliver(ctx context.Context, id, eventID string, keyed bool, token string, msg ledgerMessage, onEvent func(Event)) (TurnResult, error) {
	r := lp.r
	payload, err := json.Marshal(msg)
	if err != nil {
		return TurnResult{}, fmt.Errorf("agent: encoding the message: %w", err)
	}
	d, err := lp.led.Deliver(ctx, id, ledger.Event{ID: eventID, Payload: payload, Keyed: keyed})
	if err != nil {
		return TurnResult{}, ledgerErr(id, err)
	}
	if s := msg.Start; s != nil && d.State == ledger.StatePending {
		lp.ix.created(ctx, storage.SessionMeta{ID: id, ChannelID: s.ChannelID, Title: s.Title, CreatedAt: s.CreatedAt,
			UpdatedAt: d.Created, TokenDigest: s.TokenDigest})
	}
	queued := TurnResult{SessionID: id, ContinuationToken: token, Queued: true, EventID: eventID, Replayed: d.Duplicate}
	var c ledger.Committed
	switch {
	case d.State == ledger.StateDeadLettered:
		return TurnResult{}, fmt.Errorf("%w: event %q of session %s", ErrDeadLettered, eventID, id)
	case d.State == ledger.StateCommitted:
		if c, err = lp.led.Turn(ctx, id, d.CommitSeq); err != nil {
			return TurnResult{}, ledgerErr(id, err)
		}
	case !d.Local:
		return queued, nil
	default:
		actx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(r.bg, cancel) // Close ends the wait
		c, err = lp.led.Await(actx, id, eventID)
		ended := actx.Err() != nil
		stop()
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ledger.ErrDeadLettered):
			return TurnResult{}, ledgerErr(id, err)
		case ended:
			return queued, nil // acknowledged; the turn runs on
		default:
			return TurnResult{}, ledgerErr(id, err)
		}
	}
	lt, err := decodeLedgerTurn(id, c)
	if err != nil {
		return TurnResult{}, err
	}
	if d.Duplicate && msg.Hash != "" && lt.header.Hash != "" && lt.header.Hash != msg.Hash {
		return TurnResult{}, fmt.Errorf("%w: the Idempotency-Key %q was first sent with another message; use a new key for a new message", ErrKeyReused, eventID)
	}
	res := lt.result(id)
	res.ContinuationToken, res.EventID, res.Replayed = token, eventID, d.Duplicate
	if onEvent != nil {
		for _, ev := range lt.events {
			onEvent(ev)
		}
	}
	return res, nil
}

// session implements commitPath: the committed transcript is the truth,
// and the local copy is brought up to it.
func (lp *ledgerPath) session(ctx context.Context, id string) (sessiondb.Meta, error) {
	m, _, err := lp.syncLedger(ctx, id)
	return m, err
}

// remove implements commitPath: a fenced change of the control record
// (the holder's next commit fails, and every host's next read finds the
// session gone), then the local copy goes.
func (lp *ledgerPath) remove(ctx context.Context, id string) error {
	if err := lp.led.Delete(ctx, id); err != nil {
		return ledgerErr(id, err)
	}
	return lp.r.removeLocal(ctx, id)
}

// follower streams a session's committed turns to this host's
// subscribers (serving mode ledger).
type follower struct {
	cancel context.CancelFunc
}

// follow implements commitPath: a new follower of the session starts
// at its commit sequence now (the local copy's when the store does not
// answer within followHeadTimeout); the returned function starts it, if
// none runs. The caller of that function holds r.mu.
func (lp *ledgerPath) follow(id string) func() {
	r := lp.r
	if r.closed.Load() {
		return func() {}
	}
	var after uint64
	ctx, cancel := context.WithTimeout(context.Background(), followHeadTimeout)
	defer cancel()
	if p, err := lp.led.Transcript(ctx, id, math.MaxUint64, 1); err == nil {
		after = p.Head
	} else if m, err := r.db.Get(ctx, id); err == nil {
		after = uint64(m.Turns)
	}
	return func() {
		if lp.follows[id] != nil {
			return
		}
		ctx, cancel := context.WithCancel(r.bg)
		lp.follows[id] = &follower{cancel: cancel}
		lp.followWG.Add(1)
		go func() {
			defer lp.followWG.Done()
			lp.followSession(ctx, id, after)
		}()
	}
}

// followHeadTimeout bounds Subscribe's read of a session's commit
// sequence.
const followHeadTimeout = 5 * time.Second

// unfollow implements commitPath: it stops the follower of a session.
// The caller holds r.mu.
func (lp *ledgerPath) unfollow(id string) {
	if f := lp.follows[id]; f != nil {
		f.cancel()
		delete(lp.follows, id)
	}
}

// followSession publishes the session's turns committed from now on, on
// whichever host, to this host's subscribers, and keeps the local copy up
// to date, until ctx ends or the session is deleted.
func (lp *ledgerPath) followSession(ctx context.Context, id string, after uint64) {
	r := lp.r
	for ctx.Err() == nil {
		for c, err := range lp.led.Follow(ctx, id, after) {
			if err != nil {
				if errors.Is(err, ledger.ErrDeleted) {
					r.closeSubscribers(id)
					return
				}
				r.logger(id).Debug("agent: following the session's commits", "error", err)
				break
			}
			if _, cerr := lp.cacheTurns(context.WithoutCancel(ctx), id, []ledger.Committed{c}); cerr != nil {
				r.logger(id).Warn("agent: writing a committed turn to the local copy failed", "error", cerr)
			}
			if lt, derr := decodeLedgerTurn(id, c); derr == nil {
				for _, ev := range lt.events {
					r.publish(ev)
				}
			}
			after = c.Seq
		}
		t := time.NewTimer(r.cfg.Ledger.FollowInterval + ledger.DefaultFollowInterval)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// list implements commitPath: the agent's sessions, newest first by
// their last commit, from the session index once it is built
// (ledger_index.go), else from every control record. A session's channel
// and title come from its index entry, the local copy, or its last
// committed turn's header.
func (lp *ledgerPath) list(ctx context.Context, limit int, after *cursor) (SessionPage, error) {
	if lp.ix.usable(ctx) {
		return lp.ix.list(ctx, limit, after)
	}
	return lp.listScan(ctx, limit, after)
}

// listScan is list from every control record: before the index is built,
// or over a store that cannot list it.
func (lp *ledgerPath) listScan(ctx context.Context, limit int, after *cursor) (SessionPage, error) {
	var all []ledger.SessionInfo
	for s, err := range lp.led.Sessions(ctx) {
		if err != nil {
			return SessionPage{}, storeErr("listing the sessions", err)
		}
		if s.Deleted {
			continue
		}
		if after != nil {
			u := updatedOf(s).UnixNano()
			if u > after.U || u == after.U && s.ID >= after.I {
				continue
			}
		}
		all = append(all, s)
	}
	slices.SortFunc(all, func(a, b ledger.SessionInfo) int {
		if c := updatedOf(b).Compare(updatedOf(a)); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	page := SessionPage{Sessions: []Session{}}
	if len(all) > limit {
		last := all[limit-1]
		page.NextCursor = encodeCursor(updatedOf(last), last.ID)
		all = all[:limit]
	}
	for _, s := range all {
		sess, ok, err := lp.sessionRow(ctx, s)
		if err != nil {
			return SessionPage{}, err
		}
		if ok {
			page.Sessions = append(page.Sessions, sess)
		}
	}
	return page, nil
}

// updatedOf is when a ledger session last changed for a listing: its last
// commit, or its creation before the first.
func updatedOf(s ledger.SessionInfo) time.Time {
	if s.Updated.IsZero() {
		return s.Created
	}
	return s.Updated
}

// encodeCursor is a listing's NextCursor after the session id last
// updated at u.
func encodeCursor(u time.Time, id string) string {
	b, _ := json.Marshal(cursor{U: u.UnixNano(), I: id})
	return base64.RawURLEncoding.EncodeToString(b)
}

// sessionRow is a ledger session's listing row: the local copy's when it
// holds every committed turn, else read from the last committed turn. ok
// is false when the session was deleted meanwhile.
func (lp *ledgerPath) sessionRow(ctx context.Context, s ledger.SessionInfo) (Session, bool, error) {
	r := lp.r
	sess := Session{ID: s.ID, CreatedAt: s.Created, UpdatedAt: updatedOf(s), Turns: int64(s.CommitSeq)}
	if m, err := r.db.Get(ctx, s.ID); err == nil && m.Turns == int64(s.CommitSeq) {
		sess = sessionOf(m)
		sess.UpdatedAt = updatedOf(s)
	} else if s.CommitSeq > 0 {
		c, err := lp.led.Turn(ctx, s.ID, s.CommitSeq)
		if err != nil {
			if errors.Is(err, ledger.ErrDeleted) {
				return Session{}, false, nil
			}
			return Session{}, false, storeErr("reading a session's last turn", err)
		}
		lt, err := decodeLedgerTurn(s.ID, c)
		if err != nil {
			return Session{}, false, err
		}
		sess.ChannelID, sess.Title, sess.CreatedAt = lt.header.Session.ChannelID, lt.header.Session.Title, lt.header.Session.CreatedAt
		if n := len(lt.events); n > 0 {
			sess.LastSeq = lt.events[n-1].Seq
		}
		sess.LastStatus = lt.result(s.ID).Turn.Status
	}
	return sess, true, nil
}
