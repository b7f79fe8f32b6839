package agent

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"agentkit/abtest"
	"agentkit/agent/sessiondb"
	"agentkit/kv"
	"agentkit/ledger"
	"agentkit/tool"
	"agentkit/workspace"
)

// LedgerOptions tunes serving mode ledger (Config.Serving =
// ServingLedger): the session ledger that lets several hosts serve one
// agent's sessions through one shared store (package ledger,
// docs/ledger.md). Zero fields take the ledger's defaults; the options are
// ignored in serving mode local.
type LedgerOptions struct {
	// Store is the coordination store; nil means the agent's store
	// (Config.Store). It needs the whole CAS group (GetWithVersion,
	// PutIfAbsent, PutIfVersion) and must be shared by every host of the
	// agent: the memory driver is refused unless AllowProcessLocal is set.
	Store *kv.DB
	// HostID names this host in control records; empty means the state
	// root's host id.
	HostID string
	// Lease is how long a holder's lease lasts without renewal
	// (ledger.DefaultLease); Margin is added before another host takes a
	// silent session over (Lease/5).
	Lease  time.Duration
	Margin time.Duration
	// DriftAllowance is the fraction of Lease the holder gives up to clock
	// rate differences (ledger.DefaultDriftAllowance).
	DriftAllowance float64
	// MaxAttempts is how many times a turn may start on one message
	// before it goes to the dead-letter store (ledger.DefaultMaxAttempts).
	MaxAttempts int
	// MaxPending and MaxPendingBytes cap a session's queued messages by
	// count and by bytes (ledger.DefaultMaxPending,
	// ledger.DefaultMaxPendingBytes); past either a message is refused
	// with ErrBusy.
	MaxPending      int
	MaxPendingBytes int64
	// MaxEventBytes bounds one queued message (ledger.DefaultMaxEventBytes);
	// a larger one is refused with ErrTooLarge.
	MaxEventBytes int
	// DedupWindow is how many consumed message ids each session remembers
	// (ledger.DefaultDedupWindow).
	DedupWindow int
	// RetryAfter is the wait a refused delivery suggests
	// (ledger.DefaultRetryAfter).
	RetryAfter time.Duration
	// JanitorInterval is the mean pause between janitor scans (Lease/2).
	JanitorInterval time.Duration
	// FollowInterval is how often a host re-reads a session it does not
	// hold while it waits for a turn (ledger.DefaultFollowInterval).
	FollowInterval time.Duration
	// AllowProcessLocal accepts a coordination store that lives in this
	// process (the memory driver), for tests.
	AllowProcessLocal bool
	// OnDeliver, when set, sees every delivery's answer, duration and
	// error (ledger.Options.OnDeliver); server.Serve sets it to its
	// metrics' ack latency histogram.
	OnDeliver func(d ledger.Delivery, took time.Duration, err error)
}

// Ledger returns the session ledger in serving mode ledger, nil in serving
// mode local. Tools that do not serve turns (dead letters, metrics) use it.
func (r *Runtime) Ledger() *ledger.Ledger { return r.led }

// ledgerKind marks the header of a committed turn's output.
const ledgerKind = "agentkit.turn"

// ledgerFormat is the format version of ledgerMessage and ledgerHeader.
const ledgerFormat = 1

// ledgerMessage is the payload of a ledger event: one user message, or a
// reminder firing.
type ledgerMessage struct {
	V       int               `json:"v"`
	Source  string            `json:"source"`
	Message string            `json:"message"`
	Files   map[string]string `json:"workspaceFiles,omitempty"`
	// Start is set on a session's first message: the session's metadata.
	Start *ledgerSession `json:"start,omitempty"`
	// Hash is the request hash of a keyed request (idempotency.go), so a
	// key reused for another message is told apart.
	Hash string `json:"hash,omitempty"`
}

