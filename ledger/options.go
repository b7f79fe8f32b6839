package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"agentkit/kv"
	"agentkit/storage"
)

// Defaults of Options.
const (
	DefaultLease           = 10 * time.Second
	DefaultDriftAllowance  = 0.1
	DefaultMaxAttempts     = 5
	DefaultMaxPending      = 256
	DefaultMaxPendingBytes = 8 << 20
	DefaultMaxEventBytes   = 256 << 10
	DefaultInlineLimit     = 4 << 10
	DefaultMaxInlineBytes  = 32 << 10
	DefaultTurnInlineLimit = 16 << 10
	DefaultDedupWindow     = 64
	DefaultRetryAfter      = 2 * time.Second
	DefaultTakeoverRate    = 20 // per second
	DefaultFollowInterval  = 500 * time.Millisecond
	DefaultSweepEvery      = 10 * time.Minute
	// DefaultIdempotencyWindow is how long a keyed event's id is kept
	// after it leaves the de-duplication window, as payment APIs keep
	// their idempotency keys.
	DefaultIdempotencyWindow = 24 * time.Hour
	DefaultClockSkew         = 5 * time.Minute
	DefaultMaxKeys           = 10000
	// MaxEventIDBytes bounds an event id (a client's Idempotency-Key).
	MaxEventIDBytes = 256
)

// Handler runs one turn: it consumes t.Event, and calls t.Commit with the
// turn's output. ctx is the turn's fencing-aware context: it ends when the
// lease is lost or when the holder must stop starting side effects
// (context.Cause is then ErrFenced or ErrSelfFenced). A Handler returning
// an error, or returning without a successful Commit, is a failed attempt:
// the event is tried again, and after MaxAttempts attempts it goes to the
// dead-letter store. An error wrapped with Permanent sends the event there
// after this attempt.
type Handler func(ctx context.Context, t *Turn) error

// Tuning is the part of Options an operator sets (agentkit.yaml's
// ledger: block, agent.LedgerOptions): the lease, the inbox limits and
// the janitor's pace. Settings reports it with the defaults filled in.
type Tuning struct {
	// Lease is how long a holder's lease lasts without renewal. The holder
	// renews every Lease/3 (every write it makes counts), during long
	// turns too. Zero means DefaultLease.
	Lease time.Duration
	// Margin is added to Lease before a contender takes a silent session
	// over; zero means Lease/5.
	Margin time.Duration
	// DriftAllowance is the fraction of Lease the holder gives up to clock
	// rate differences: it starts no new side effect once
	// Lease × (1 − DriftAllowance) has passed since it sent its last
	// successful renewal. Zero means DefaultDriftAllowance; it must be
	// below 1.
	DriftAllowance float64
	// MaxAttempts is how many turns may start on one event before it goes
	// to the dead-letter store. Zero means DefaultMaxAttempts.
	MaxAttempts int
	// MaxPending and MaxPendingBytes cap a session's inbox by count and by
	// payload bytes; a delivery past either is refused with a BusyError.
	// Zero means DefaultMaxPending and DefaultMaxPendingBytes.
	MaxPending      int
	MaxPendingBytes int64
	// MaxEventBytes bounds one event's payload; zero means
	// DefaultMaxEventBytes.
	MaxEventBytes int
	// DedupWindow is how many consumed event ids each session remembers:
	// a delivery repeating one of them, or a pending one, is a duplicate.
	// Zero means DefaultDedupWindow.
	DedupWindow int
	// RetryAfter is the wait a BusyError suggests; zero means
	// DefaultRetryAfter.
	RetryAfter time.Duration
	// JanitorInterval is the mean pause between janitor scans (each pause
	// is drawn uniformly from half to one and a half times it); zero means
	// Lease/2.
	JanitorInterval time.Duration
	// FollowInterval is how often Follow and Await re-read a session this
	// host does not hold; zero means DefaultFollowInterval.
	FollowInterval time.Duration
	// IdempotencyWindow is how long the id of a keyed event (Event.Keyed:
	// a client's Idempotency-Key, a reminder's id) is kept once it has
	// left the last DedupWindow consumed ids, so that a retry is still a
	// duplicate: the holder writes the id's kept key before the write
	// that evicts it, and the janitor deletes it once IdempotencyWindow +
	// ClockSkew have passed on its own wall clock. Zero means
	// DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// ClockSkew is the most the hosts' wall clocks may differ by; kept
	// keys live that much longer, so a host whose clock runs ahead does
	// not forget one early. Zero means DefaultClockSkew.
	ClockSkew time.Duration
	// MaxKeys caps the kept keys of a session: a keyed delivery to a
	// session keeping MaxKeys of them is refused with a BusyError until
	// the oldest expire (ids still in the inbox or among the last
	// DedupWindow are not counted). Zero means DefaultMaxKeys.
	MaxKeys int
}

