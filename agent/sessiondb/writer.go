package sessiondb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"agentkit/kv/sqlitekv"
)

// maxGroup bounds how many writes one transaction of the writer carries.
const maxGroup = 256

// writer is the database's one writing connection and the goroutine that
// owns it. Every write is a request: a function run inside a transaction
// on that connection. The goroutine takes the first waiting request, adds
// every other one already waiting (up to maxGroup), and runs them in one
// transaction: one commit, one fsync, for all of them (group commit). Each
// request of a group runs inside a savepoint of its own, so one that fails
// is rolled back alone while the others commit. A caller waits until its
// request is committed (or failed); nothing is acknowledged before it is
// on disk.
//
// Writes of this process therefore never wait on each other in SQLite's
// busy handler (which sleeps 1, 2, 5, 10 ... ms between tries): they queue
// here, and a turn waits at most for the commit in progress and its own.
// The busy timeout still applies to other processes writing the file (the
// agentkit kv command on the default store).
type writer struct {
	conn  *sql.Conn
	stmts map[string]*sql.Stmt // prepared on conn; used by the goroutine only
	kv    *sqlitekv.Embedded   // the embedded store on conn (DB.Store), or nil

	mu     sync.RWMutex // guards closed against sends on reqs
	closed bool
	reqs   chan *request
	done   chan struct{}

	commits atomic.Int64 // transactions committed, for tests
}

// request is one write: fn, run in the transaction of its group.
type request struct {
	ctx context.Context
	fn  func(*Tx) error
	err chan error
}

// ErrClosed means the database was closed.
var ErrClosed = errors.New("sessiondb: closed")

func newWriter(conn *sql.Conn) *writer {
	w := &writer{conn: conn, stmts: map[string]*sql.Stmt{}, reqs: make(chan *request, maxGroup), done: make(chan struct{})}
	go w.run()
	return w
}

// do queues fn and waits for its transaction to commit. It returns fn's
// error, or the transaction's. A ctx that ends before the request starts
// cancels it; once started, the request runs to its end (an interrupted
// statement would roll back the whole group).
func (w *writer) do(ctx context.Context, fn func(*Tx) error) error {
	r := &request{ctx: ctx, fn: fn, err: make(chan error, 1)}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return ErrClosed
	}
	w.reqs <- r
	w.mu.RUnlock()
	return <-r.err
}

// close stops the goroutine once the queued requests are done, and closes
// the connection.
func (w *writer) close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.reqs)
	w.mu.Unlock()
	<-w.done
	var errs []error
	if w.kv != nil {
		errs = append(errs, w.kv.Close())
	}
	for _, st := range w.stmts {
		errs = append(errs, st.Close())
	}
	errs = append(errs, w.conn.Close())
	return errors.Join(errs...)
}

func (w *writer) run() {
	defer close(w.done)
	group := make([]*request, 0, maxGroup)
	for r := range w.reqs {
		group = append(group[:0], r)
	more:
		for len(group) < maxGroup {
			select {
			case r, ok := <-w.reqs:
				if !ok {
					break more
				}
				group = append(group, r)
			default:
				break more
			}
		}
		w.commit(group)
	}
}

// commit runs one group in one transaction and answers its requests.
func (w *writer) commit(group []*request) {
	errs := make([]error, len(group))
	live := 0
	for i, r := range group {
		if err := r.ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("sessiondb: %w", err)
			continue
		}
		live++
	}
	if live == 0 {
		answer(group, errs)
		return
	}
	bg := context.Background()
	if _, err := w.conn.ExecContext(bg, "BEGIN IMMEDIATE"); err != nil {
		fail(group, errs, fmt.Errorf("sessiondb: begin: %w", err))
		return
	}
	savepoints := live > 1
	for i, r := range group {
		if errs[i] != nil {
			continue
		}
		errs[i] = w.apply(r, savepoints)
	}
	if _, err := w.conn.ExecContext(bg, "COMMIT"); err != nil {
		_, _ = w.conn.ExecContext(bg, "ROLLBACK")
		fail(group, errs, fmt.Errorf("sessiondb: commit: %w", err))
		return
	}
	w.commits.Add(1)
	answer(group, errs)
}