// ledgerSession is a session's metadata as the ledger carries it.
type ledgerSession struct {
	ChannelID string    `json:"channelId"`
	Title     string    `json:"title,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	Token     string    `json:"token"`
}

// ledgerHeader is the first element of a committed turn's output; the
// turn's events follow it, one element each.
type ledgerHeader struct {
	Kind    string        `json:"kind"`
	V       int           `json:"v"`
	Session ledgerSession `json:"session"`
	// Hash is the consumed message's request hash, if it had one.
	Hash      string `json:"hash,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
}

// ledgerTurn is a committed turn decoded: its header, its events and their
// stored form.
type ledgerTurn struct {
	header ledgerHeader
	events []Event
	recs   []sessiondb.Record
}

// decodeLedgerTurn reads a committed turn of session id.
func decodeLedgerTurn(id string, c ledger.Committed) (ledgerTurn, error) {
	var lt ledgerTurn
	if len(c.Output) < 2 {
		return lt, fmt.Errorf("agent: committed turn %d of session %s has %d output elements; a turn has a header and events", c.Seq, id, len(c.Output))
	}
	if err := json.Unmarshal(c.Output[0], &lt.header); err != nil || lt.header.Kind != ledgerKind {
		return lt, fmt.Errorf("agent: committed turn %d of session %s has no turn header", c.Seq, id)
	}
	if lt.header.V > ledgerFormat {
		return lt, fmt.Errorf("agent: committed turn %d of session %s has format %d, newer than this agentkit's %d; upgrade this host", c.Seq, id, lt.header.V, ledgerFormat)
	}
	for i, data := range c.Output[1:] {
		var ev Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return lt, fmt.Errorf("agent: event %d of committed turn %d of session %s is damaged: %w", i+1, c.Seq, id, err)
		}
		if ev.SessionID != id || ev.Turn != int64(c.Seq) {
			return lt, fmt.Errorf("agent: event %d of committed turn %d of session %s names session %q turn %d", i+1, c.Seq, id, ev.SessionID, ev.Turn)
		}
		lt.events = append(lt.events, ev)
		lt.recs = append(lt.recs, sessiondb.Record{SessionID: id, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data})
	}
	return lt, nil
}

// result is the answer a committed turn gives.
func (lt ledgerTurn) result(id string) TurnResult {
	res := TurnResult{SessionID: id, ContinuationToken: lt.header.Session.Token}
	for _, ev := range lt.events {
		if ev.Type == EventTurnFinished {
			res.Turn = Turn{Status: ev.Status, Result: ev.Result, Retryable: lt.header.Retryable}
			if ev.Usage != nil {
				res.Turn.Usage = *ev.Usage
			}
		}
	}
	return res
}

// openLedger opens the session ledger over the coordination store (the
// agent's, or Config.Ledger.Store). ledger.Open runs the start-up check:
// a store without the whole CAS group, with a process-local CAS table, or
// the memory driver outside tests is refused, naming the CAS group.
func (r *Runtime) openLedger() error {
	o := r.cfg.Ledger
	store := o.Store
	if store == nil && r.embedded != nil {
		return errors.New("agent: serving mode ledger coordinates several hosts through one shared store, and the embedded default store lives in this host's state root; " +
			"set Config.Store (storage: in agentkit.yaml) to a shared store such as postgres://, redis:// or nats://, or Config.Ledger.Store (ledger.store:)")
	}
	if store == nil {
		if err := r.binding.RequireCoordination(); err != nil {
			return fmt.Errorf("agent: serving mode ledger: %w", err)
		}
		store = r.binding.DB()
	}
	host := o.HostID
	if host == "" {
		// A new id for every Open: a restarted host must not take the
		// leases its previous process held for its own.
		host = r.hostID + "-" + newToken()[:8]
	}
	led, err := ledger.Open(ledger.Options{
		Store: store, Agent: r.agent.Name, Handler: r.ledgerTurn, HostID: host,
		Lease: o.Lease, Margin: o.Margin, DriftAllowance: o.DriftAllowance,
		MaxAttempts: o.MaxAttempts, MaxPending: o.MaxPending, MaxPendingBytes: o.MaxPendingBytes,
		MaxEventBytes: o.MaxEventBytes, DedupWindow: o.DedupWindow, RetryAfter: o.RetryAfter,
		JanitorInterval: o.JanitorInterval, FollowInterval: o.FollowInterval,
		AllowProcessLocal: o.AllowProcessLocal, Logger: r.log,
		OnDeliver: o.OnDeliver,
	})
	if err != nil {
		return fmt.Errorf("agent: serving mode ledger: %w", err)
	}
	r.led = led
	r.follows = map[string]*follower{}
	return nil
}

