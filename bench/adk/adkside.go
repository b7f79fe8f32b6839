package adkbench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"google.golang.org/adk/v2/session"
	"google.golang.org/adk/v2/session/database"
	"google.golang.org/genai"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The ADK app and user every benchmark session belongs to.
const (
	adkApp  = "bench"
	adkUser = "user"
	adkBot  = "bench" // the author of the model's events
)

// adkStore is one ADK database session service on a database of its own: a
// SQLite file or a PostgreSQL schema. ADK's service has no Close, so the
// store owns the connection pool it hands to the dialector and closes it.
type adkStore struct {
	svc     session.Service
	gdb     *gorm.DB // a second gorm handle on the same pool, for bulk setup
	pool    *sql.DB
	dialect string
	cleanup func(context.Context) error // drops the PostgreSQL schema; nil on SQLite
	commits *commitCounter              // the server commits ADK asked for; nil on SQLite
}

// commitCounter is a pgx tracer counting the transactions committed on
// the server: COMMIT statements, and writes sent outside a transaction.
type commitCounter struct {
	mu    sync.Mutex
	inTx  map[*pgx.Conn]bool
	count int
}

// TraceQueryStart counts a commit, or a write outside a transaction.
func (c *commitCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	verb := strings.ToLower(strings.Fields(strings.TrimSpace(data.SQL) + " x")[0])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inTx == nil {
		c.inTx = map[*pgx.Conn]bool{}
	}
	switch verb {
	case "begin":
		c.inTx[conn] = true
	case "commit":
		c.count++
		c.inTx[conn] = false
	case "rollback":
		c.inTx[conn] = false
	case "insert", "update", "delete":
		if !c.inTx[conn] {
			c.count++
		}
	}
	return ctx
}

// TraceQueryEnd does nothing.
func (c *commitCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// total returns the commits counted so far.
func (c *commitCounter) total() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// adkGormConfig is the gorm configuration of the ADK service: prepared
// statements on, as ADK's own tests run it (faster for ADK than gorm's
// default), and the logger off, so that gorm does not print a "record not
// found" line for every append (ADK looks up app and user state rows that
// do not exist) or a slow-query warning for the long loads.
func adkGormConfig() *gorm.Config {
	return &gorm.Config{PrepareStmt: true, Logger: logger.Discard}
}

// SQLite journal settings of ADK's side.
const (
	// adkWAL runs ADK's SQLite file with agentkit's durability: WAL and
	// synchronous=FULL (one fsync of the WAL per commit).
	adkWAL = "wal"
	// adkDefault runs it with SQLite's defaults, which ADK's dialector
	// keeps: the rollback journal (journal_mode=DELETE) and
	// synchronous=FULL.
	adkDefault = "default"
)

// openADKSQLite opens ADK's service on the SQLite file at path, through
// ADK's SQLite dialector (github.com/glebarez/sqlite), with the 5-second
// busy timeout its driver sets on every connection, and the journal mode:
// adkWAL adds journal_mode=WAL and synchronous=FULL; adkDefault sets no
// pragma, so SQLite's defaults apply (journal_mode=DELETE,
// synchronous=FULL).
func openADKSQLite(ctx context.Context, path, mode string) (*adkStore, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	switch mode {
	case adkWAL:
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(FULL)")
	case adkDefault:
	default:
		return nil, fmt.Errorf("adk sqlite: unknown journal setting %q", mode)
	}
	pool, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("adk sqlite: %w", err)
	}
	s, err := newADKStore(ctx, &sqlite.Dialector{Conn: pool}, pool, "sqlite")
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// openADKPostgres creates schema on the server at serverURL and opens ADK's
// service in it, through gorm.io/driver/postgres (pgx), with the server's
// settings (synchronous_commit as configured, on by default).
func openADKPostgres(ctx context.Context, serverURL, schema string) (*adkStore, error) {
	if err := pgExec(ctx, serverURL, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("adk postgres: creating schema %s: %w", schema, err)
	}
	drop := func(ctx context.Context) error {
		return pgExec(ctx, serverURL, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("adk postgres: %w", err), drop(ctx))
	}
	cfg.RuntimeParams["search_path"] = schema
	commits := &commitCounter{}
	cfg.Tracer = commits
	// What the dialector does with a DSN, done here so the pool is ours.
	pool := stdlib.OpenDB(*cfg)
	s, err := newADKStore(ctx, postgres.New(postgres.Config{Conn: pool}), pool, "postgres")
	if err != nil {
		pool.Close()
		return nil, errors.Join(err, drop(ctx))
	}
	s.cleanup = drop
	s.commits = commits
	return s, nil
}

func newADKStore(ctx context.Context, d gorm.Dialector, pool *sql.DB, dialect string) (*adkStore, error) {
	svc, err := database.NewSessionService(d, adkGormConfig())
	if err != nil {
		return nil, fmt.Errorf("adk %s: %w", dialect, err)
	}
	if err := database.AutoMigrate(svc); err != nil {
		return nil, fmt.Errorf("adk %s: %w", dialect, err)
	}
	gdb, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return nil, fmt.Errorf("adk %s: %w", dialect, err)
	}
	s := &adkStore{svc: svc, gdb: gdb.WithContext(ctx), pool: pool, dialect: dialect}
	return s, nil
}

