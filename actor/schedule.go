package actor

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"agentkit/actor/mergepatch"
	"agentkit/keys"
)

// Kinds of scheduled tasks.
const (
	KindAt    = "at"    // at a time
	KindDelay = "delay" // after a delay
	KindCron  = "cron"  // on a cron expression, again and again
)

// When says when a task runs: build it with At, After or Cron.
type When struct {
	kind  string
	at    time.Time
	delay time.Duration
	cron  string
}

// At runs a task once at t (at once if t is past).
func At(t time.Time) When { return When{kind: KindAt, at: t} }

// After runs a task once, d from now.
func After(d time.Duration) When { return When{kind: KindDelay, delay: d} }

// Cron runs a task at every time the cron expression names: five fields
// (minute, hour, day of month, month, day of week) or a descriptor such as
// @hourly, @daily or @every 1h30m, in UTC unless the expression starts
// with CRON_TZ=Zone. A run missed while no Host ran happens once, late;
// the next is the expression's first time after that run.
func Cron(expr string) When { return When{kind: KindCron, cron: expr} }

// Task is a scheduled task of an actor.
type Task struct {
	ID      string          `json:"id"`
	Class   string          `json:"class"`
	Actor   string          `json:"actor"`
	Handler string          `json:"handler"`
	Payload json.RawMessage `json:"payload"`
	Kind    string          `json:"kind"`
	Cron    string          `json:"cron,omitempty"`
	// Due is the next run's time.
	Due     time.Time `json:"due"`
	Created time.Time `json:"created"`
	// Attempts counts the runs of the current occurrence that started.
	Attempts int `json:"attempts"`
	// Failed is set once a one-off task has failed MaxAttempts times; it
	// no longer runs and stays listed until cancelled.
	Failed    bool   `json:"failed,omitempty"`
	LastError string `json:"lastError,omitempty"`
}

// HandlerFunc runs a due task of the actor r. A nil error ends a one-off
// task (a cron task moves to its next time); an error runs it again after
// Options.RetryDelay, doubling, up to Options.MaxAttempts runs. ctx ends
// when Run's does.
type HandlerFunc func(ctx context.Context, r *Ref, t Task) error

// Handle registers the handler named name, which tasks name. It panics on
// an empty name, a nil fn or a name registered twice, as these are
// programming errors.
func (h *Host) Handle(name string, fn HandlerFunc) {
	if name == "" || fn == nil {
		panic("actor: Handle needs a name and a function")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.handlers[name]; ok {
		panic("actor: handler " + name + " registered twice")
	}
	h.handlers[name] = fn
}

func parseCron(expr string) (cron.Schedule, error) {
	s, err := cron.ParseStandard(expr)
	if err != nil {
		return nil, fmt.Errorf("actor: cron expression %q: %v; write five fields (minute hour day-of-month month day-of-week), or @hourly, @daily, @every 1h30m", expr, err)
	}
	return s, nil
}

// normTime drops the monotonic reading and sub-nanosecond state, so a time
// equals what the database gives back.
func normTime(t time.Time) time.Time { return time.Unix(0, t.UnixNano()).UTC() }

// Schedule adds a task that calls the handler named handler with payload
// (encoded as JSON; a []byte or json.RawMessage is taken as JSON text) at
// the time w says. The task is durable when Schedule returns: it survives
// restarts and runs late if no Host ran at its time. Host.Run runs it.
func (r *Ref) Schedule(ctx context.Context, w When, handler string, payload any) (Task, error) {
	if handler == "" {
		return Task{}, errors.New("actor: Schedule needs the name of a handler")
	}
	p, err := encodePayload(payload)
	if err != nil {
		return Task{}, err
	}
	now := time.Now()
	t := Task{ID: newTaskID(), Class: r.class, Actor: r.id, Handler: handler, Payload: p, Kind: w.kind, Created: normTime(now)}
	switch w.kind {
	case KindAt:
		if w.at.IsZero() {
			return Task{}, errors.New("actor: At needs a time")
		}
		t.Due = w.at
	case KindDelay:
		if w.delay < 0 {
			return Task{}, fmt.Errorf("actor: After(%v): the delay is negative", w.delay)
		}
		t.Due = now.Add(w.delay)
	case KindCron:
		s, err := parseCron(w.cron)
		if err != nil {
			return Task{}, err
		}
		t.Cron = w.cron
		if t.Due = s.Next(now); t.Due.IsZero() {
			return Task{}, fmt.Errorf("actor: cron expression %q names no time to come", w.cron)
		}
	default:
		return Task{}, errors.New("actor: Schedule needs a When from At, After or Cron")
	}
	t.Due = normTime(t.Due)
	e, err := r.acquireWrite(ctx)
	if err != nil {
		return Task{}, err
	}
	defer r.h.pool.release(e)
	e.mu.Lock()
	defer e.mu.Unlock()
	// The index first: a crash between the two leaves an index entry with
	// no task (harmless) rather than a task nothing wakes.
	if err := r.h.indexAdd(ctx, r.class, r.id, t.Due); err != nil {
		return Task{}, err
	}
	if err := inTx(ctx, e.db, func(tx *sql.Tx) error { return insertTask(ctx, tx, t) }); err != nil {
		return Task{}, err
	}
	return t, nil
}

func encodePayload(payload any) (json.RawMessage, error) {
	var b []byte
	switch p := payload.(type) {
	case []byte:
		b = p
	case json.RawMessage:
		b = p
	default:
		var err error
		if b, err = json.Marshal(payload); err != nil {
			return nil, fmt.Errorf("actor: the task's payload does not encode as JSON: %w", err)
		}
	}
	if len(b) == 0 {
		b = []byte("null")
	}
	c, err := mergepatch.Compact(b, "payload")
	if err != nil {
		return nil, fmt.Errorf("actor: %w", err)
	}
	return c, nil
}

func newTaskID() string {
	var b [10]byte
	rand.Read(b[:])
	return "task_" + hex.EncodeToString(b[:])
}

func insertTask(ctx context.Context, tx *sql.Tx, t Task) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO schedules (id, handler, payload, kind, cron, due, created_at, attempts, failed, last_error)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, t.Handler, []byte(t.Payload), t.Kind, t.Cron, t.Due.UnixNano(), t.Created.UnixNano(), t.Attempts, t.Failed, t.LastError)
	if err != nil {
		return fmt.Errorf("actor: storing task %s: %w", t.ID, err)
	}
	return nil
}