// startLedger runs the ledger's janitor until Close.
func (r *Runtime) startLedger() {
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		if err := r.led.Run(r.bg); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("agent: the ledger's janitor stopped", "error", err)
		}
	}()
}

// closeLedger hands the sessions this host holds over to the other hosts:
// running turns finish (and commit) first, for at most the lease.
func (r *Runtime) closeLedger() {
	if r.led == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.led.Lease())
	defer cancel()
	if err := r.led.Close(ctx); err != nil {
		r.log.Warn("agent: closing the ledger", "error", err)
	}
}

// ledgerErr maps a ledger error to the runtime's errors.
func ledgerErr(id string, err error) error {
	var be *ledger.BusyError
	switch {
	case errors.As(err, &be):
		return &InboxFullError{SessionID: id, Pending: be.Pending, RetryAfter: be.RetryAfter}
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

// ledgerTurn is the ledger's Handler: it runs one turn of a session this
// host holds, consuming one message. The model's conversation is built
// from the session's committed transcript (through the local copy, which
// holds committed turns only and is brought up to the turn before this
// one); the turn's events are committed with the turn; the local copy,
// the AfterTurn hooks, the memory journal record and the A/B sample are
// written only after the commit succeeds. A turn whose lease is lost
// returns the error: the ledger runs it again, on whichever host holds the
// session.
func (r *Runtime) ledgerTurn(ctx context.Context, lt *ledger.Turn) (err error) {
	id := lt.SessionID
	// A message no agentkit can read is dead-lettered at once (Permanent);
	// one of a newer format is tried again, and so reaches a newer host
	// when one takes the session over, or the dead letters after
	// maxAttempts.
	var msg ledgerMessage
	if err := json.Unmarshal(lt.Event.Payload, &msg); err != nil {
		return ledger.Permanent(fmt.Errorf("agent: event %q of session %s is not a message this agentkit reads: %w", lt.Event.ID, id, err))
	}
	if msg.V > ledgerFormat {
		return fmt.Errorf("agent: event %q of session %s has format %d, newer than this agentkit's %d", lt.Event.ID, id, msg.V, ledgerFormat)
	}
	if msg.Message == "" {
		return ledger.Permanent(fmt.Errorf("agent: event %q of session %s is not a message this agentkit reads: it has no message", lt.Event.ID, id))
	}
	wctx := context.WithoutCancel(ctx)
	m, _, err := r.syncLedger(ctx, id)
	if err != nil {
		return err
	}
	if uint64(m.Turns) != lt.Seq-1 {
		return fmt.Errorf("agent: session %s: the local copy has %d committed turns, and the ledger commits turn %d next", id, m.Turns, lt.Seq)
	}
	first := m.Turns == 0
	var enrolled map[string]string
	if first {
		if msg.Start == nil {
			return ledger.Permanent(fmt.Errorf("agent: the first message of session %s carries no session metadata", id))
		}
		m = sessiondb.Meta{ID: id, ChannelID: msg.Start.ChannelID, Title: msg.Start.Title,
			CreatedAt: msg.Start.CreatedAt, UpdatedAt: msg.Start.CreatedAt, Token: msg.Start.Token}
		enrolled = r.enroll(id, m.ChannelID)
	}
	st, unref := r.refSession(id)
	defer unref()
	committed := false
	conv, err := r.loadConversation(wctx, id, r.convs.take(id), m.LastSeq)
	if err != nil {
		r.convs.put(id, nil, r.now())
		return err
	}
	t := &turn{r: r, st: st, meta: m, number: m.Turns + 1, ctx: wctx, conv: conv, led: lt}
	defer func() {
		if committed {
			r.convs.put(id, t.conv, r.now())
		} else {
			r.convs.put(id, nil, r.now()) // it holds uncommitted events
		}
	}()
	note := conv.note
	info := r.sessionInfo(m)
	if first {
		if err := os.MkdirAll(r.workspaceDir(id), 0o700); err != nil {
			return fmt.Errorf("agent: creating the session workspace: %w", err)
		}
		r.sessionStarted(ctx, info)
		note = r.firstPromptNote(ctx, info)
	}
	vs, err := r.setupFor(wctx, id, first, enrolled)
	if err != nil {
		return err
	}
	t.model, t.system = vs.model, systemPrompt(vs.instructions, note)
	dir := r.workspaceDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("agent: the session workspace: %w", err)
	}
	ws, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("agent: the session workspace: %w", err)
	}
	defer ws.Close()
	if first && len(r.agent.WorkspaceSeed) > 0 {
		if err := workspace.Seed(ws, r.agent.WorkspaceSeed); err != nil {
			return fmt.Errorf("agent: seeding the workspace: %w", err)
		}
	}
	if len(msg.Files) > 0 {
		if err := workspace.Seed(ws, msg.Files); err != nil {
			return workspaceFilesError(err)
		}
	}
	tctx, cancel := r.turnContext(ctx)
	defer cancel()
	started := r.now()
	t.meta.Turns = t.number
	startEv := Event{Type: EventTurnStarted, Source: msg.Source, Message: msg.Message, Note: note, EventID: lt.Event.ID}
	if first {
		startEv.Experiments = vs.enrolled
	}
	if err := t.record(startEv); err != nil {
		return err
	}
	env := &tool.Env{
		SessionID: id, ChannelID: m.ChannelID, Workspace: ws, KV: r.hostKV, Files: r.files,
		Reminders: r.reminders.forSession(id), Actor: r.toolActor(id), Logger: r.logger(id),
	}
	status, result, usage, err := t.loop(abtest.WithOptions(tctx, vs.options), env)
	if err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil {
		// The lease is lost, renewal is overdue or the host is closing:
		// the turn's end says so, not what the model did. The ledger runs
		// it again.
		return cause
	}
	finished := r.now()
	dur := finished.Sub(started)
	t.meta.LastStatus = string(status)
	u := usage
	if err := t.record(Event{Type: EventTurnFinished, Status: status, Result: result, Usage: &u, DurationMS: dur.Milliseconds()}); err != nil {
		return err
	}
	header, _ := json.Marshal(ledgerHeader{Kind: ledgerKind, V: ledgerFormat, Hash: msg.Hash, Retryable: temporary(t.failure),
		Session: ledgerSession{ChannelID: m.ChannelID, Title: m.Title, CreatedAt: m.CreatedAt, Token: m.Token}})
	c, err := lt.Commit(ctx, append([]json.RawMessage{header}, t.out...))
	if err != nil {
		return err
	}
	committed = true
	// Only now does the turn count: the local copy, the hooks, the memory
	// journal and the A/B sample follow the commit.
	if _, err := r.cacheTurns(wctx, id, []ledger.Committed{c}); err != nil {
		r.logger(id).Warn("agent: writing a committed turn to the local copy failed; the next read fetches it again", "error", err)
		r.convs.drop(id)
	}
	r.afterTurn(wctx, TurnInfo{
		AgentName: r.agent.Name, StateRoot: r.root.Dir(),
		SessionID: id, ChannelID: m.ChannelID, Title: m.Title,
		Turn: t.number, Source: msg.Source, UserMessage: msg.Message,
		Status: status, Result: result, Usage: usage,
		StartedAt: started, FinishedAt: finished,
	})
	r.recordABs(wctx, vs, id, t.number, turnOf(status, &usage, dur, finished))
	r.obs.TurnFinished(status, dur)
	return nil
}

