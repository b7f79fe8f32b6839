package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/abtest"
	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/keys"
	"agentkit/kv"
	_ "agentkit/kv/sqlitekv" // the default store
	"agentkit/memory"
	"agentkit/model"
	"agentkit/storage"
	"agentkit/tool"
	"agentkit/workspace"
)

// mirrorTimeout bounds the mirror writes of one flush.
const mirrorTimeout = 30 * time.Second

// Runtime runs one agent on one state root. It is safe for concurrent use;
// turns of one session run one at a time, turns of different sessions in
// parallel.
type Runtime struct {
	cfg      Config
	agent    Agent
	maxSteps int
	scope    keys.Scope
	root     *stateroot.Root
	db       *sessiondb.DB
	store    *kv.DB // the timed store every operation goes through
	binding  *storage.Binding
	ownStore *kv.DB // the default store, closed by Close
	caps     kv.Capabilities
	policy   Policy
	log      *slog.Logger
	obs      Observer
	now      func() time.Time
	mem      *memory.Hook
	hostKV   tool.HostKV
	files    *os.Root

	tools     []tool.Tool
	toolIndex map[string]*tool.Tool
	specs     []model.ToolSpec

	reminders *reminders
	ab        *abtest.Recorder

	mu       sync.Mutex
	sessions map[string]*sessionState
	subs     map[string]map[*subscriber]struct{}

	dropped atomic.Int64
	closed  atomic.Bool
	opMu    sync.Mutex     // orders enter against Close setting closed
	ops     sync.WaitGroup // running operations (turns, flushes, reminder fires)
	bg      context.Context
	stopBg  context.CancelFunc
	bgWG    sync.WaitGroup
}

// sessionState is the in-process state of one session: a lock serializing
// its turns, and its debounce timer.
type sessionState struct {
	lock   chan struct{} // held (full) while a turn runs
	mirror sync.Mutex    // serializes flushes
	timer  *time.Timer   // the debounce flush, or nil
	refs   int
}

