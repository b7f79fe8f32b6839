package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/abtest"
	"agentkit/actor"
	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/kv"
	_ "agentkit/kv/sqlitekv" // the default store
	"agentkit/ledger"
	"agentkit/memory"
	"agentkit/model"
	"agentkit/storage"
	"agentkit/tool"
	"agentkit/workspace"
)

// Runtime runs one agent on one state root. It is safe for concurrent use;
// turns of one session run one at a time, turns of different sessions in
// parallel.
type Runtime struct {
	cfg      Config
	agent    Agent
	maxSteps int
	root     *stateroot.Root
	db       *sessiondb.DB
	binding  *storage.Binding // the store, observed once (kv.DB.WithObserver)
	storeObs kv.Observer      // the binding's observer
	// embedded is the default store, inside the session database (nil
	// when Config.Store names another): the mirror then commits a turn in
	// the transaction of its last events.
	embedded *sessiondb.Store
	caps     kv.Capabilities
	// agentStore is the agent's records in the store.
	agentStore *storage.AgentStore
	// path is the serving mode's commit path (path.go): the store mirror
	// in serving mode local, the ledger in serving mode ledger; lops its
	// operators' calls (deadletters.go).
	path commitPath
	lops ledgerOps
	// hostID names this host in what it writes to the store.
	hostID string
	// convs caches active sessions' conversations, tokens their
	// continuation tokens.
	convs  *conversationCache
	tokens *tokenCache
	policy Policy
	log    *slog.Logger
	obs    Observer
	now    func() time.Time
	mem    *memory.Hook
	hostKV tool.HostKV
	files  *os.Root

	tools     []tool.Tool
	toolIndex map[string]*tool.Tool
	specs     []model.ToolSpec

	reminders *reminders
	ab        *abtest.Recorder
	actors    *actor.Host  // the actors, session actors among them (actors.go)
	actorDel  sync.RWMutex // orders session actor writes against session deletes (actors.go)
	// actorsRefused, when set, is the answer to every actor state call
	// (errActorStateLocal in serving mode ledger).
	actorsRefused error

	claims keyClaims // Idempotency-Keys of running requests

	// led is the session ledger in serving mode ledger (nil in local),
	// for its operators' calls (dead letters, statistics).
	led *ledger.Ledger

	mu       sync.Mutex
	sessions map[string]*sessionState
	subs     map[string]map[*subscriber]struct{}

	closed atomic.Bool
	opMu   sync.Mutex     // orders enter against Close setting closed
	ops    sync.WaitGroup // running operations (turns, flushes, reminder fires)
	bg     context.Context
	stopBg context.CancelFunc
	bgWG   sync.WaitGroup
}

// sessionState is the in-process state of one session: a lock serializing
// its turns, and its debounce timer.
type sessionState struct {
	lock   chan struct{} // held (full) while a turn runs
	mirror sync.Mutex    // serializes flushes
	timer  *time.Timer   // the debounce flush, or nil
	refs   int
	// known is the session head as this host last read or wrote it, so
	// the next commit need not read it again (nil: read it). Guarded by
	// mirror.
	known *storage.KnownHead
	// state is the session's mirror state as the turn's syncHead read
	// it, for the turn's end (nil: read it again); any other write of the
	// state clears it. Guarded by mirror.
	state *sessiondb.MirrorState
	// forks counts the forks recorded in the session while this state
	// lived, so a turn learns that it was forked. Guarded by mirror.
	forks int
}