// syncLedger brings the local copy of a session up to its committed
// transcript and returns the session's row (only the id when no turn is
// committed yet). It reads the control record, and the turns committed
// since the local copy's last, from the store. A deleted or unknown
// session is ErrSessionNotFound (a deleted one's local copy is removed;
// an unknown one's, a session of serving mode local, is kept); a store
// failure ErrStoreUnavailable.
func (r *Runtime) syncLedger(ctx context.Context, id string) (sessiondb.Meta, bool, error) {
	m, found, err := r.syncLedgerOnce(ctx, id)
	if errors.Is(err, ledger.ErrDeleted) && found {
		if rerr := r.removeLocal(context.WithoutCancel(ctx), id); rerr != nil {
			r.logger(id).Warn("agent: removing the local copy of a deleted session failed", "error", rerr)
		}
	}
	return m, found && err == nil, err
}

// syncLedgerOnce is syncLedger without the removal; found says whether
// the local copy had the session.
func (r *Runtime) syncLedgerOnce(ctx context.Context, id string) (sessiondb.Meta, bool, error) {
	m, err := r.db.Get(ctx, id)
	found := err == nil
	if err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
		return m, false, err
	}
	after := uint64(0)
	if found {
		after = uint64(m.Turns)
	}
	for {
		p, err := r.led.Transcript(ctx, id, after, ledger.DefaultPageSize)
		if err != nil {
			if errors.Is(err, ledger.ErrDeleted) || errors.Is(err, ledger.ErrUnknownSession) {
				// A local row of a session the ledger never had (one
				// served in serving mode local before) is kept: only a
				// tombstone removes the local copy.
				return m, found, fmt.Errorf("%w: %s: %w", ErrSessionNotFound, id, err)
			}
			return m, found, storeErr("reading the session's transcript", err)
		}
		if p.Head < after {
			return m, found, fmt.Errorf("agent: session %s: the local copy has %d turns, the ledger %d committed", id, after, p.Head)
		}
		if len(p.Turns) > 0 {
			got, err := r.cacheTurns(ctx, id, p.Turns)
			if err != nil {
				return m, found, err
			}
			m, found = got, true
		}
		after = p.Next
		if !p.More {
			break
		}
	}
	if !found {
		return sessiondb.Meta{ID: id}, false, nil
	}
	return m, true, nil
}

