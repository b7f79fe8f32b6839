// Package storage is agentkit's record layer: it binds a key-value backend
// to the runtime and is the one place where the runtime's records are
// written to and read from the store. Package keys defines the layout
// under agentkit/v1/; this package builds the keys of every record kind it
// writes, with its stored form, its codec (package record) and its write
// semantics, and the runtime (package agent), the reminder scheduler and
// the eval and A/B tables ask it for records and never combine keys and kv
// by hand. The one family it does not write is the session ledger's
// (agentkit/v1/{agent}/durable-session/): package ledger builds its own
// keys inside the prefix package keys gives it (keys.Scope.LedgerPrefix).
//
// Define takes a backend (any value implementing at least kv.Putter, a
// kv.Funcs, or a *kv.DB from kv.Open), checks it, discovers what it can do,
// fills in the default policy, and returns a *Binding: the runtime's view of
// the store. Per agent (Binding.Agent) it gives:
//
//	record kind          file           write semantics
//	session head         sessions.go    compare-and-set (Sessions.Commit, Sessions.Delete)
//	event batch, parts   batches.go     create-only (PutIfAbsent), through Sessions.Commit
//	session metadata     sessions.go    Put; the error is returned, the caller retries
//	session index entry  sessions.go    Put and Delete; the error is returned
//	continuation token   sessions.go    Put; the error is returned
//	reminder             reminders.go   create-only, then compare-and-set claims (Put without CAS)
//	host KV entry        hostkv.go      Put, Get, Delete, List; awaited, errors returned
//	eval run             evals.go       Put, Delete, List; errors returned
//	                     update.go      compare-and-set loop (EvalRuns.Update)
//	A/B sample           abs.go         one blind Put; a failure is logged, counted and dropped
//	                     update.go      Delete of superseded samples (ABs.PruneSamples)
//	A/B snapshot         abs.go         Put (last write wins); errors returned
//	                     update.go      compare-and-set loop (ABs.UpdateSnapshot)
//
// The runtime keeps what the session mirror failed to write and retries it
// (package agent); only A/B samples are at most once. Reads of a session
// start at its head, which a delete turns into a tombstone, so no stray key
// brings a deleted session back.
//
// Every record is JSON with a format version field "v", written and read by
// one codec (package record, the same for the ledger's records) under one
// rule: a record with a newer version than this build knows is refused
// with an error matching ErrNewerFormat instead of being misread.
//
// Binding.Report is the capability report GET /v1/info serialises, and
// Binding.RequireCoordination the start-up check of the features that
// coordinate hosts through the CAS group.
package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// Defaults of the restore policy, used where a field of RestorePolicy is zero.
const (
	DefaultRestoreMaxSessions   = 1000
	DefaultRestoreMaxAge        = 30 * 24 * time.Hour
	DefaultRestoreMaxTotalBytes = int64(1) << 30 // 1 GiB
)

// Config says what to bind. Only Backend is required.
type Config struct {
	// Backend is the store: any value implementing at least kv.Putter
	// (optionally kv.Getter, kv.Deleter, kv.Lister and the kv.CAS group), a
	// kv.Funcs, or a *kv.DB such as kv.Open returns.
	Backend any
	// Name labels the store in GET /v1/info and in logs. It defaults to the
	// *kv.DB's name, or "custom" for other backends.
	Name string
	// Policy holds the timing knobs.
	Policy Policy
	// Evals is a backend-native eval-run table. When nil, runs are stored
	// one key per run over the core (see EvalTable).
	Evals EvalTable
	// ABs is a backend-native A/B table. When nil, samples and the snapshot
	// are stored over the core (see ABTable).
	ABs ABTable
	// Logger receives dropped A/B samples and start-up notices. Nil means
	// slog.Default().
	Logger *slog.Logger
	// Observer, when set, receives every store operation of the binding,
	// once (kv.DB.WithObserver): for metrics and logs.
	Observer kv.Observer
}

// Policy holds the timing knobs of a binding.
type Policy struct {
	// Debounce is how long after a session's last activity its event batch
	// is written. Zero means once per turn, at its end; a batch is always
	// written at turn end. Negative is an error.
	Debounce time.Duration
	// Restore says what to load at serve start.
	Restore RestorePolicy
}