// Close closes the pool and drops the PostgreSQL schema.
func (s *adkStore) Close(ctx context.Context) error {
	err := s.pool.Close()
	if s.cleanup != nil {
		err = errors.Join(err, s.cleanup(ctx))
	}
	return err
}

// create makes a session through the service.
func (s *adkStore) create(ctx context.Context, id string) (session.Session, error) {
	resp, err := s.svc.Create(ctx, &session.CreateRequest{AppName: adkApp, UserID: adkUser, SessionID: id})
	if err != nil {
		return nil, fmt.Errorf("adk %s: creating session %s: %w", s.dialect, id, err)
	}
	return resp.Session, nil
}

// adkEvent returns an event as an ADK agent would append it: a fresh id, an
// invocation id, an author and the text as the content of role. Times are
// UTC, so that the text timestamps SQLite stores sort in time order.
func adkEvent(ctx context.Context, invocation, author string, role genai.Role, txt string, at time.Time) *session.Event {
	ev := session.NewEvent(ctx, invocation)
	ev.Author = author
	ev.Content = genai.NewContentFromText(txt, role)
	ev.Timestamp = at.UTC()
	return ev
}

// appendEvent appends one model event carrying txt.
func (s *adkStore) appendEvent(ctx context.Context, sess session.Session, invocation, txt string) error {
	ev := adkEvent(ctx, invocation, adkBot, genai.RoleModel, txt, time.Now())
	if err := s.svc.AppendEvent(ctx, sess, ev); err != nil {
		return fmt.Errorf("adk %s: appending to session %s: %w", s.dialect, sess.ID(), err)
	}
	return nil
}

// lastEvents loads the session with its n most recent events, as an ADK
// runner asks for them (GetRequest.NumRecentEvents).
func (s *adkStore) lastEvents(ctx context.Context, id string, n int) ([]*session.Event, error) {
	resp, err := s.svc.Get(ctx, &session.GetRequest{AppName: adkApp, UserID: adkUser, SessionID: id, NumRecentEvents: n})
	if err != nil {
		return nil, fmt.Errorf("adk %s: loading session %s: %w", s.dialect, id, err)
	}
	out := make([]*session.Event, 0, n)
	for ev := range resp.Session.Events().All() {
		out = append(out, ev)
	}
	return out, nil
}