// cacheTurns writes committed turns to the local copy, those after its
// last in order, in one transaction, and returns the session's row.
func (r *Runtime) cacheTurns(ctx context.Context, id string, turns []ledger.Committed) (sessiondb.Meta, error) {
	st, unref := r.refSession(id)
	defer unref()
	st.mirror.Lock()
	defer st.mirror.Unlock()
	m, err := r.db.Get(ctx, id)
	found := err == nil
	if err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
		return m, err
	}
	var created *sessiondb.Meta
	var recs []sessiondb.Record
	for _, c := range turns {
		if found && int64(c.Seq) <= m.Turns {
			continue
		}
		if int64(c.Seq) != m.Turns+1 {
			return m, fmt.Errorf("agent: session %s: committed turn %d does not follow the local copy's turn %d", id, c.Seq, m.Turns)
		}
		lt, err := decodeLedgerTurn(id, c)
		if err != nil {
			return m, err
		}
		if !found {
			s := lt.header.Session
			m = sessiondb.Meta{ID: id, ChannelID: s.ChannelID, Title: s.Title, CreatedAt: s.CreatedAt, UpdatedAt: s.CreatedAt, Token: s.Token}
			cm := m
			created, found = &cm, true
		}
		for _, ev := range lt.events {
			if ev.Seq != m.LastSeq+1 {
				return m, fmt.Errorf("agent: session %s: committed turn %d holds event %d after event %d", id, c.Seq, ev.Seq, m.LastSeq)
			}
			m.LastSeq, m.UpdatedAt = ev.Seq, ev.At
			if ev.Type == EventTurnFinished {
				m.LastStatus = string(ev.Status)
			}
		}
		m.Turns = int64(c.Seq)
		recs = append(recs, lt.recs...)
	}
	if len(recs) == 0 {
		return m, nil
	}
	err = r.db.Write(ctx, func(tx *sessiondb.Tx) error {
		if created != nil {
			if err := tx.Put(*created); err != nil {
				return err
			}
		}
		return tx.Record(m, recs...)
	})
	if err != nil {
		return m, fmt.Errorf("agent: writing committed turns of session %s to the local copy: %w", id, err)
	}
	if m.Token != "" {
		r.tokens.put(m.Token, id)
	}
	return m, nil
}