// Options configures a Ledger. Store and Agent are required, and Handler
// unless Passive is set.
type Options struct {
	// Store is the coordination store: the agent's store or an explicit
	// override. It needs the CAS group and Get and Delete (CheckStore).
	Store *kv.DB
	// Agent is the agent name; every key is under
	// agentkit/v1/{Agent}/durable-session/.
	Agent string
	// Handler runs turns.
	Handler Handler
	// HostID names this host in control records; empty means the host name
	// and a random suffix, new for every Ledger.
	HostID string
	// Tuning is the lease, inbox and janitor settings; zero fields take
	// the defaults.
	Tuning
	// InlineLimit is the largest payload kept inside the control record;
	// larger ones go to a blob. MaxInlineBytes bounds the inline payloads
	// of one control record. Zero means the defaults; a negative
	// InlineLimit puts every payload in a blob.
	InlineLimit    int
	MaxInlineBytes int
	// TurnInlineLimit is the largest turn output carried in the control
	// record between its commit and its flush; a larger one is written
	// under its own key before the commit. Zero means
	// DefaultTurnInlineLimit.
	TurnInlineLimit int
	// TakeoverRate caps the sessions the janitor takes over or sweeps per
	// second; zero means DefaultTakeoverRate.
	TakeoverRate float64
	// SweepEvery is how often the janitor sweeps an idle session's orphan
	// blobs at most; zero means DefaultSweepEvery.
	SweepEvery time.Duration
	// Swept, when set, is called by the janitor after it swept an idle
	// session (at most every SweepEvery for a session, and only after
	// turns were committed since its last sweep), with the session as the
	// sweep left it: a hook for the caller's own upkeep of what it keeps
	// beside the session, such as an index entry whose write was lost.
	// It runs in the janitor's loop: keep it short.
	Swept func(ctx context.Context, s SessionInfo)
	// RetryDelay is the wait after a failed attempt, doubling per attempt
	// up to Lease; zero means Lease/20.
	RetryDelay time.Duration
	// Passive makes a Ledger that never holds a session: its deliveries
	// and replays leave the lease to the other hosts, whose janitors take a
	// session with events and no holder at their next scan. For tools that
	// do not serve turns (a command that replays dead letters).
	Passive bool
	// AllowProcessLocal accepts a store that keeps its data in this process
	// (the memory driver), for tests. Such a store cannot coordinate hosts,
	// and acknowledged events vanish with the process.
	AllowProcessLocal bool
	// Logger receives store errors and takeovers; nil means
	// slog.Default().
	Logger *slog.Logger
	// OnDeliver, when set, is called as every Deliver call returns, with
	// its answer, how long the call took and its error: the ack latency
	// when err is nil (a duplicate included), a refusal or a failure
	// otherwise. It runs on the caller's goroutine and must be quick; a
	// server feeds it to a latency histogram.
	OnDeliver func(d Delivery, took time.Duration, err error)

	// test holds test-only fault switches and hooks.
	test testHooks
}

// testHooks are what the package's tests inject: a watcher of the
// protocol's named steps, and the holder's rules (nil: the real ones).
// Production ledgers have neither.
type testHooks struct {
	// step is called at each named protocol step; a simulation crashes
	// hosts there.
	step func(name string)
	// rules replaces the holder's rules with a deliberately broken variant
	// (simulation_test.go), to show that the simulation's checker catches
	// it.
	rules rules
	// now is this host's wall clock (nil: time.Now), which the kept keys'
	// times are written and expired by; a simulation sets the hosts'
	// clocks apart.
	now func() time.Time
}