// Open starts a runtime: it prepares and locks the state root, opens the
// local session database, the store and the actors, restores recent
// sessions from the store within the policy's caps, and starts the reminder
// loop and the actors' scheduled tasks. Close releases everything.
//
// Errors name what to change: a missing agent name or model, a state root
// in use by another process (stateroot.ErrLocked, naming the folder and the
// PID), a state root written by a newer agentkit (stateroot.ErrNewerFormat),
// a store without Put or with a partial CAS group, a negative policy value.
func Open(ctx context.Context, cfg Config) (*Runtime, error) {
	if err := checkAgent(&cfg.Agent); err != nil {
		return nil, err
	}
	if err := cfg.Timeouts.check(); err != nil {
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
		convs:    newConversationCache(conversationCacheBytes, conversationIdle),
		tokens:   newTokenCache(),
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
	if r.db, err = sessiondb.Open(ctx, r.root.SessionsPath()); err != nil {
		return nil, err
	}
	if r.files, err = os.OpenRoot(r.root.Path(stateroot.FilesDir)); err != nil {
		return nil, fmt.Errorf("agent: opening host files: %w", err)
	}
	if err := r.openStore(ctx); err != nil {
		return nil, err
	}
	if err := r.openActors(); err != nil {
		return nil, err
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
	r.lops = notLedger{}
	switch {
	case cfg.newPath != nil:
		if r.path, err = cfg.newPath(r); err != nil {
			return nil, err
		}
		r.migrateTokens(ctx, nil)
	case cfg.Serving == ServingLedger:
		// The ledger replaces the mirror: sessions live in the store's
		// committed transcripts, read on demand.
		lp, err := r.openLedger()
		if err != nil {
			return nil, err
		}
		r.path, r.lops = lp, lp
		r.actorsRefused = errActorStateLocal
		r.migrateTokens(ctx, lp.rewriteTokens)
	default:
		mr := newStoreMirror(r, r.agentStore.Sessions())
		r.path = mr
		if err := mr.open(ctx); err != nil {
			return nil, err
		}
		r.migrateTokens(ctx, nil)
	}
	if r.reminders, err = newReminders(ctx, r); err != nil {
		return nil, err
	}
	if err := r.openExperiments(); err != nil {
		return nil, err
	}
	r.reminders.start(r)
	r.startActors(ctx)
	r.path.start(r.bg)
	r.sweepConversations(r.bg)
	ok = true
	return r, nil
}

// sweepConversations evicts idle conversations from the cache until ctx
// ends.
func (r *Runtime) sweepConversations(ctx context.Context) {
	r.every(ctx, conversationIdle/4, func() { r.convs.sweep(r.now()) })
}

// every runs fn every d, in the background, until ctx ends.
func (r *Runtime) every(ctx context.Context, d time.Duration, fn func()) {
	tickUntil(ctx, &r.bgWG, d, func() bool { fn(); return true })
}

// tickUntil runs fn every d in a goroutine counted by wg, until ctx ends
// or fn returns false.
func tickUntil(ctx context.Context, wg *sync.WaitGroup, d time.Duration, fn func() bool) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if !fn() {
					return
				}
			}
		}
	}()
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
	failed, backlog, forks := r.path.stats()
	return Info{
		Agent:            r.agent.Name,
		Model:            r.agent.Model.Name(),
		Serving:          r.cfg.Serving,
		StateRoot:        r.root.Dir(),
		MaxSteps:         r.maxSteps,
		Storage:          r.binding.Report(),
		DefaultStore:     r.embedded != nil,
		Memory:           r.mem.Enabled(),
		JournalPath:      r.mem.WorkspaceJournalPath(),
		MirrorDropped:    failed,
		ABSamplesDropped: r.binding.DroppedMirrorWrites(),
		MirrorBacklog:    backlog,
		MirrorForks:      forks,
		HostID:           r.hostID,
	}
}

// Store returns the store the runtime writes to, observed so that every
// operation reaches the Observer (once). Programs use it for their own
// keys; its Backend method returns the driver value, for driver methods
// such as pgkv's Drop.
func (r *Runtime) Store() *kv.DB { return r.binding.DB() }

// Binding returns the storage binding (eval and A/B tables, capability
// report).
func (r *Runtime) Binding() *storage.Binding { return r.binding }

// HostKV returns the agent's host KV, as tools see it in tool.Env.KV.
func (r *Runtime) HostKV() tool.HostKV { return r.hostKV }

// StateRoot returns the state root's absolute path.
func (r *Runtime) StateRoot() string { return r.root.Dir() }

// Close stops the reminder loop, the actor scheduler and the mirror's
// background retry, waits for running turns to finish (each commits its
// events to the store as it ends; what the store refused is committed at
// the next Open), and releases the actors, the state root, the session
// database and the default store.
// Calls after the first return nil.
func (r *Runtime) Close() error {
	r.opMu.Lock()
	if r.closed.Swap(true) {
		r.opMu.Unlock()
		return nil
	}
	r.opMu.Unlock()
	if r.path != nil {
		r.path.drain() // no queued message starts from now on
	}
	if r.stopBg != nil {
		r.stopBg()
	}
	r.bgWG.Wait()
	r.path.stop() // the ledger hands held sessions over once their running turns commit
	r.ops.Wait()  // running turns and flushes
	r.closeExperiments()
	r.closeAllSubscribers()
	r.path.close()
	r.mu.Lock()
	for _, s := range r.sessions {
		if s.timer != nil {
			s.timer.Stop()
		}
	}
	r.mu.Unlock()
	return r.release()
}

// Drain tells the runtime that it is about to close, before the program
// waits for its own work to end (a server for its running requests): in
// serving mode ledger the sessions this host holds are handed over to the
// other hosts as soon as their running turns end, with the messages queued
// behind them left for those hosts, and new messages are refused with
// ErrClosed, so a host that is shutting down starts no queued turn. In
// serving mode local it does nothing: a turn runs on the request that
// started it. Close drains too; calling Drain first is what keeps a
// shutdown from running the queue while it waits.
func (r *Runtime) Drain() {
	if r.path != nil {
		r.path.drain()
	}
}

// Flush writes, now, what the store lacks of the sessions on this host: in
// serving mode local, turns whose commit the store refused or never
// answered, and their sessions' metadata, index entries and tokens (the
// mirror's backlog, otherwise retried in the background). It returns how
// many sessions the store still lacks something of: 0 once everything
// owed is in the store. In serving mode ledger nothing is ever owed.
// `agentkit flush` runs it on a stopped host before the agent moves to
// serving mode ledger.
func (r *Runtime) Flush(ctx context.Context) (int, error) {
	exit, err := r.enter()
	if err != nil {
		return 0, err
	}
	defer exit()
	return r.path.flushOwed(ctx)
}

// release closes what Open opened, in reverse order.
func (r *Runtime) release() error {
	var errs []error
	if r.path != nil && r.closed.CompareAndSwap(false, true) {
		r.path.stop() // an Open that failed after the path opened
	}
	if r.mem != nil {
		errs = append(errs, r.mem.Close())
	}
	if r.actors != nil {
		errs = append(errs, r.actors.Close())
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
