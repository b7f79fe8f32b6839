package adkbench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/uuid"

	"agentkit/agent"
	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/pgkv"
	"agentkit/model"
)

// akAgent is the name of the benchmark's agentkit agent.
const akAgent = "bench"

// sessionsFile is the runtime's session database inside the state root's
// sessions/ folder (the name runtime.go opens). The smoke test fails if
// the runtime stops reading the sessions written here.
const sessionsFile = "sessions.db"

// akRuntime is an agentkit runtime on a state root of its own: an echo
// model (no network, deterministic), the memory journal off (ADK has no
// counterpart), sessions mirrored to store after every turn.
type akRuntime struct {
	rt     *agent.Runtime
	root   string
	store  *kv.DB // the PostgreSQL store; nil with the default SQLite store
	drop   func(context.Context) error
	writes *writeCounter
}

// writeCounter is an Observer counting the runtime's store writes.
type writeCounter struct {
	agent.NopObserver
	mu sync.Mutex
	n  int
}

// StoreOp counts the writes.
func (c *writeCounter) StoreOp(op string, _ time.Duration, _ error) {
	switch op {
	case "put", "delete", "put_if_absent", "put_if_version", "write_batch":
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
}

func (c *writeCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// openAKSQLite opens a runtime on root with the default store: the SQLite
// driver's tables inside the session database, root/sessions/sessions.db
// (WAL, synchronous=FULL).
func openAKSQLite(ctx context.Context, root string) (*akRuntime, error) {
	w := &writeCounter{}
	rt, err := openRuntime(ctx, root, nil, w)
	if err != nil {
		return nil, err
	}
	return &akRuntime{rt: rt, root: root, writes: w}, nil
}

// openAKPostgres opens a runtime on root whose store is table on the
// PostgreSQL server at serverURL (kv/pgkv); Close drops the table.
func openAKPostgres(ctx context.Context, root, serverURL, table string) (*akRuntime, error) {
	store, err := pgkv.Open(ctx, serverURL, &pgkv.Options{Table: table})
	if err != nil {
		return nil, fmt.Errorf("agentkit postgres store: %w", err)
	}
	drop := func(ctx context.Context) error {
		err := store.Backend().(*pgkv.Store).Drop(ctx)
		return errors.Join(err, store.Close())
	}
	w := &writeCounter{}
	rt, err := openRuntime(ctx, root, store, w)
	if err != nil {
		return nil, errors.Join(err, drop(ctx))
	}
	return &akRuntime{rt: rt, root: root, store: store, drop: drop, writes: w}, nil
}

func openRuntime(ctx context.Context, root string, store *kv.DB, obs agent.Observer) (*agent.Runtime, error) {
	echo, err := model.NewEcho(nil)
	if err != nil {
		return nil, err
	}
	cfg := agent.Config{
		Agent:     agent.Agent{Name: akAgent, Model: echo},
		StateRoot: root,
		Memory:    agent.Memory{Off: true},
		Logger:    slog.New(slog.DiscardHandler),
		Observer:  obs,
	}
	if store != nil {
		cfg.Store = store
	}
	rt, err := agent.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("agentkit runtime: %w", err)
	}
	return rt, nil
}

// Close closes the runtime, then the PostgreSQL store, dropping its table.
func (a *akRuntime) Close(ctx context.Context) error {
	err := a.rt.Close()
	if a.drop != nil {
		err = errors.Join(err, a.drop(ctx))
	}
	return err
}

// akTurner runs agentkit's full turns on a runtime: a new session every
// turnsPerSession turns (StartSession), follow-ups in between (Continue
// with the session's continuation token).
type akTurner struct {
	a     *akRuntime
	token string
	n     int
}

// turn runs the next turn with msg and returns its answer.
func (t *akTurner) turn(ctx context.Context, msg string) (agent.TurnResult, error) {
	var res agent.TurnResult
	var err error
	if t.n%turnsPerSession == 0 {
		res, err = t.a.rt.StartSession(ctx, agent.StartRequest{Message: msg})
		t.token = res.ContinuationToken
	} else {
		res, err = t.a.rt.Continue(ctx, agent.ContinueRequest{Token: t.token, Message: msg})
	}
	t.n++
	if err != nil {
		return res, err
	}
	if res.Turn.Status != agent.StatusCompleted {
		return res, fmt.Errorf("agentkit turn %d ended %s: %s", t.n, res.Turn.Status, shorten(res.Turn.Result))
	}
	return res, nil
}

// akEvent returns event seq of a session as the runtime records it: turns
// of three events (turn.started with the user's message, model.call with
// the answer, turn.finished with the result), txt as the text of each.
func akEvent(sessionID string, seq int64, at time.Time, txt string) agent.Event {
	ev := agent.Event{SessionID: sessionID, Seq: seq, At: at.UTC(), Turn: (seq-1)/3 + 1}
	usage := model.Usage{InputTokens: 120, OutputTokens: 40}
	switch seq % 3 {
	case 1:
		ev.Type, ev.Source, ev.Message = agent.EventTurnStarted, agent.SourceAPI, txt
	case 2:
		ev.Type, ev.Step, ev.Text, ev.Usage = agent.EventModelCall, 1, txt, &usage
	default:
		ev.Type, ev.Status, ev.Result, ev.Usage, ev.DurationMS = agent.EventTurnFinished, agent.StatusCompleted, txt, &usage, 1
	}
	return ev
}

// eventText is the text an event of akEvent carries.
func eventText(ev agent.Event) string {
	switch ev.Type {
	case agent.EventTurnStarted:
		return ev.Message
	case agent.EventModelCall:
		return ev.Text
	default:
		return ev.Result
	}
}

// akRecord encodes an event as the runtime stores it: its JSON.
func akRecord(ev agent.Event) (sessiondb.Record, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return sessiondb.Record{}, err
	}
	return sessiondb.Record{SessionID: ev.SessionID, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data}, nil
}