// Open starts a runtime: it prepares and locks the state root, opens the
// local session database and the store, restores recent sessions from the
// store within the policy's caps, and starts the reminder loop. Close
// releases everything.
//
// Errors name what to change: a missing agent name or model, a state root
// in use by another process (stateroot.ErrLocked, naming the folder and the
// PID), a state root written by a newer agentkit (stateroot.ErrNewerFormat),
// a store without Put or with a partial CAS group, a negative policy value.
func Open(ctx context.Context, cfg Config) (*Runtime, error) {
	if err := checkAgent(&cfg.Agent); err != nil {
		return nil, err
	}
	switch cfg.Serving {
	case "", ServingLocal:
		cfg.Serving = ServingLocal
	case ServingLedger:
	default:
		return nil, fmt.Errorf("agent: Config.Serving is %q; use %q or %q", cfg.Serving, ServingLocal, ServingLedger)
	}
	if cfg.StateRoot == "" {
		return nil, errors.New("agent: Config.StateRoot is empty; give the folder where this host keeps its state (--state-root)")
	}
	r := &Runtime{
		cfg:      cfg,
		agent:    cfg.Agent,
		maxSteps: cfg.Agent.MaxSteps,
		log:      cfg.Logger,
		obs:      cfg.Observer,
		now:      cfg.Now,
		sessions: map[string]*sessionState{},
		subs:     map[string]map[*subscriber]struct{}{},
	}
	if r.maxSteps == 0 {
		r.maxSteps = DefaultMaxSteps
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.log = r.log.With(slog.String("agent", cfg.Agent.Name))
	if r.obs == nil {
		r.obs = NopObserver{}
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.scope, _ = keys.Agent(cfg.Agent.Name) // checked by checkAgent

	ok := false
	defer func() {
		if !ok {
			r.release()
		}
	}()
	var err error
	if r.root, err = stateroot.Open(cfg.StateRoot); err != nil {
		return nil, err
	}
	if r.db, err = sessiondb.Open(ctx, filepath.Join(r.root.Path(stateroot.SessionsDir), "sessions.db")); err != nil {
		return nil, err
	}
	if r.files, err = os.OpenRoot(r.root.Path(stateroot.FilesDir)); err != nil {
		return nil, fmt.Errorf("agent: opening host files: %w", err)
	}
	if err := r.openStore(ctx); err != nil {
		return nil, err
	}
	if cfg.Serving == ServingLedger {
		if err := r.binding.RequireCoordination(); err != nil {
			return nil, err
		}
		return nil, errors.New("agent: serving mode ledger is not available in this build yet; use serving: local")
	}
	if r.mem, err = memory.NewHook(memory.Info{StateRoot: r.root.Dir(), AgentName: cfg.Agent.Name}, &memory.Options{
		Off:           cfg.Memory.Off,
		MaxTextLength: cfg.Memory.MaxTextLength,
		Backend:       cfg.Memory.Backend,
		Logger:        r.log,
	}); err != nil {
		return nil, fmt.Errorf("agent: Config.Memory: %w", err)
	}
	if err := r.buildTools(); err != nil {
		return nil, err
	}
	r.bg, r.stopBg = context.WithCancel(context.WithoutCancel(ctx))
	if err := r.flushUnmirrored(ctx); err != nil {
		return nil, err
	}
	if err := r.restore(ctx); err != nil {
		return nil, err
	}
	if r.reminders, err = newReminders(ctx, r); err != nil {
		return nil, err
	}
	if err := r.openExperiments(); err != nil {
		return nil, err
	}
	r.reminders.start(r)
	ok = true
	return r, nil
}

// checkAgent validates the agent definition.
func checkAgent(a *Agent) error {
	switch {
	case a.Name == "":
		return errors.New("agent: Agent.Name is empty; name the agent (it scopes every key the runtime writes)")
	case a.Model == nil:
		return fmt.Errorf("agent: agent %q has no Model; set Agent.Model (model.NewEcho(nil) needs no network)", a.Name)
	case a.MaxSteps < 0:
		return fmt.Errorf("agent: Agent.MaxSteps is %d; use a positive step limit, or 0 for the default %d", a.MaxSteps, DefaultMaxSteps)
	}
	if err := workspace.ValidateFiles(a.WorkspaceSeed); err != nil {
		return fmt.Errorf("agent: Agent.WorkspaceSeed: %w", err)
	}
	return nil
}

// openStore opens the default store when none is configured, wraps the
// store in the timing decorator and binds it.
func (r *Runtime) openStore(ctx context.Context) error {
	backend := r.cfg.Store
	name := r.cfg.StoreName
	if backend == nil {
		db, err := kv.Open(ctx, stateroot.DefaultStoreURL(r.root.Dir()))
		if err != nil {
			return fmt.Errorf("agent: opening the default store: %w", err)
		}
		r.ownStore = db
		backend = db
		if name == "" {
			name = "sqlite (default)"
		}
	}
	// Check the backend and the policy as given, so that errors name what
	// the caller wrote; the binding proper is made over the timed store.
	quiet := slog.New(slog.DiscardHandler)
	if _, err := storage.Define(storage.Config{Backend: backend, Name: name, Policy: r.cfg.Policy, Logger: quiet, Evals: r.cfg.Evals, ABs: r.cfg.ABs}); err != nil {
		return fmt.Errorf("agent: Config.Store: %w", err)
	}
	if name == "" {
		name = "custom"
		if d, ok := backend.(*kv.DB); ok {
			name = d.Name()
		}
	}
	db, err := kv.New(name, backend)
	if err != nil {
		return fmt.Errorf("agent: Config.Store: %w", err)
	}
	r.store = timed(db, r.obs)
	r.binding, err = storage.Define(storage.Config{Backend: r.store, Name: name, Policy: r.cfg.Policy, Logger: r.log, Evals: r.cfg.Evals, ABs: r.cfg.ABs})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	r.caps = r.binding.Capabilities()
	r.policy = r.binding.Policy()
	as, err := r.binding.Agent(r.agent.Name)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	r.hostKV = newHostKV(as)
	return nil
}

// buildTools puts together the workspace tools and the agent's own.
func (r *Runtime) buildTools() error {
	var all []tool.Tool
	if !r.agent.NoWorkspaceTools {
		all = append(all, workspace.Tools(workspace.Options{MemoryDir: r.root.Path(stateroot.MemoryDir)})...)
	}
	all = append(all, r.agent.Tools...)
	r.toolIndex = map[string]*tool.Tool{}
	for i := range all {
		t := &all[i]
		switch {
		case t.Spec.Name == "":
			return fmt.Errorf("agent: tool %d of agent %q has no Spec.Name", i, r.agent.Name)
		case t.Run == nil:
			return fmt.Errorf("agent: tool %q has no Run function", t.Spec.Name)
		}
		if _, dup := r.toolIndex[t.Spec.Name]; dup {
			return fmt.Errorf("agent: two tools are named %q; tool names must be unique (the workspace tools are list_files, read_file, write_file and search_files; set Agent.NoWorkspaceTools to replace them)", t.Spec.Name)
		}
		r.toolIndex[t.Spec.Name] = t
		r.specs = append(r.specs, t.Spec)
	}
	r.tools = all
	return nil
}

// Info describes the running agent.
func (r *Runtime) Info() Info {
	return Info{
		Agent:         r.agent.Name,
		Model:         r.agent.Model.Name(),
		Serving:       r.cfg.Serving,
		StateRoot:     r.root.Dir(),
		MaxSteps:      r.maxSteps,
		Storage:       r.binding.Report(),
		DefaultStore:  r.ownStore != nil,
		Memory:        r.mem.Enabled(),
		JournalPath:   r.mem.JournalPath(),
		MirrorDropped: r.dropped.Load(),
	}
}

// Store returns the store the runtime writes to, wrapped so that every
// operation reaches the Observer. Programs use it for their own keys; the
// ledger and other components take it as their raw store.
func (r *Runtime) Store() *kv.DB { return r.store }

// Binding returns the storage binding (eval and A/B tables, capability
// report).
func (r *Runtime) Binding() *storage.Binding { return r.binding }

// HostKV returns the agent's host KV, as tools see it in tool.Env.KV.
func (r *Runtime) HostKV() tool.HostKV { return r.hostKV }

// StateRoot returns the state root's absolute path.
func (r *Runtime) StateRoot() string { return r.root.Dir() }

// Close stops the reminder loop, waits for running turns to finish, flushes
// the mirror, and releases the state root, the session database and the
// default store. Calls after the first return nil.
func (r *Runtime) Close() error {
	r.opMu.Lock()
	if r.closed.Swap(true) {
		r.opMu.Unlock()
		return nil
	}
	r.opMu.Unlock()
	if r.stopBg != nil {
		r.stopBg()
	}
	r.bgWG.Wait()
	r.ops.Wait() // running turns and flushes
	r.closeExperiments()
	r.closeAllSubscribers()
	r.mu.Lock()
	for _, s := range r.sessions {
		if s.timer != nil {
			s.timer.Stop()
		}
	}
	r.mu.Unlock()
	return r.release()
}

// release closes what Open opened, in reverse order.
func (r *Runtime) release() error {
	var errs []error
	if r.mem != nil {
		errs = append(errs, r.mem.Close())
	}
	if r.ownStore != nil {
		errs = append(errs, r.ownStore.Close())
	}
	if r.files != nil {
		errs = append(errs, r.files.Close())
	}
	if r.db != nil {
		errs = append(errs, r.db.Close())
	}
	if r.root != nil {
		errs = append(errs, r.root.Close())
	}
	return errors.Join(errs...)
}

// logger returns the logger of a session.
func (r *Runtime) logger(sessionID string) *slog.Logger {
	return r.log.With(slog.String("sessionId", sessionID))
}