// RestorePolicy caps what serve loads at start-up. Zero fields take the
// defaults; negative fields are errors.
type RestorePolicy struct {
	// Off restores nothing at start-up: sessions load on demand when a
	// follow-up names them. The caps are then unused.
	Off bool
	// MaxSessions is the most sessions loaded, newest first. Default 1000.
	MaxSessions int
	// MaxAge skips sessions last updated longer ago. Default 30 days.
	MaxAge time.Duration
	// MaxTotalBytes stops loading once this many bytes were read. Default
	// 1 GiB.
	MaxTotalBytes int64
}

// Mode says where a table lives, as GET /v1/info reports it.
type Mode string

// The modes of the eval and A/B tables.
const (
	// ModeNative is a table given in Config.
	ModeNative Mode = "native"
	// ModeDerived is a table stored over the kv core, under the keys of
	// package keys.
	ModeDerived Mode = "derived"
	// ModeMemory is an eval table kept in process memory, because the
	// backend lacks Delete or List: eval history is lost on restart.
	ModeMemory Mode = "memory"
)

// Errors matched with errors.Is.
var (
	// ErrNoCAS means a feature that coordinates hosts serving one session
	// at the same time (serving mode ledger, package ledger) was asked of a
	// backend without the full CAS group, or without Get and Delete.
	ErrNoCAS = errors.New("storage: the backend cannot coordinate hosts")
	// ErrSplitCAS means the CAS group and the plain methods do not sit on
	// the same durable store: one of them keeps its data in process memory,
	// or the start-up probe (ProbeCoordination) found that a key written
	// through one cannot be read through the other.
	ErrSplitCAS = errors.New("storage: the CAS group and the plain methods are on different stores")
	// ErrNewerFormat means a stored record has a format version this build
	// does not read: upgrade agentkit (record.ErrNewerFormat).
	ErrNewerFormat = record.ErrNewerFormat
	// ErrBadRecord means a stored record is not one this package writes
	// (record.ErrBadRecord).
	ErrBadRecord = record.ErrBadRecord
)

// Binding is the runtime's view of one backend. It is safe for concurrent
// use.
type Binding struct {
	name    string
	db      *kv.DB
	caps    kv.Capabilities
	policy  Policy
	log     *slog.Logger
	dropped atomic.Uint64

	evals     EvalTable
	evalsMode Mode
	abs       ABTable
	absMode   Mode
	snaps     ABSnapshotter
	snapsMode Mode
}