// newMeta returns the row of a new session, as StartSession makes it.
func newMeta(now time.Time) sessiondb.Meta {
	tok := make([]byte, 32)
	rand.Read(tok)
	return sessiondb.Meta{
		ID: uuid.NewString(), ChannelID: agent.DefaultChannel,
		CreatedAt: now.UTC(), UpdatedAt: now.UTC(),
		Token: base64.RawURLEncoding.EncodeToString(tok),
	}
}

// akFillBatch is the number of events of one transaction when filling.
const akFillBatch = 10_000

// fill writes a session of n events carrying text(1) through text(n) into
// the runtime's session database, through its own storage layer
// (sessiondb.Append, akFillBatch events a transaction) on a second handle,
// and returns its id. The session is marked mirrored, so the runtime does
// not copy it to the store.
func (a *akRuntime) fill(ctx context.Context, n int) (string, error) {
	db, err := sessiondb.Open(ctx, filepath.Join(a.root, stateroot.SessionsDir, sessionsFile))
	if err != nil {
		return "", err
	}
	defer db.Close()
	start := time.Now().UTC().Add(-time.Duration(n) * time.Millisecond)
	m := newMeta(start)
	recs := make([]sessiondb.Record, 0, akFillBatch)
	for i := 1; i <= n; i++ {
		rec, err := akRecord(akEvent(m.ID, int64(i), start.Add(time.Duration(i)*time.Millisecond), text(i)))
		if err != nil {
			return "", err
		}
		recs = append(recs, rec)
		if len(recs) == akFillBatch || i == n {
			if err := db.Append(ctx, recs...); err != nil {
				return "", fmt.Errorf("agentkit: filling session %s with %d events: %w", m.ID, n, err)
			}
			recs = recs[:0]
		}
	}
	m.UpdatedAt = start.Add(time.Duration(n) * time.Millisecond)
	m.Turns = int64((n + 2) / 3)
	m.LastSeq = int64(n)
	m.LastStatus = string(agent.StatusCompleted)
	m.MirroredSeq = m.LastSeq
	if err := db.Put(ctx, m); err != nil {
		return "", fmt.Errorf("agentkit: filling session %s: %w", m.ID, err)
	}
	return m.ID, nil
}

// akLog is one session in a session database of its own, appended to the
// way the runtime records each event of a turn (turn.record): the event's
// JSON and the session's new row in one transaction, on disk (WAL,
// synchronous=FULL) when Record returns.
//
// With a store (the PostgreSQL rows), each append also writes the event
// through to the store at once, as a one-event batch under the key the
// runtime's mirror uses for event batches: what an event durable on the
// server costs agentkit. (The runtime itself writes no store per event; it
// mirrors a turn's events in one batch at the turn's end, which
// BenchmarkTurn measures.)
type akLog struct {
	db    *sessiondb.DB
	meta  sessiondb.Meta
	store *kv.DB
	scope keys.Scope
}

// openAKLog opens (creating) the session database at path with one new
// session, writing through to store when it is not nil.
func openAKLog(ctx context.Context, path string, store *kv.DB) (*akLog, error) {
	db, err := sessiondb.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	m := newMeta(time.Now())
	if err := db.Put(ctx, m); err != nil {
		db.Close()
		return nil, err
	}
	scope, err := keys.Agent(akAgent)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &akLog{db: db, meta: m, store: store, scope: scope}, nil
}

// akBatch is the stored form of an event batch (the runtime's mirror
// record, format version 1).
type akBatch struct {
	V         int               `json:"v"`
	SessionID string            `json:"sessionId"`
	Batch     int64             `json:"batch"`
	Events    []json.RawMessage `json:"events"`
}

// append records the session's next event, carrying txt.
func (l *akLog) append(ctx context.Context, txt string) error {
	ev := akEvent(l.meta.ID, l.meta.LastSeq+1, time.Now(), txt)
	rec, err := akRecord(ev)
	if err != nil {
		return err
	}
	next := l.meta
	next.LastSeq, next.UpdatedAt, next.Turns = ev.Seq, ev.At, ev.Turn
	if err := l.db.Record(ctx, next, rec); err != nil {
		return err
	}
	l.meta = next
	if l.store == nil {
		return nil
	}
	key, err := l.scope.EventBatch(l.meta.ID, uint64(ev.Seq))
	if err != nil {
		return err
	}
	batch, err := json.Marshal(akBatch{V: 1, SessionID: l.meta.ID, Batch: ev.Seq, Events: []json.RawMessage{rec.Data}})
	if err != nil {
		return err
	}
	return l.store.Put(ctx, key, batch)
}

// Close closes the database.
func (l *akLog) Close() error { return l.db.Close() }
