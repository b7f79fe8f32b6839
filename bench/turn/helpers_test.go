package turnbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/agent"
	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/internal/testenv"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/pgkv"
	"agentkit/model"
)

// agentName is the benchmark agent's name; it scopes the store's keys.
const agentName = "bench"

// textSize is the size of every message and answer text.
const textSize = 200

// sessionsFile is the runtime's session database in the state root's
// sessions/ folder (the file agent.Open opens).
const sessionsFile = "sessions.db"

// text returns the deterministic textSize-byte text number i.
func text(i int) string {
	const filler = "The quick brown fox jumps over the lazy dog while the agent keeps its session durable. "
	s := fmt.Sprintf("message %09d: ", i)
	for len(s) < textSize {
		s += filler
	}
	return s[:textSize]
}

// echoPrefix is what the echo model puts before the user's message.
const echoPrefix = "echo: "

// defaultServer is the PostgreSQL server unless AGENTKIT_TEST_POSTGRES
// names another (the variable kv/pgkv's tests read).
const defaultServer = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

var (
	serverOnce sync.Once
	serverErr  error
)

// pgServer returns the PostgreSQL URL, or skips (fails in CI) when the
// server does not answer.
func pgServer(tb testing.TB) string {
	tb.Helper()
	u := testenv.Getenv("AGENTKIT_TEST_POSTGRES", defaultServer)
	serverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var conn *pgx.Conn
		if conn, serverErr = pgx.Connect(ctx, u); serverErr == nil {
			serverErr = conn.Ping(ctx)
			conn.Close(ctx)
		}
	})
	if serverErr != nil {
		testenv.Unavailable(tb, "PostgreSQL", "Start one and set AGENTKIT_TEST_POSTGRES to its URL (default "+defaultServer+").", serverErr)
	}
	return u
}

// runID makes this process's table names unique, so concurrent runs on
// the shared server never collide.
var runID = func() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}()

var (
	nameMu  sync.Mutex
	nameSeq int
)

// pgTable returns a fresh table name: turnbench_{run}_{n}.
func pgTable() string {
	nameMu.Lock()
	defer nameMu.Unlock()
	nameSeq++
	return fmt.Sprintf("turnbench_%s_%d", runID, nameSeq)
}

// openPG opens a store on a fresh table of the PostgreSQL server; drop
// drops the table and closes the store.
func openPG(ctx context.Context, tb testing.TB) (store *kv.DB, table string, drop func(context.Context) error, err error) {
	srv := pgServer(tb)
	table = pgTable()
	store, err = pgkv.Open(ctx, srv, &pgkv.Options{Table: table})
	if err != nil {
		return nil, "", nil, err
	}
	drop = func(ctx context.Context) error {
		return errors.Join(store.Backend().(*pgkv.Store).Drop(ctx), store.Close())
	}
	return store, table, drop, nil
}

// storeCounter is an Observer counting the runtime's store writes.
type storeCounter struct {
	agent.NopObserver
	mu     sync.Mutex
	writes map[string]int
}

// StoreOp counts writes by operation.
func (c *storeCounter) StoreOp(op string, _ time.Duration, err error) {
	switch op {
	case "put", "delete", "put_if_absent", "put_if_version", "write_batch":
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writes == nil {
		c.writes = map[string]int{}
	}
	c.writes[op]++
}

// total returns the writes counted so far.
func (c *storeCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.writes {
		n += v
	}
	return n
}

// runtimeConfig is the configuration of every benchmark runtime: the echo
// model (no network, deterministic), the memory journal off, logs
// discarded, on root with store (nil: the embedded default store).
func runtimeConfig(root string, store *kv.DB, obs agent.Observer) (agent.Config, error) {
	echo, err := model.NewEcho(nil)
	if err != nil {
		return agent.Config{}, err
	}
	cfg := agent.Config{
		Agent:     agent.Agent{Name: agentName, Model: echo},
		StateRoot: root,
		Memory:    agent.Memory{Off: true},
		Logger:    slog.New(slog.DiscardHandler),
		Observer:  obs,
	}
	if store != nil {
		cfg.Store = store
	}
	return cfg, nil
}

// openRuntime opens a runtime on root (see runtimeConfig).
func openRuntime(ctx context.Context, root string, store *kv.DB, obs agent.Observer) (*agent.Runtime, error) {
	cfg, err := runtimeConfig(root, store, obs)
	if err != nil {
		return nil, err
	}
	rt, err := agent.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening the runtime on %s: %w", root, err)
	}
	return rt, nil
}

// event returns event seq of a filled session as the runtime records a
// turn of the echo model: turn.started with the user's message, model.call
// with the answer, turn.finished with the result; three events a turn.
func event(sessionID string, seq int64, at time.Time) agent.Event {
	turn := (seq-1)/3 + 1
	msg := text(int(turn))
	usage := model.Usage{InputTokens: 120, OutputTokens: 40}
	ev := agent.Event{SessionID: sessionID, Seq: seq, At: at.UTC(), Turn: turn}
	switch seq % 3 {
	case 1:
		ev.Type, ev.Source, ev.Message = agent.EventTurnStarted, agent.SourceAPI, msg
	case 2:
		ev.Type, ev.Step, ev.Text, ev.Usage = agent.EventModelCall, 1, echoPrefix+msg, &usage
	default:
		ev.Type, ev.Status, ev.Result, ev.Usage, ev.DurationMS = agent.EventTurnFinished, agent.StatusCompleted, echoPrefix+msg, &usage, 1
	}
	return ev
}