// Define validates cfg and binds its backend. It fails, naming what to
// change, when the backend is nil or has no Put, when its CAS group is
// partial, when a native table is a nil pointer, or when a policy value is
// negative; every problem found is reported at once.
func Define(cfg Config) (*Binding, error) {
	var errs []error
	var caps kv.Capabilities
	switch {
	case cfg.Backend == nil:
		errs = append(errs, errors.New(`storage: Config.Backend is nil; set it to a store, e.g. one from kv.Open(ctx, "sqlite:/var/lib/agentkit/kv.db"), a kv.Funcs, or any value with a Put(ctx, key, value) error method`))
	case isNilPointer(cfg.Backend):
		// Checked first: its methods (Capabilities included) would panic.
		errs = append(errs, fmt.Errorf("storage: Config.Backend is a nil %T; pass an opened store", cfg.Backend))
	default:
		if caps = kv.Discover(cfg.Backend); !caps.Put {
			errs = append(errs, noPutError(cfg.Backend))
		}
	}
	if len(caps.MissingCAS) > 0 {
		errs = append(errs, partialCASError(cfg.Backend, caps.MissingCAS))
	}
	if cfg.Evals != nil && isNilPointer(cfg.Evals) {
		errs = append(errs, fmt.Errorf("storage: Config.Evals is a nil %T; pass a usable table, or leave Config.Evals unset for the derived one", cfg.Evals))
	}
	if cfg.ABs != nil && isNilPointer(cfg.ABs) {
		errs = append(errs, fmt.Errorf("storage: Config.ABs is a nil %T; pass a usable table, or leave Config.ABs unset for the derived one", cfg.ABs))
	}
	errs = append(errs, cfg.Policy.check()...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	name := cfg.Name
	if name == "" {
		name = "custom"
		if d, ok := cfg.Backend.(*kv.DB); ok {
			name = d.Name()
		}
	}
	db, err := kv.New(name, cfg.Backend)
	if err != nil {
		// Unreachable after the checks above, which test what kv.New does.
		return nil, fmt.Errorf("storage: Config.Backend: %w", err)
	}
	db = db.WithObserver(cfg.Observer)
	b := &Binding{
		name:   name,
		db:     db,
		caps:   db.Capabilities(),
		policy: cfg.Policy.withDefaults(),
		log:    cfg.Logger,
	}
	if b.log == nil {
		b.log = slog.Default()
	}

	switch {
	case cfg.Evals != nil:
		b.evals, b.evalsMode = cfg.Evals, ModeNative
	case b.caps.Delete && b.caps.List:
		b.evals, b.evalsMode = derivedEvals{db}, ModeDerived
	default:
		b.evals, b.evalsMode = newMemoryEvals(), ModeMemory
		b.log.Warn("storage: eval history is kept in process memory and lost on restart; the derived eval table needs Delete and List, or set Config.Evals",
			slog.String("store", name), slog.String("capabilities", b.caps.String()))
	}
	derivedAB := derivedABs{db}
	b.abs, b.absMode = derivedAB, ModeDerived
	b.snaps, b.snapsMode = derivedAB, ModeDerived
	if cfg.ABs != nil {
		b.abs, b.absMode = cfg.ABs, ModeNative
		if s, ok := cfg.ABs.(ABSnapshotter); ok {
			b.snaps, b.snapsMode = s, ModeNative
		}
	}
	return b, nil
}

// isNilPointer reports whether v is a typed nil (pointer, map, func…),
// whose methods would panic.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Interface, reflect.Slice, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

func noPutError(backend any) error {
	switch backend.(type) {
	case kv.Funcs, *kv.Funcs:
		return errors.New("storage: Config.Backend is a kv.Funcs whose Put field is nil; set Put: every write goes through it")
	}
	return fmt.Errorf("storage: Config.Backend (%T) has no Put method; add Put(ctx context.Context, key string, value []byte) error, or wrap the client in a kv.Funcs", backend)
}

func partialCASError(backend any, missing []string) error {
	what := "methods"
	switch backend.(type) {
	case kv.Funcs, *kv.Funcs:
		what = "fields of kv.Funcs.CAS"
	}
	return fmt.Errorf("storage: Config.Backend has a partial CAS group: missing %s; set all four %s (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys) to use compare-and-set (session heads, reminder claims), or none to run without them",
		strings.Join(missing, ", "), what)
}

// check reports every negative value, naming its field.
func (p Policy) check() []error {
	var errs []error
	if p.Debounce < 0 {
		errs = append(errs, fmt.Errorf("storage: Policy.Debounce is %v; use 0 to write once per turn, or a positive duration", p.Debounce))
	}
	r := p.Restore
	if r.MaxSessions < 0 {
		errs = append(errs, fmt.Errorf("storage: Policy.Restore.MaxSessions is %d; use 0 for the default (%d) or a positive count, or set Restore.Off", r.MaxSessions, DefaultRestoreMaxSessions))
	}
	if r.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("storage: Policy.Restore.MaxAge is %v; use 0 for the default (30 days) or a positive duration", r.MaxAge))
	}
	if r.MaxTotalBytes < 0 {
		errs = append(errs, fmt.Errorf("storage: Policy.Restore.MaxTotalBytes is %d; use 0 for the default (1 GiB) or a positive size", r.MaxTotalBytes))
	}
	return errs
}

func (p Policy) withDefaults() Policy {
	r := &p.Restore
	if r.MaxSessions == 0 {
		r.MaxSessions = DefaultRestoreMaxSessions
	}
	if r.MaxAge == 0 {
		r.MaxAge = DefaultRestoreMaxAge
	}
	if r.MaxTotalBytes == 0 {
		r.MaxTotalBytes = DefaultRestoreMaxTotalBytes
	}
	return p
}

// Name returns the store's label.
func (b *Binding) Name() string { return b.name }

// DB returns the portable handle to the backend (observed, when
// Config.Observer is set), for programs' own keys and for components that
// namespace their keys themselves. Its Backend method returns the driver
// value, for driver methods such as pgkv's Drop.
func (b *Binding) DB() *kv.DB { return b.db }

// Capabilities reports what the backend provides.
func (b *Binding) Capabilities() kv.Capabilities { return b.caps }

// Policy returns the policy with defaults filled in.
func (b *Binding) Policy() Policy { return b.policy }

// RestoreAtStart reports whether serve loads sessions at start-up: restore
// is not Off and the backend has Get and List.
func (b *Binding) RestoreAtStart() bool {
	return !b.policy.Restore.Off && b.caps.Get && b.caps.List
}