// keyedSessionID is the session id a keyed start takes: the same on every
// host for the same key, so a retry after a lost answer finds the session
// the first attempt created.
func keyedSessionID(agentName, key string) string {
	sum := sha256.Sum256([]byte("agentkit/start/" + agentName + "/" + key))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// startLedger creates a session in serving mode ledger: its continuation
// token is written to the store (and awaited) before its first message is
// delivered, so every host resolves the token once any host answers.
func (r *Runtime) startLedgerSession(ctx context.Context, req StartRequest) (TurnResult, error) {
	id, eventID, hash := newID(), newID(), ""
	if req.IdempotencyKey != "" {
		id, eventID = keyedSessionID(r.agent.Name, req.IdempotencyKey), req.IdempotencyKey
		hash = startHash(req, req.ChannelID)
	}
	token := newToken()
	if err := r.agentStore.Sessions().PutToken(ctx, token, id); err != nil {
		return TurnResult{}, storeErr("writing the continuation token", err)
	}
	msg := ledgerMessage{V: ledgerFormat, Source: SourceAPI, Message: req.Message, Files: req.WorkspaceFiles, Hash: hash,
		Start: &ledgerSession{ChannelID: req.ChannelID, Title: req.Title, CreatedAt: r.now().UTC(), Token: token}}
	return r.deliverLedger(ctx, id, eventID, token, msg, req.OnEvent)
}

// continueLedger delivers a follow-up message in serving mode ledger.
func (r *Runtime) continueLedger(ctx context.Context, req ContinueRequest) (TurnResult, error) {
	id, err := r.resolveLedgerToken(ctx, req.Token)
	if err != nil {
		return TurnResult{}, err
	}
	// The session must be in the ledger: a delivery would create it, and a
	// token of a session served in serving mode local (or of a start whose
	// first message never landed) names none.
	if _, err := r.led.Transcript(ctx, id, math.MaxUint64, 1); err != nil {
		if errors.Is(err, ledger.ErrDeleted) || errors.Is(err, ledger.ErrUnknownSession) {
			return TurnResult{}, fmt.Errorf("%w: %w", ErrUnknownToken, err)
		}
		return TurnResult{}, storeErr("reading the session", err)
	}
	eventID, hash := req.IdempotencyKey, ""
	if eventID == "" {
		eventID = newID()
	} else {
		hash = continueHash(req)
	}
	msg := ledgerMessage{V: ledgerFormat, Source: SourceAPI, Message: req.Message, Files: req.WorkspaceFiles, Hash: hash}
	res, err := r.deliverLedger(ctx, id, eventID, req.Token, msg, req.OnEvent)
	if errors.Is(err, ErrSessionNotFound) {
		return TurnResult{}, fmt.Errorf("%w: %w", ErrUnknownToken, err)
	}
	return res, err
}

// resolveLedgerToken returns the session a continuation token names:
// from this host's memory or local copy, else from the store's token
// record.
func (r *Runtime) resolveLedgerToken(ctx context.Context, token string) (string, error) {
	if len(token) > maxTokenLen {
		return "", ErrUnknownToken
	}
	if id, ok := r.tokens.get(token); ok {
		return id, nil
	}
	if id, err := r.db.SessionOfToken(ctx, token); err == nil {
		r.tokens.put(token, id)
		return id, nil
	}
	id, err := r.agentStore.Sessions().ResolveToken(ctx, token)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return "", ErrUnknownToken
	case err != nil:
		return "", storeErr("resolving the continuation token", err)
	}
	r.tokens.put(token, id)
	return id, nil
}