// apply runs one request, inside a savepoint when the transaction holds
// others, so that its failure rolls back its own writes only. A request
// alone in its transaction needs no savepoint: when it fails, the
// transaction is rolled back and an empty one begun for the commit.
func (w *writer) apply(r *request, savepoint bool) (err error) {
	ctx := context.WithoutCancel(r.ctx)
	if savepoint {
		if _, err := w.conn.ExecContext(ctx, "SAVEPOINT request"); err != nil {
			return fmt.Errorf("sessiondb: %w", err)
		}
	}
	tx := &Tx{ctx: ctx, w: w}
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("sessiondb: a write panicked: %v", p)
			}
		}()
		err = r.fn(tx)
	}()
	if !savepoint {
		if err != nil {
			// The transaction holds this request only: undo it by
			// rolling the transaction back, then open an empty one for
			// the COMMIT that follows.
			_, _ = w.conn.ExecContext(ctx, "ROLLBACK")
			_, _ = w.conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		}
		return wrap(err)
	}
	if err != nil {
		_, _ = w.conn.ExecContext(ctx, "ROLLBACK TO request")
	}
	if _, rerr := w.conn.ExecContext(ctx, "RELEASE request"); rerr != nil && err == nil {
		err = rerr
	}
	return wrap(err)
}

// wrap prefixes an error with the package's name once.
func wrap(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrClosed) {
		return err
	}
	if hasPrefix(err) {
		return err
	}
	return fmt.Errorf("sessiondb: %w", err)
}

func hasPrefix(err error) bool {
	const p = "sessiondb:"
	s := err.Error()
	return len(s) >= len(p) && s[:len(p)] == p
}

func answer(group []*request, errs []error) {
	for i, r := range group {
		r.err <- errs[i]
	}
}

// fail answers every request of a failed transaction: with its own error
// if it had one, else with the transaction's.
func fail(group []*request, errs []error, err error) {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	answer(group, errs)
}

// stmt returns the statement q prepared on the writer's connection,
// preparing it on first use.
func (w *writer) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	if st, ok := w.stmts[q]; ok {
		return st, nil
	}
	st, err := w.conn.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	w.stmts[q] = st
	return st, nil
}

// Tx is one write of the session database: the argument of the function
// given to DB.Write, run inside a transaction on the database's writing
// connection. Its methods may be called only from inside that function;
// calling a method of DB that writes from there deadlocks.
type Tx struct {
	ctx context.Context
	w   *writer
}

// Context returns the context of the write (never canceled: a started
// write runs to its end).
func (tx *Tx) Context() context.Context { return tx.ctx }

// Savepoint runs fn inside a savepoint of the write: when fn fails, what
// it wrote is rolled back and the rest of the write is kept.
func (tx *Tx) Savepoint(fn func() error) error {
	if _, err := tx.w.conn.ExecContext(tx.ctx, "SAVEPOINT part"); err != nil {
		return err
	}
	err := fn()
	if err != nil {
		_, _ = tx.w.conn.ExecContext(tx.ctx, "ROLLBACK TO part")
	}
	if _, rerr := tx.w.conn.ExecContext(tx.ctx, "RELEASE part"); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func (tx *Tx) exec(q string, args ...any) (sql.Result, error) {
	st, err := tx.w.stmt(tx.ctx, q)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(tx.ctx, args...)
}

func (tx *Tx) query(q string, args ...any) (*sql.Rows, error) {
	st, err := tx.w.stmt(tx.ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(tx.ctx, args...)
}

func (tx *Tx) queryRow(q string, args ...any) *sql.Row {
	st, err := tx.w.stmt(tx.ctx, q)
	if err != nil {
		// A Row carrying the error: QueryRowContext on the connection
		// prepares again and reports the same failure.
		return tx.w.conn.QueryRowContext(tx.ctx, q, args...)
	}
	return st.QueryRowContext(tx.ctx, args...)
}