const taskColumns = `id, handler, payload, kind, cron, due, created_at, attempts, failed, last_error`

func (r *Ref) scanTasks(rows *sql.Rows) ([]Task, error) {
	defer rows.Close()
	var ts []Task
	for rows.Next() {
		t := Task{Class: r.class, Actor: r.id}
		var due, created int64
		var payload []byte
		if err := rows.Scan(&t.ID, &t.Handler, &payload, &t.Kind, &t.Cron, &due, &created, &t.Attempts, &t.Failed, &t.LastError); err != nil {
			return nil, fmt.Errorf("actor: reading tasks: %w", err)
		}
		t.Payload = payload
		t.Due, t.Created = time.Unix(0, due).UTC(), time.Unix(0, created).UTC()
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("actor: reading tasks: %w", err)
	}
	return ts, nil
}

// Schedules lists the actor's tasks, soonest first.
func (r *Ref) Schedules(ctx context.Context) ([]Task, error) {
	var ts []Task
	found, err := r.read(ctx, func(db *sql.DB) error {
		rows, err := db.QueryContext(ctx, `SELECT `+taskColumns+` FROM schedules ORDER BY due, id`)
		if err != nil {
			return fmt.Errorf("actor: reading tasks: %w", err)
		}
		ts, err = r.scanTasks(rows)
		return err
	})
	if err != nil || found || !r.legacy() {
		return ts, err
	}
	return r.legacyTasks(ctx)
}

// CancelSchedule removes the task id. A missing task is ErrNotFound.
func (r *Ref) CancelSchedule(ctx context.Context, id string) error {
	if !r.HasDatabase() && !r.legacy() {
		return fmt.Errorf("%w: no task %q on %s/%s", ErrNotFound, id, r.class, r.id)
	}
	return r.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM schedules WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("actor: cancelling task %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: no task %q on %s/%s", ErrNotFound, id, r.class, r.id)
		}
		return nil
	})
}

// index is the host's schedule index (actors/schedules.db): for each actor
// with tasks, a time no later than its next task's. Run reads it to know
// when to wake and whom, without opening every actor's database.
type index struct{ db *sql.DB }