// deliverLedger delivers a message to a session's inbox (its event id is
// the client's Idempotency-Key, or a new id) and answers: the committed
// turn when this host runs it (waiting for its commit) or when the event
// was already consumed; Queued with the event id when another host holds
// the session, or when the wait ends first (the message is acknowledged
// either way).
func (r *Runtime) deliverLedger(ctx context.Context, id, eventID, token string, msg ledgerMessage, onEvent func(Event)) (TurnResult, error) {
	payload, err := json.Marshal(msg)
	if err != nil {
		return TurnResult{}, fmt.Errorf("agent: encoding the message: %w", err)
	}
	d, err := r.led.Deliver(ctx, id, ledger.Event{ID: eventID, Payload: payload})
	if err != nil {
		return TurnResult{}, ledgerErr(id, err)
	}
	queued := TurnResult{SessionID: id, ContinuationToken: token, Queued: true, EventID: eventID, Replayed: d.Duplicate}
	var c ledger.Committed
	switch {
	case d.State == ledger.StateDeadLettered:
		return TurnResult{}, fmt.Errorf("%w: event %q of session %s", ErrDeadLettered, eventID, id)
	case d.State == ledger.StateCommitted:
		if c, err = r.led.Turn(ctx, id, d.CommitSeq); err != nil {
			return TurnResult{}, ledgerErr(id, err)
		}
	case !d.Local:
		return queued, nil
	default:
		actx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(r.bg, cancel) // Close ends the wait
		c, err = r.led.Await(actx, id, eventID)
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
	res.EventID, res.Replayed = eventID, d.Duplicate
	if onEvent != nil {
		for _, ev := range lt.events {
			onEvent(ev)
		}
	}
	return res, nil
}

// fireLedgerReminder delivers a due reminder to its session's inbox, with
// the reminder's id as the event id: a reminder claimed twice is one
// event.
func (r *Runtime) fireLedgerReminder(ctx context.Context, sessionID, reminderID, message string) error {
	payload, _ := json.Marshal(ledgerMessage{V: ledgerFormat, Source: SourceReminder, Message: message})
	_, err := r.led.Deliver(ctx, sessionID, ledger.Event{ID: "reminder/" + reminderID, Payload: payload})
	return err
}

// follower streams a session's committed turns to this host's
// subscribers (serving mode ledger).
type follower struct {
	cancel context.CancelFunc
}

// ledgerHead is where a new follower of the session starts: the
// session's commit sequence now (the local copy's when the store does not
// answer within followHeadTimeout); 0 in serving mode local.
func (r *Runtime) ledgerHead(id string) uint64 {
	if r.led == nil || r.closed.Load() {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), followHeadTimeout)
	defer cancel()
	if p, err := r.led.Transcript(ctx, id, math.MaxUint64, 1); err == nil {
		return p.Head
	}
	if m, err := r.db.Get(ctx, id); err == nil {
		return uint64(m.Turns)
	}
	return 0
}

