package actor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/internal/privfile"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// Defaults of Options.
const (
	DefaultMaxOpen       = 128
	DefaultIdleTimeout   = time.Minute
	DefaultMaxAttempts   = 3
	DefaultRetryDelay    = time.Minute
	DefaultMaxConcurrent = 4
	DefaultLegacyClass   = "session"
)

// Errors matched with errors.Is.
var (
	// ErrClosed means the Host was closed.
	ErrClosed = errors.New("actor: host closed")
	// ErrUnknownClass means no class of that name was defined on the Host.
	ErrUnknownClass = errors.New("actor: unknown class")
	// ErrClassDefined means Define was called twice with one class name.
	ErrClassDefined = errors.New("actor: class already defined")
	// ErrInvalidState means a state (after a patch, or given whole) is not
	// valid JSON or does not decode into the class's state type. Nothing
	// was stored.
	ErrInvalidState = errors.New("actor: invalid state")
	// ErrNotFound means no scheduled task has the id.
	ErrNotFound = errors.New("actor: not found")
	// ErrNewerFormat means an actor database or a migration marker was
	// written by a newer agentkit; the error says to upgrade.
	ErrNewerFormat = record.ErrNewerFormat
	// ErrMigrated means the actor's key-value records were migrated into a
	// database this host does not have. The error is a *MigratedError.
	ErrMigrated = errors.New("actor: migrated to another database")
	// ErrReadOnly means a log cannot be appended to: a HistorySource's
	// view of records that something else writes.
	ErrReadOnly = errors.New("actor: read-only log")
)

// Options configure Open. Dir is required.
type Options struct {
	// Dir is the folder of the actor databases: the state root's actors/.
	// It is created owner-only (0700) if missing, and made owner-only
	// if it is not (the databases in it hold the actors' state).
	Dir string
	// Store and Agent locate the key-value layout of actor records that
	// earlier builds wrote (agentkit/v1/{Agent}/actors/{id}/…). With a
	// Store, an actor of LegacyClass whose database does not exist is read
	// from there, and migrates into its database on its first write. Nil
	// means no migration.
	Store *kv.DB
	Agent string
	// LegacyClass is the class whose actors the key-value layout holds,
	// one per id; empty means DefaultLegacyClass.
	LegacyClass string
	// HostID names this host in migration markers; empty means the host
	// name.
	HostID string
	// MaxOpen bounds the system databases open at once; zero means
	// DefaultMaxOpen. Each holds one file descriptor (three with its WAL
	// and shared-memory files).
	MaxOpen int
	// IdleTimeout closes a system database unused that long, and the idle
	// connections of the authors' databases; zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Synchronous is "full" (every write is on disk when it returns; the
	// default when empty) or "normal" (a write survives a crash of the
	// process but may be lost, never corrupted, in a power cut).
	Synchronous string
	// History, when set, gives the message and event logs of some actors
	// from elsewhere (a session's own events) instead of their system
	// database.
	History HistorySource
	// WriteCheck, when set, runs before every write to an actor; an error
	// refuses the write and is returned as it is.
	WriteCheck func(ctx context.Context, class, id string) error
	// MaxAttempts bounds the runs of one scheduled task that fail; zero
	// means DefaultMaxAttempts. The count is durable: it survives a
	// crash in the handler.
	MaxAttempts int
	// RetryDelay is the wait after a task's first failed run, doubling
	// after each further one; zero means DefaultRetryDelay.
	RetryDelay time.Duration
	// MaxConcurrent bounds the actors whose tasks run at once; zero means
	// DefaultMaxConcurrent. One actor's tasks run one at a time.
	MaxConcurrent int
	// Logger receives scheduler errors; nil means slog.Default().
	Logger *slog.Logger
}

// Host serves the actors of one host: their databases under Dir, a bounded
// pool of open ones, the scheduled tasks and the migration from the
// key-value layout. Its methods are safe for concurrent use.
type Host struct {
	opts  Options
	sync  string
	pool  *pool
	scope keys.Scope // with a Store
	log   *slog.Logger
	wake  chan struct{}
	// scanned is set once ScanLegacyTasks has succeeded.
	scanned atomic.Bool

	mu       sync.Mutex
	classes  map[string]*classInfo
	handlers map[string]HandlerFunc
	data     map[string]*sql.DB // authors' databases by actor key
	index    *index
	closed   bool
}