// openIndex returns the index, creating it when create is set; nil when
// it does not exist and create is not set.
func (h *Host) openIndex(ctx context.Context, create bool) (*index, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if h.index != nil {
		return h.index, nil
	}
	path := filepath.Join(h.opts.Dir, indexFile)
	if _, err := os.Stat(path); err != nil && !create {
		return nil, nil
	}
	if err := touch0600(path); err != nil { // creates it, or tightens it
		return nil, err
	}
	// secure_delete: the entry of a deleted actor, which names it, is
	// zeroed rather than left in a free page.
	db, err := sql.Open("sqlite", dsn(path, "rw", "WAL", h.sync, true, "secure_delete(ON)"))
	if err != nil {
		return nil, fmt.Errorf("actor: opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetConnMaxIdleTime(0)
	var format int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&format); err != nil {
		db.Close()
		return nil, fmt.Errorf("actor: opening %s: %w", path, err)
	}
	if format > Format {
		db.Close()
		return nil, &NewerFormatError{Path: path, Format: format}
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS due (
			class TEXT NOT NULL,
			actor TEXT NOT NULL,
			at    INTEGER NOT NULL,
			PRIMARY KEY (class, actor)
		) WITHOUT ROWID;
		CREATE INDEX IF NOT EXISTS due_by_at ON due (at);
		PRAGMA user_version = `+fmt.Sprint(Format))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("actor: preparing %s: %w", path, err)
	}
	h.index = &index{db: db}
	return h.index, nil
}

// indexAdd records that the actor has a task due at (keeping an earlier
// time already recorded) and wakes Run.
func (h *Host) indexAdd(ctx context.Context, class, id string, at time.Time) error {
	idx, err := h.openIndex(ctx, true)
	if err != nil {
		return err
	}
	_, err = idx.db.ExecContext(ctx, `INSERT INTO due (class, actor, at) VALUES (?, ?, ?)
		ON CONFLICT (class, actor) DO UPDATE SET at = min(at, excluded.at)`, class, id, at.UnixNano())
	if err != nil {
		return fmt.Errorf("actor: recording the task in the schedule index: %w", err)
	}
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return nil
}

// indexSet records the actor's next due time, or removes it (ok false).
func (h *Host) indexSet(ctx context.Context, class, id string, at time.Time, ok bool) error {
	idx, err := h.openIndex(ctx, true)
	if err != nil {
		return err
	}
	if ok {
		_, err = idx.db.ExecContext(ctx, `INSERT INTO due (class, actor, at) VALUES (?, ?, ?)
			ON CONFLICT (class, actor) DO UPDATE SET at = excluded.at`, class, id, at.UnixNano())
	} else {
		_, err = idx.db.ExecContext(ctx, `DELETE FROM due WHERE class = ? AND actor = ?`, class, id)
	}
	if err != nil {
		return fmt.Errorf("actor: updating the schedule index: %w", err)
	}
	return nil
}

type dueActor struct {
	class, id string
	at        time.Time
}

// indexFirst returns the index's first n entries, soonest first.
func (h *Host) indexFirst(ctx context.Context, n int) ([]dueActor, error) {
	idx, err := h.openIndex(ctx, false)
	if err != nil || idx == nil {
		return nil, err
	}
	rows, err := idx.db.QueryContext(ctx, `SELECT class, actor, at FROM due ORDER BY at LIMIT ?`, n)
	if err != nil {
		return nil, fmt.Errorf("actor: reading the schedule index: %w", err)
	}
	defer rows.Close()
	var out []dueActor
	for rows.Next() {
		var d dueActor
		var at int64
		if err := rows.Scan(&d.class, &d.id, &at); err != nil {
			return nil, fmt.Errorf("actor: reading the schedule index: %w", err)
		}
		d.at = time.Unix(0, at)
		out = append(out, d)
	}
	return out, rows.Err()
}

// storeRetry is how long Run leaves an actor alone after an error reading
// or updating its tasks.
const storeRetry = 10 * time.Second

// Run runs due tasks until ctx ends, then waits for the runs in progress
// and returns nil. Tasks whose time passed while no Host ran run at once,
// each once. With a Store, it first finds the tasks of actors still in the
// key-value layout; running one migrates its actor. Call Run once per
// Host.
func (h *Host) Run(ctx context.Context) error {
	if err := h.ScanLegacyTasks(ctx); err != nil {
		h.log.Error("actor: finding scheduled tasks in the key-value layout", "err", err)
	}
	sem := make(chan struct{}, h.opts.MaxConcurrent)
	done := make(chan string)
	inflight := map[string]bool{}
	hold := map[string]time.Time{}
	for {
		var wait <-chan time.Time
		now := time.Now()
		first, err := h.indexFirst(ctx, 256+len(inflight)+len(hold))
		if err != nil {
			if ctx.Err() == nil {
				h.log.Error("actor: reading the schedule index", "err", err)
			}
			wait = time.After(storeRetry)
		}
		var timer *time.Timer
		next := time.Time{}
		for _, d := range first {
			k := d.class + "\x00" + d.id
			if inflight[k] {
				continue
			}
			at := d.at
			if hu, ok := hold[k]; ok {
				if hu.After(now) {
					at = hu
				} else {
					delete(hold, k)
				}
			}
			if at.After(now) {
				if next.IsZero() || at.Before(next) {
					next = at
				}
				continue
			}
			if len(sem) == cap(sem) {
				continue // every slot is busy: wait for one
			}
			sem <- struct{}{}
			inflight[k] = true
			go func() {
				if err := h.fireActor(ctx, d.class, d.id); err != nil && ctx.Err() == nil {
					h.log.Error("actor: running scheduled tasks", "class", d.class, "actor", d.id, "err", err)
					k = "!" + k
				}
				<-sem
				done <- k
			}()
		}
		if !next.IsZero() && wait == nil {
			timer = time.NewTimer(next.Sub(now))
			wait = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			for len(inflight) > 0 {
				k := <-done
				delete(inflight, strings.TrimPrefix(k, "!"))
			}
			return nil
		case k := <-done:
			if failed := strings.HasPrefix(k, "!"); failed {
				k = k[1:]
				hold[k] = time.Now().Add(storeRetry)
			}
			delete(inflight, k)
		case <-h.wake:
		case <-wait:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// fireActor runs the actor's due tasks one at a time, then records its
// next due time in the index.
func (h *Host) fireActor(ctx context.Context, class, id string) error {
	h.mu.Lock()
	c := h.classes[class]
	h.mu.Unlock()
	r, err := h.ref(c, class, id)
	if err != nil {
		return err
	}
	if !r.HasDatabase() && !r.legacy() {
		return h.indexSet(ctx, class, id, time.Time{}, false) // a stale entry
	}
	e, err := r.acquireWrite(ctx)
	if err != nil {
		return err
	}
	defer h.pool.release(e)
	rows, err := e.db.QueryContext(ctx, `SELECT `+taskColumns+` FROM schedules WHERE failed = 0 AND due <= ? ORDER BY due, id`, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("actor: reading due tasks: %w", err)
	}
	due, err := r.scanTasks(rows)
	if err != nil {
		return err
	}
	for _, t := range due {
		if ctx.Err() != nil {
			break
		}
		if err := h.runTask(ctx, r, e, t); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var next sql.NullInt64
	if err := e.db.QueryRowContext(ctx, `SELECT min(due) FROM schedules WHERE failed = 0`).Scan(&next); err != nil {
		return fmt.Errorf("actor: reading the next due task: %w", err)
	}
	return h.indexSet(ctx, class, id, time.Unix(0, next.Int64), next.Valid)
}

// runTask claims one run of t (durably counting the attempt), calls its
// handler and records the outcome.
func (h *Host) runTask(ctx context.Context, r *Ref, e *entry, t Task) error {
	// The outcome is recorded even when Run's context ended meanwhile: a
	// run that finished must not run again.
	bg := context.WithoutCancel(ctx)
	exec := func(q string, args ...any) (int64, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		res, err := e.db.ExecContext(bg, q, args...)
		if err != nil {
			return 0, fmt.Errorf("actor: updating task %s: %w", t.ID, err)
		}
		n, _ := res.RowsAffected()
		return n, nil
	}
	if t.Attempts >= h.opts.MaxAttempts {
		// Every allowed run started and none recorded an outcome: the
		// process ended during each.
		return h.taskFailed(exec, t, fmt.Errorf("the process ended during each of %d runs", t.Attempts))
	}
	n, err := exec(`UPDATE schedules SET attempts = attempts + 1 WHERE id = ? AND failed = 0 AND due = ?`, t.ID, t.Due.UnixNano())
	if err != nil || n == 0 {
		return err // cancelled or changed meanwhile
	}
	t.Attempts++
	runErr := h.call(ctx, r, t)
	if runErr != nil && ctx.Err() != nil {
		// Cut short by the end of Run: not the task's fault.
		_, err := exec(`UPDATE schedules SET attempts = attempts - 1 WHERE id = ?`, t.ID)
		return err
	}
	if runErr == nil {
		if t.Kind == KindCron {
			s, err := parseCron(t.Cron)
			if err != nil {
				return h.taskFailed(exec, t, err)
			}
			_, err = exec(`UPDATE schedules SET due = ?, attempts = 0, last_error = '' WHERE id = ?`, normTime(s.Next(time.Now())).UnixNano(), t.ID)
			return err
		}
		_, err := exec(`DELETE FROM schedules WHERE id = ?`, t.ID)
		return err
	}
	h.log.Warn("actor: a scheduled task failed", "class", t.Class, "actor", t.Actor, "task", t.ID, "handler", t.Handler, "attempt", t.Attempts, "err", runErr)
	if t.Attempts >= h.opts.MaxAttempts {
		return h.taskFailed(exec, t, runErr)
	}
	retry := normTime(time.Now().Add(h.opts.RetryDelay << (t.Attempts - 1)))
	_, err = exec(`UPDATE schedules SET due = ?, last_error = ? WHERE id = ?`, retry.UnixNano(), runErr.Error(), t.ID)
	return err
}

// taskFailed ends a task whose runs all failed: a one-off task is marked
// failed (it stays listed); a cron task moves on to its next time.
func (h *Host) taskFailed(exec func(string, ...any) (int64, error), t Task, cause error) error {
	msg := fmt.Sprintf("gave up after %d runs: %v", t.Attempts, cause)
	h.log.Error("actor: a scheduled task failed for good", "class", t.Class, "actor", t.Actor, "task", t.ID, "handler", t.Handler, "err", msg)
	if t.Kind == KindCron {
		if s, err := parseCron(t.Cron); err == nil {
			_, err := exec(`UPDATE schedules SET due = ?, attempts = 0, last_error = ? WHERE id = ?`, normTime(s.Next(time.Now())).UnixNano(), msg, t.ID)
			return err
		}
	}
	_, err := exec(`UPDATE schedules SET failed = 1, last_error = ? WHERE id = ?`, msg, t.ID)
	return err
}

// call runs the task's handler, turning a panic into an error.
func (h *Host) call(ctx context.Context, r *Ref, t Task) (err error) {
	h.mu.Lock()
	fn := h.handlers[t.Handler]
	h.mu.Unlock()
	if fn == nil {
		return fmt.Errorf("no handler named %q; register it with Host.Handle", t.Handler)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the handler panicked: %v", p)
		}
	}()
	return fn(ctx, r, t)
}

// ScanLegacyTasks finds the scheduled tasks of the actors still in the
// key-value layout (one listing of the store) and puts them in the schedule
// index, so they run on time; running one migrates its actor. Run calls it
// when it starts, unless a call has already succeeded: a program that wants
// the listing done (or its error) before it goes on calls it first. Without
// Options.Store it does nothing.
func (h *Host) ScanLegacyTasks(ctx context.Context) error {
	if h.opts.Store == nil || h.scanned.Load() {
		return nil
	}
	if err := h.scanLegacyTasks(ctx); err != nil {
		return err
	}
	h.scanned.Store(true)
	return nil
}

// scanLegacyTasks puts in the index the tasks of actors that are still in
// the key-value layout, so they run (and their actors migrate) on time.
func (h *Host) scanLegacyTasks(ctx context.Context) error {
	prefix := h.scope.ActorsPrefix()
	seen := map[string]bool{}
	for k, err := range h.opts.Store.ListKeys(ctx, prefix) {
		if err != nil {
			return err
		}
		seg, rest, ok := strings.Cut(strings.TrimPrefix(k, prefix), "/")
		if !ok || !strings.HasPrefix(rest, "schedules/") || seen[seg] {
			continue
		}
		seen[seg] = true
		id, err := keys.Unsegment(seg)
		if err != nil {
			h.log.Warn("actor: cannot tell which actor holds a scheduled task in the key-value layout; it runs when its actor is next written", "key", k, "err", err)
			continue
		}
		h.mu.Lock()
		c := h.classes[h.opts.LegacyClass]
		h.mu.Unlock()
		r, err := h.ref(c, h.opts.LegacyClass, id)
		if err != nil || r.HasDatabase() {
			continue
		}
		// Skip actors another host migrates or migrated; this host's own
		// unfinished migration is redone when the task runs.
		if m, _, _, err := r.readMarker(ctx); err != nil || m != nil && (!r.mine(m) || m.State == markerMigrated) {
			continue
		}
		ts, err := r.legacyTasks(ctx)
		if err != nil {
			h.log.Warn("actor: reading scheduled tasks in the key-value layout", "key", k, "err", err)
			continue
		}
		s := snapshot{schedules: ts}
		if due, ok := s.firstDue(); ok {
			if err := h.indexAdd(ctx, r.class, r.id, due); err != nil {
				return err
			}
		}
	}
	return nil
}