// record encodes an event as the runtime stores it: its JSON.
func record(ev agent.Event) (sessiondb.Record, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return sessiondb.Record{}, err
	}
	return sessiondb.Record{SessionID: ev.SessionID, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data}, nil
}

// newMeta returns the row of a new session, as StartSession makes it
// (the runtime stores only its token's digest; benchToken is the token).
func newMeta(id string, now time.Time) sessiondb.Meta {
	return sessiondb.Meta{
		ID: id, ChannelID: agent.DefaultChannel,
		CreatedAt: now.UTC(), UpdatedAt: now.UTC(),
		TokenDigest: keys.TokenDigest(benchToken(id)),
	}
}

// benchToken is the continuation token of a session newMeta made.
func benchToken(id string) string { return "bench-token-" + id }

// fillBatch is the number of events of one transaction when filling.
const fillBatch = 10_000

// fillSession writes a session of turns whole echo turns (3 events each)
// into the session database at path, through the runtime's own storage
// layer (sessiondb.Append, fillBatch events a transaction), and returns
// its row. The session is marked mirrored, so the runtime does not copy
// its old events to the store; a turn mirrors only what it adds.
func fillSession(ctx context.Context, db *sessiondb.DB, id string, turns int) (sessiondb.Meta, error) {
	n := int64(3 * turns)
	start := time.Now().UTC().Add(-time.Duration(n) * time.Millisecond)
	m := newMeta(id, start)
	if err := db.Put(ctx, m); err != nil {
		return m, err
	}
	recs := make([]sessiondb.Record, 0, fillBatch)
	for seq := int64(1); seq <= n; seq++ {
		rec, err := record(event(id, seq, start.Add(time.Duration(seq)*time.Millisecond)))
		if err != nil {
			return m, err
		}
		recs = append(recs, rec)
		if len(recs) == fillBatch || seq == n {
			if err := db.Append(ctx, recs...); err != nil {
				return m, fmt.Errorf("filling session %s with %d events: %w", id, n, err)
			}
			recs = recs[:0]
		}
	}
	m.UpdatedAt = start.Add(time.Duration(n) * time.Millisecond)
	m.Turns = int64(turns)
	m.LastSeq = n
	m.LastStatus = string(agent.StatusCompleted)
	m.MirroredSeq = n
	if err := db.Put(ctx, m); err != nil {
		return m, fmt.Errorf("filling session %s: %w", id, err)
	}
	return m, nil
}

// Fixtures shared by every benchmark of one process, built on first use
// and released by TestMain.
var fixtures struct {
	sync.Mutex
	dir    string
	values map[string]any
	close  []func(context.Context) error
}

// shared returns the fixture named key, building it on first use. build
// gets a folder of its own and returns the value and how to release it.
func shared[T any](tb testing.TB, key string, build func(ctx context.Context, dir string) (T, func(context.Context) error, error)) T {
	tb.Helper()
	fixtures.Lock()
	defer fixtures.Unlock()
	if v, ok := fixtures.values[key]; ok {
		return v.(T)
	}
	if fixtures.dir == "" {
		d, err := os.MkdirTemp("", "turnbench-")
		if err != nil {
			tb.Fatal(err)
		}
		fixtures.dir = d
		fixtures.values = map[string]any{}
	}
	dir, err := os.MkdirTemp(fixtures.dir, strings.NewReplacer("/", "-", "=", "-").Replace(key)+"-")
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	v, release, err := build(context.Background(), dir)
	if err != nil {
		tb.Fatalf("building fixture %s: %v", key, err)
	}
	tb.Logf("fixture %s built in %v", key, time.Since(start).Round(time.Millisecond))
	fixtures.values[key] = v
	fixtures.close = append(fixtures.close, release)
	return v
}

// releaseFixtures closes the shared fixtures, newest first, and removes
// their folder.
func releaseFixtures() error {
	fixtures.Lock()
	defer fixtures.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for i := len(fixtures.close) - 1; i >= 0; i-- {
		errs = append(errs, fixtures.close[i](ctx))
	}
	if fixtures.dir != "" {
		errs = append(errs, os.RemoveAll(fixtures.dir))
	}
	fixtures.values, fixtures.close, fixtures.dir = nil, nil, ""
	return errors.Join(errs...)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := releaseFixtures(); err != nil {
		fmt.Fprintln(os.Stderr, "turnbench: releasing fixtures:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// sessionsPath is the session database of the runtime on root.
func sessionsPath(root string) string {
	return filepath.Join(root, stateroot.SessionsDir, sessionsFile)
}