// CheckStore is the start-up check of ledger mode on a coordination store,
// storage.CheckCoordination's checks and then one of its own: it refuses,
// naming the CAS group, a store without the full group or without Get and
// Delete, and, with an error matching storage.ErrSplitCAS, one whose CAS
// group and plain methods are not one store (the CAS group in process
// memory beside durable plain methods, or the reverse, or the start-up
// probe's key written through one half not found through the other; see
// storage.ProbeCoordination, which waits at most storage.ProbeTimeout); and
// the memory driver unless allowProcessLocal is set (tests).
func CheckStore(store *kv.DB, allowProcessLocal bool) error {
	if store == nil {
		return fmt.Errorf("%w: the coordination store is nil", storage.ErrNoCAS)
	}
	if err := storage.CheckCoordination(store); err != nil {
		return err
	}
	if store.ProcessLocal() && !allowProcessLocal {
		return fmt.Errorf("%w: store %q is the memory driver; ledger mode coordinates several hosts and must survive restarts, "+
			"so it needs a shared durable store (postgres://, redis://, nats://, sqlite: on one machine). The memory store is for tests",
			ErrMemoryStore, store.Name())
	}
	return nil
}

// withDefaults validates opts and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Handler == nil && !o.Passive {
		return o, errors.New("ledger: Options.Handler is nil; pass the function that runs a turn (or set Passive for a ledger that serves no turns)")
	}
	if o.Agent == "" {
		return o, errors.New("ledger: Options.Agent is empty; name the agent whose sessions the ledger serves")
	}
	if err := CheckStore(o.Store, o.AllowProcessLocal); err != nil {
		return o, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&o.Lease, DefaultLease)
	def(&o.Margin, o.Lease/5)
	def(&o.RetryAfter, DefaultRetryAfter)
	def(&o.JanitorInterval, o.Lease/2)
	def(&o.SweepEvery, DefaultSweepEvery)
	def(&o.FollowInterval, DefaultFollowInterval)
	def(&o.RetryDelay, o.Lease/20)
	def(&o.IdempotencyWindow, DefaultIdempotencyWindow)
	def(&o.ClockSkew, DefaultClockSkew)
	if o.DriftAllowance == 0 {
		o.DriftAllowance = DefaultDriftAllowance
	}
	if o.DriftAllowance < 0 || o.DriftAllowance >= 1 {
		return o, fmt.Errorf("ledger: Options.DriftAllowance is %v; use a fraction from 0 up to (not including) 1, such as 0.1", o.DriftAllowance)
	}
	defInt(&o.MaxAttempts, DefaultMaxAttempts)
	defInt(&o.MaxPending, DefaultMaxPending)
	if o.MaxPendingBytes == 0 {
		o.MaxPendingBytes = DefaultMaxPendingBytes
	}
	defInt(&o.MaxEventBytes, DefaultMaxEventBytes)
	defInt(&o.InlineLimit, DefaultInlineLimit)
	defInt(&o.MaxInlineBytes, DefaultMaxInlineBytes)
	defInt(&o.TurnInlineLimit, DefaultTurnInlineLimit)
	defInt(&o.DedupWindow, DefaultDedupWindow)
	defInt(&o.MaxKeys, DefaultMaxKeys)
	if o.TakeoverRate <= 0 {
		o.TakeoverRate = DefaultTakeoverRate
	}
	for _, c := range []struct {
		name string
		v    int64
	}{{"MaxAttempts", int64(o.MaxAttempts)}, {"MaxPending", int64(o.MaxPending)}, {"MaxPendingBytes", o.MaxPendingBytes},
		{"MaxEventBytes", int64(o.MaxEventBytes)}, {"DedupWindow", int64(o.DedupWindow)}, {"MaxInlineBytes", int64(o.MaxInlineBytes)}, {"TurnInlineLimit", int64(o.TurnInlineLimit)},
		{"MaxKeys", int64(o.MaxKeys)}} {
		if c.v < 0 {
			return o, fmt.Errorf("ledger: Options.%s is %d; use a positive number, or 0 for the default", c.name, c.v)
		}
	}
	if o.HostID == "" {
		o.HostID = defaultHostID()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

func defaultHostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "host"
	}
	return h + "-" + randomHex(4)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