// drop logs and counts a dropped A/B sample.
func (b *Binding) drop(ctx context.Context, key string, err error) {
	n := b.dropped.Add(1)
	shown := keys.Redact(key)
	b.log.LogAttrs(ctx, slog.LevelWarn, "storage: A/B sample dropped",
		slog.String("store", b.name), slog.String("key", shown),
		slog.String("err", strings.ReplaceAll(err.Error(), key, shown)), slog.Uint64("dropped_total", n))
}

// DroppedMirrorWrites returns how many A/B samples (ABs.PutSample) failed
// and were dropped since Define: the only records written at most once.
func (b *Binding) DroppedMirrorWrites() uint64 { return b.dropped.Load() }

// Report is the capability report GET /v1/info includes as "storage".
type Report struct {
	// Name is the store's label.
	Name string `json:"name"`
	// Put is true when the backend has Put (always, for a valid binding).
	Put bool `json:"put"`
	// Get is true when the backend has Get.
	Get bool `json:"get"`
	// Delete is true when the backend has Delete.
	Delete bool `json:"delete"`
	// List is true when the backend has List.
	List bool `json:"list"`
	// CAS is true when the backend has the whole CAS group.
	CAS bool `json:"cas"`
	// ProcessLocal is true when the data lives in this process only (the
	// memory driver): everything is lost on restart.
	ProcessLocal bool `json:"processLocal"`
	// Evals is where eval history lives: native, derived or memory.
	Evals Mode `json:"evals"`
	// ABs is where A/B samples go: native or derived.
	ABs Mode `json:"abs"`
	// ABSnapshot is where the A/B snapshot lives: native when the native
	// A/B table has PutSnapshot and GetSnapshot, derived otherwise.
	ABSnapshot Mode `json:"abSnapshot"`
	// DebounceMs is Policy.Debounce in milliseconds; 0 is once per turn.
	DebounceMs int64 `json:"debounceMs"`
	// Restore is the restore policy.
	Restore RestoreReport `json:"restore"`
}

// RestoreReport is the restore policy as Report shows it.
type RestoreReport struct {
	// Off is RestorePolicy.Off.
	Off bool `json:"off"`
	// AtStart is true when serve restores at start-up: not Off, and the
	// backend has Get and List.
	AtStart bool `json:"atStart"`
	// MaxSessions is RestorePolicy.MaxSessions, defaulted.
	MaxSessions int `json:"maxSessions"`
	// MaxAgeMs is RestorePolicy.MaxAge in milliseconds, defaulted.
	MaxAgeMs int64 `json:"maxAgeMs"`
	// MaxTotalBytes is RestorePolicy.MaxTotalBytes, defaulted.
	MaxTotalBytes int64 `json:"maxTotalBytes"`
}

// Report returns the capability report.
func (b *Binding) Report() Report {
	r := b.policy.Restore
	return Report{
		Name:         b.name,
		Put:          b.caps.Put,
		Get:          b.caps.Get,
		Delete:       b.caps.Delete,
		List:         b.caps.List,
		CAS:          b.caps.CAS,
		ProcessLocal: b.caps.ProcessLocal,
		Evals:        b.evalsMode,
		ABs:          b.absMode,
		ABSnapshot:   b.snapsMode,
		DebounceMs:   b.policy.Debounce.Milliseconds(),
		Restore: RestoreReport{
			Off:           r.Off,
			AtStart:       b.RestoreAtStart(),
			MaxSessions:   r.MaxSessions,
			MaxAgeMs:      r.MaxAge.Milliseconds(),
			MaxTotalBytes: r.MaxTotalBytes,
		},
	}
}

// AgentStore is a binding seen from one agent: its keys, its eval runs, its
// A/B table and its host KV.
type AgentStore struct {
	b    *Binding
	keys keys.Scope
}

// Agent returns the binding's view for the agent named name. An empty name
// is an error.
func (b *Binding) Agent(name string) (*AgentStore, error) {
	k, err := keys.Agent(name)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return &AgentStore{b: b, keys: k}, nil
}

// Name returns the agent's name.
func (a *AgentStore) Name() string { return a.keys.Name() }

// Keys returns the agent's key scope.
func (a *AgentStore) Keys() keys.Scope { return a.keys }

// Binding returns the binding a belongs to.
func (a *AgentStore) Binding() *Binding { return a.b }

// Evals returns the agent's eval-run table.
func (a *AgentStore) Evals() *EvalRuns { return &EvalRuns{a: a} }

// ABs returns the agent's A/B table.
func (a *AgentStore) ABs() *ABs { return &ABs{a: a} }

// KV returns the agent's host KV.
func (a *AgentStore) KV() *HostKV { return &HostKV{a: a} }