// followHeadTimeout bounds Subscribe's read of a session's commit
// sequence.
const followHeadTimeout = 5 * time.Second

// followLocked starts the follower of a session, from the commit sequence
// after, if none runs. The caller holds r.mu.
func (r *Runtime) followLocked(id string, after uint64) {
	if r.led == nil || r.follows[id] != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.bg)
	r.follows[id] = &follower{cancel: cancel}
	r.followWG.Add(1)
	go func() {
		defer r.followWG.Done()
		r.followSession(ctx, id, after)
	}()
}

// unfollowLocked stops the follower of a session. The caller holds r.mu.
func (r *Runtime) unfollowLocked(id string) {
	if f := r.follows[id]; f != nil {
		f.cancel()
		delete(r.follows, id)
	}
}

// followSession publishes the session's turns committed from now on, on
// whichever host, to this host's subscribers, and keeps the local copy up
// to date, until ctx ends or the session is deleted.
func (r *Runtime) followSession(ctx context.Context, id string, after uint64) {
	for ctx.Err() == nil {
		for c, err := range r.led.Follow(ctx, id, after) {
			if err != nil {
				if errors.Is(err, ledger.ErrDeleted) {
					r.closeSubscribers(id)
					return
				}
				r.logger(id).Debug("agent: following the session's commits", "error", err)
				break
			}
			if _, cerr := r.cacheTurns(context.WithoutCancel(ctx), id, []ledger.Committed{c}); cerr != nil {
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

// listLedgerSessions lists the sessions of the store's index (the
// ledger's control records), newest first by their last commit. A
// session's channel and title come from the local copy, or from its last
// committed turn's header.
func (r *Runtime) listLedgerSessions(ctx context.Context, limit int, after *cursor) (SessionPage, error) {
	var all []ledger.SessionInfo
	for s, err := range r.led.Sessions(ctx) {
		if err != nil {
			return SessionPage{}, storeErr("listing the sessions", err)
		}
		if s.Deleted {
			continue
		}
		if s.Updated.IsZero() {
			s.Updated = s.Created
		}
		if after != nil {
			u := s.Updated.UnixNano()
			if u > after.U || u == after.U && s.ID >= after.I {
				continue
			}
		}
		all = append(all, s)
	}
	slices.SortFunc(all, func(a, b ledger.SessionInfo) int {
		if c := b.Updated.Compare(a.Updated); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	page := SessionPage{Sessions: []Session{}}
	if len(all) > limit {
		last := all[limit-1]
		b, _ := json.Marshal(cursor{U: last.Updated.UnixNano(), I: last.ID})
		page.NextCursor = base64.RawURLEncoding.EncodeToString(b)
		all = all[:limit]
	}
	for _, s := range all {
		sess := Session{ID: s.ID, CreatedAt: s.Created, UpdatedAt: s.Updated, Turns: int64(s.CommitSeq)}
		if m, err := r.db.Get(ctx, s.ID); err == nil && m.Turns == int64(s.CommitSeq) {
			sess = sessionOf(m)
			sess.UpdatedAt = s.Updated
		} else if s.CommitSeq > 0 {
			c, err := r.led.Turn(ctx, s.ID, s.CommitSeq)
			if err != nil {
				if errors.Is(err, ledger.ErrDeleted) {
					continue
				}
				return SessionPage{}, storeErr("reading a session's last turn", err)
			}
			lt, err := decodeLedgerTurn(s.ID, c)
			if err != nil {
				return SessionPage{}, err
			}
			sess.ChannelID, sess.Title, sess.CreatedAt = lt.header.Session.ChannelID, lt.header.Session.Title, lt.header.Session.CreatedAt
			if n := len(lt.events); n > 0 {
				sess.LastSeq = lt.events[n-1].Seq
			}
			sess.LastStatus = lt.result(s.ID).Turn.Status
		}
		page.Sessions = append(page.Sessions, sess)
	}
	return page, nil
}
