package actor

import (
	"container/list"
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"
)

// pool keeps at most max system databases open, one connection each. An
// entry in use is never closed; an unused one is closed when the pool needs
// its place (least recently used first) or when it has been unused for
// idle. A caller that finds every place in use waits for one.
type pool struct {
	max  int
	idle time.Duration

	mu      sync.Mutex
	entries map[string]*entry // open or opening
	lru     *list.List        // unused entries, most recently used first
	freed   chan struct{}     // closed (and replaced) when a place may be free
	closed  bool

	stop chan struct{}
	done chan struct{}
}

// entry is one actor's open system database.
type entry struct {
	key   string
	db    *sql.DB
	meta  dbMeta
	refs  int
	used  time.Time
	elem  *list.Element
	ready chan struct{} // closed once db is open or err set
	err   error

	// mu serializes this actor's schedule changes with its entry in the
	// schedule index, and a pending migration's completion.
	mu    sync.Mutex
	swept bool // stale temporary files removed; under mu
}

// errAbsent is returned by an opener when the actor has no database and
// the caller only reads.
var errAbsent = errors.New("actor: no database")

func newPool(max int, idle time.Duration) *pool {
	p := &pool{max: max, idle: idle, entries: map[string]*entry{}, lru: list.New(),
		freed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go p.janitor()
	return p
}

// signal wakes the callers waiting for a place. p.mu is held.
func (p *pool) signal() {
	close(p.freed)
	p.freed = make(chan struct{})
}

// acquire returns key's entry, opening it with open when it is not open.
// The caller must release it. An error of open is returned to its own
// caller; others waiting for the same entry try again themselves.
func (p *pool) acquire(ctx context.Context, key string, open func() (*sql.DB, dbMeta, error)) (*entry, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if e, ok := p.entries[key]; ok {
			e.refs++
			if e.elem != nil {
				p.lru.Remove(e.elem)
				e.elem = nil
			}
			p.mu.Unlock()
			select {
			case <-e.ready:
			case <-ctx.Done():
				p.release(e)
				return nil, ctx.Err()
			}
			if e.err != nil {
				continue // its opener failed and removed it; try ourselves
			}
			return e, nil
		}
		if len(p.entries) >= p.max {
			if back := p.lru.Back(); back != nil {
				victim := back.Value.(*entry)
				p.lru.Remove(back)
				delete(p.entries, victim.key)
				p.mu.Unlock()
				victim.db.Close()
				continue
			}
			ch := p.freed
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		e := &entry{key: key, refs: 1, ready: make(chan struct{})}
		p.entries[key] = e
		p.mu.Unlock()

		db, meta, err := open()
		if err != nil {
			p.mu.Lock()
			delete(p.entries, key)
			e.err = err
			close(e.ready)
			p.signal()
			p.mu.Unlock()
			return nil, err
		}
		e.db, e.meta = db, meta
		close(e.ready)
		return e, nil
	}
}

// release gives back an entry acquire returned.
func (p *pool) release(e *entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e.refs--
	if e.refs > 0 || e.err != nil {
		return
	}
	if p.entries[e.key] != e {
		return // removed (the pool closed)
	}
	e.used = time.Now()
	e.elem = p.lru.PushFront(e)
	p.signal()
}

// open reports how many databases are open or opening.
func (p *pool) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.entries)
}

// janitor closes entries unused for idle.
func (p *pool) janitor() {
	defer close(p.done)
	tick := max(p.idle/4, time.Millisecond)
	t := time.NewTimer(tick)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.closeIdle(time.Now().Add(-p.idle))
		t.Reset(tick)
	}
}

// closeIdle closes the unused entries last used before cutoff.
func (p *pool) closeIdle(cutoff time.Time) {
	var victims []*entry
	p.mu.Lock()
	for back := p.lru.Back(); back != nil; back = p.lru.Back() {
		e := back.Value.(*entry)
		if e.used.After(cutoff) {
			break
		}
		p.lru.Remove(back)
		delete(p.entries, e.key)
		victims = append(victims, e)
	}
	if len(victims) > 0 {
		p.signal()
	}
	p.mu.Unlock()
	for _, e := range victims {
		e.db.Close()
	}
}

// close closes every database and stops the janitor. Entries still in use
// are closed too; database/sql lets their running statements finish.
func (p *pool) close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var all []*entry
	for _, e := range p.entries {
		all = append(all, e)
	}
	p.entries = map[string]*entry{}
	p.lru.Init()
	p.signal()
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	var errs []error
	for _, e := range all {
		<-e.ready
		if e.db != nil {
			errs = append(errs, e.db.Close())
		}
	}
	return errors.Join(errs...)
}

// errRemoved marks the placeholder entry of an actor being removed; the
// callers that waited for it open the actor again.
var errRemoved = errors.New("actor: removed")

// remove closes key's database once no caller uses it, then runs fn while
// holding key's place, so no caller opens the database until fn has
// returned. Callers waiting meanwhile open it afresh afterwards.
func (p *pool) remove(ctx context.Context, key string, fn func() error) error {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		if e, ok := p.entries[key]; ok {
			if e.refs == 0 && e.elem != nil {
				p.lru.Remove(e.elem)
				e.elem = nil
				delete(p.entries, key)
				p.mu.Unlock()
				e.db.Close()
				continue
			}
			ch := p.freed // in use: wait for a release
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		e := &entry{key: key, refs: 1, ready: make(chan struct{})}
		p.entries[key] = e
		p.mu.Unlock()
		err := fn()
		p.mu.Lock()
		delete(p.entries, key)
		e.err = errRemoved
		close(e.ready)
		p.signal()
		p.mu.Unlock()
		return err
	}
}