// classInfo is what a Host knows of a class: its initial state and how to
// check a state against its type.
type classInfo struct {
	name    string
	initial func() ([]byte, error)
	check   func([]byte) error
}

// Open returns a Host over opts.Dir. It creates the folder if missing and
// nothing else: an actor's database is created by its first write.
func Open(opts Options) (*Host, error) {
	if opts.Dir == "" {
		return nil, errors.New("actor: Options.Dir is empty; give the folder of the actor databases (the state root's actors/)")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("actor: %w", err)
	}
	opts.Dir = dir
	h := &Host{opts: opts, classes: map[string]*classInfo{}, handlers: map[string]HandlerFunc{},
		data: map[string]*sql.DB{}, wake: make(chan struct{}, 1), log: opts.Logger}
	switch strings.ToLower(opts.Synchronous) {
	case "", "full":
		h.sync = "FULL"
	case "normal":
		h.sync = "NORMAL"
	default:
		return nil, fmt.Errorf("actor: Synchronous %q is not supported; use full (every returned write is on disk, the default) or normal", opts.Synchronous)
	}
	if opts.Store != nil {
		if h.scope, err = keys.Agent(opts.Agent); err != nil {
			return nil, fmt.Errorf("actor: Options.Agent names the agent whose key-value actor records to migrate: %w", err)
		}
	}
	if h.opts.LegacyClass == "" {
		h.opts.LegacyClass = DefaultLegacyClass
	}
	if h.opts.HostID == "" {
		name, _ := os.Hostname()
		if name == "" {
			name = "unknown-host"
		}
		h.opts.HostID = name
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&h.opts.IdleTimeout, DefaultIdleTimeout)
	def(&h.opts.RetryDelay, DefaultRetryDelay)
	if h.opts.MaxOpen <= 0 {
		h.opts.MaxOpen = DefaultMaxOpen
	}
	if h.opts.MaxAttempts <= 0 {
		h.opts.MaxAttempts = DefaultMaxAttempts
	}
	if h.opts.MaxConcurrent <= 0 {
		h.opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if err := mkdirs(dir); err != nil {
		return nil, err
	}
	if err := privfile.Tighten(dir); err != nil {
		return nil, fmt.Errorf("actor: %w", err)
	}
	h.pool = newPool(h.opts.MaxOpen, h.opts.IdleTimeout)
	return h, nil
}

// Dir returns the folder of the actor databases.
func (h *Host) Dir() string { return h.opts.Dir }

// Close closes every open database. Call it after Run has returned.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	data, idx := h.data, h.index
	h.data, h.index = nil, nil
	h.mu.Unlock()
	errs := []error{h.pool.close()}
	for _, db := range data {
		errs = append(errs, db.Close())
	}
	if idx != nil {
		errs = append(errs, idx.db.Close())
	}
	return errors.Join(errs...)
}

// OpenDatabases reports how many system databases are open now (at most
// Options.MaxOpen).
func (h *Host) OpenDatabases() int { return h.pool.open() }

// defineClass registers a class.
func (h *Host) defineClass(c *classInfo) error {
	if err := checkName("class name", c.name); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if _, ok := h.classes[c.name]; ok {
		return fmt.Errorf("%w: %q", ErrClassDefined, c.name)
	}
	h.classes[c.name] = c
	return nil
}

// Ref returns the untyped reference to the actor id of the class named
// class, which must have been defined (ErrUnknownClass). It opens nothing.
func (h *Host) Ref(class, id string) (*Ref, error) {
	h.mu.Lock()
	c, ok := h.classes[class]
	h.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q is not defined on this host; define it with actor.Define", ErrUnknownClass, class)
	}
	return h.ref(c, class, id)
}

// ref builds a Ref; c may be nil for a class this host does not define (a
// scheduled task found in a database), whose state is then out of reach.
func (h *Host) ref(c *classInfo, class, id string) (*Ref, error) {
	if err := checkName("class name", class); err != nil {
		return nil, err
	}
	if err := checkName("actor id", id); err != nil {
		return nil, err
	}
	dir := actorDir(h.opts.Dir, class, id)
	return &Ref{h: h, cls: c, class: class, id: id, dir: dir, key: fileName(class) + "/" + fileName(id)}, nil
}