// adkEventRow is the columns of ADK's events table that an event like
// adkEvent's fills in; the others stay NULL, as ADK leaves them for such
// an event. Values are encoded as ADK encodes them (createStorageEvent):
// the actions and the content as JSON, the three flags as false.
type adkEventRow struct {
	ID           string
	AppName      string
	UserID       string
	SessionID    string
	InvocationID string
	Author       string
	Actions      []byte
	Timestamp    time.Time
	Content      string
	Partial      bool
	TurnComplete bool
	Interrupted  bool
}

// TableName is ADK's events table.
func (adkEventRow) TableName() string { return "events" }

// adkRow encodes ev as ADK's AppendEvent stores it.
func adkRow(sessionID string, ev *session.Event) (adkEventRow, error) {
	actions, err := json.Marshal(ev.Actions)
	if err != nil {
		return adkEventRow{}, err
	}
	content, err := json.Marshal(ev.Content)
	if err != nil {
		return adkEventRow{}, err
	}
	return adkEventRow{
		ID: ev.ID, AppName: adkApp, UserID: adkUser, SessionID: sessionID,
		InvocationID: ev.InvocationID, Author: ev.Author, Actions: actions,
		Timestamp: ev.Timestamp.Truncate(time.Microsecond), Content: string(content),
		Partial: ev.Partial, TurnComplete: ev.TurnComplete, Interrupted: ev.Interrupted,
	}, nil
}

// adkFillBatch is the number of rows of one multi-row INSERT when filling.
const adkFillBatch = 1000

// fill creates session id holding n model events carrying text(1) through
// text(n), one millisecond apart and ending now. It writes ADK's own rows
// with multi-row INSERTs in one transaction (appending 100,000 events one
// AppendEvent at a time would take many minutes), then sets the session's
// update time to the last event's, as AppendEvent would have.
func (s *adkStore) fill(ctx context.Context, id string, n int) error {
	if _, err := s.create(ctx, id); err != nil {
		return err
	}
	start := time.Now().UTC().Add(-time.Duration(n) * time.Millisecond).Truncate(time.Microsecond)
	last := start
	err := s.gdb.Transaction(func(tx *gorm.DB) error {
		rows := make([]adkEventRow, 0, adkFillBatch)
		flush := func() error {
			if len(rows) == 0 {
				return nil
			}
			if err := tx.Create(&rows).Error; err != nil {
				return err
			}
			rows = rows[:0]
			return nil
		}
		for i := 1; i <= n; i++ {
			last = start.Add(time.Duration(i) * time.Millisecond)
			row, err := adkRow(id, adkEvent(ctx, fmt.Sprintf("inv-%d", i), adkBot, genai.RoleModel, text(i), last))
			if err != nil {
				return err
			}
			rows = append(rows, row)
			if len(rows) == adkFillBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := flush(); err != nil {
			return err
		}
		return tx.Table("sessions").Where("app_name = ? AND user_id = ? AND id = ?", adkApp, adkUser, id).
			Update("update_time", last).Error
	})
	if err != nil {
		return fmt.Errorf("adk %s: filling session %s with %d events: %w", s.dialect, id, n, err)
	}
	if s.dialect == "postgres" {
		// What autovacuum does to a table that took this many rows; ADK's
		// query has no index to use either way.
		if err := s.gdb.Exec("VACUUM ANALYZE events").Error; err != nil {
			return fmt.Errorf("adk postgres: vacuum: %w", err)
		}
	}
	return nil
}

// pragmas reports SQLite's journal mode and synchronous setting on one of
// the service's connections.
func (s *adkStore) pragmas(ctx context.Context) (journal string, synchronous int, err error) {
	conn, err := s.pool.Conn(ctx)
	if err != nil {
		return "", 0, err
	}
	defer conn.Close()
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&journal); err != nil {
		return "", 0, err
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&synchronous); err != nil {
		return "", 0, err
	}
	return journal, synchronous, nil
}

// pgExec runs one statement on its own connection.
func pgExec(ctx context.Context, serverURL, stmt string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, stmt)
	return err
}
