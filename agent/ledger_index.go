package agent

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/ledger"
	"agentkit/storage"
)

// ledgerIndex serves serving mode ledger's session listing from the
// store's session index (session-index/{inv}/{id}, the entries serving
// mode local writes too) instead of reading every control record per
// page. Entries are hints, checked against the control record of each
// session listed:
//
//   - A new session's first entry, for its creation time, is written once
//     its first message is acknowledged and before the answer, so every
//     host lists it from then on. After each commit, the committing host
//     writes the session's entry for the commit's time in the background,
//     off the answer's path, then deletes the entry it wrote before: a
//     session moves to the top a moment after its turn.
//   - A listing reads entries from its cursor, newest first, and one
//     control record per entry. An entry of a deleted session is skipped
//     and deleted; one of a session without a control record (serving
//     mode local's, not adopted yet) is skipped and kept. An entry whose
//     time is not the session's (left by a host that crashed, or that
//     another host replaced) is skipped when the session's current entry
//     exists further on or before the cursor, and otherwise listed where
//     it is, the session's current entry written (when missing) and the
//     old one deleted.
//   - A current entry whose write was lost (a host killed after the
//     commit) is written by the ledger's janitor: it sweeps every idle
//     session that committed turns since its last sweep (at most every
//     SweepEvery), and its Swept hook writes the entry when it is missing.
//   - Sessions committed before the index existed are written by a
//     one-time build (migrations/ledger-session-index), which every host
//     runs at start until the marker exists (a failed build is tried again
//     every indexBuildRetry); until then, listings read every control
//     record, as before.
//
// The index needs a store with List and Get; without them, listings read
// every control record.
type ledgerIndex struct {
	lp       *ledgerPath
	sessions *storage.Sessions
	ready    atomic.Bool

	flushing sync.Mutex // one flush at a time

	mu    sync.Mutex
	metas map[string]storage.SessionMeta // entries to write, by session
	drops map[string]string              // entry keys to delete → their session
	last  map[string]string              // session → the entry key this host wrote last
	wake  chan struct{}
}

// Bounds of the index writer.
const (
	indexRetry    = 5 * time.Second // a failed write is tried again after this
	indexLastKeys = 10000           // sessions whose last entry key this host remembers
	// indexWriteTimeout bounds the one entry write made before an answer.
	indexWriteTimeout = 2 * time.Second
	// indexBuildRetry is the pause between attempts at a failed build.
	indexBuildRetry = time.Minute
)

// newLedgerIndex returns the index of the agent's store, nil when the
// store cannot list or read.
func newLedgerIndex(lp *ledgerPath, st *storage.AgentStore) *ledgerIndex {
	if st == nil {
		return nil
	}
	if c := st.Binding().Capabilities(); !c.List || !c.Get {
		return nil
	}
	return &ledgerIndex{lp: lp, sessions: st.Sessions(), metas: map[string]storage.SessionMeta{},
		drops: map[string]string{}, last: map[string]string{}, wake: make(chan struct{}, 1)}
}

// usable reports whether listings read the index: it exists and its
// build has finished (on this host or another).
func (ix *ledgerIndex) usable(ctx context.Context) bool {
	if ix == nil {
		return false
	}
	if ix.ready.Load() {
		return true
	}
	done, err := ix.sessions.Migrated(ctx, storage.MigrationLedgerSessionIndex)
	if err == nil && done {
		ix.ready.Store(true)
	}
	return done
}

// committed notes that session m was committed at at: its entry for that
// time is written in the background.
func (ix *ledgerIndex) committed(m sessiondb.Meta, at time.Time) {
	if ix == nil {
		return
	}
	meta := storeMeta(m, 0)
	meta.UpdatedAt = at.UTC()
	ix.note(meta)
}

// created writes a new session's first entry, for its creation time, once
// its first message is acknowledged and before the answer, so every host
// lists it from then on; a failure leaves the write to the background.
func (ix *ledgerIndex) created(ctx context.Context, meta storage.SessionMeta) {
	if ix == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), indexWriteTimeout)
	defer cancel()
	key, err := ix.sessions.PutIndex(ctx, meta)
	if err != nil {
		ix.note(meta)
		return
	}
	ix.mu.Lock()
	if _, committed := ix.last[meta.ID]; committed {
		// The first turn's entry was written first: this one is stale.
		ix.drops[key] = ""
	} else {
		ix.remember(meta.ID, key)
	}
	ix.mu.Unlock()
}

// note queues an entry to write, unless a newer one of the session is
// queued.
func (ix *ledgerIndex) note(meta storage.SessionMeta) {
	ix.mu.Lock()
	if q, ok := ix.metas[meta.ID]; !ok || !q.UpdatedAt.After(meta.UpdatedAt) {
		ix.metas[meta.ID] = meta
	}
	ix.mu.Unlock()
	ix.poke()
}

// drop queues an entry of session id to delete; it is deleted once the
// session's queued entry, if any, is written.
func (ix *ledgerIndex) drop(key, id string) {
	ix.mu.Lock()
	ix.drops[key] = id
	ix.mu.Unlock()
	ix.poke()
}

// remember records the entry key this host wrote last for a session, and
// queues the one before it for deletion. The caller holds ix.mu.
func (ix *ledgerIndex) remember(id, key string) {
	if prev := ix.last[id]; prev != "" && prev != key {
		if prev < key {
			// The entry just written is older than the one before it (an
			// entry noted from an older read): it is the stale one.
			ix.drops[key] = id
			return
		}
		ix.drops[prev] = id
	}
	if _, ok := ix.last[id]; !ok && len(ix.last) >= indexLastKeys {
		for k := range ix.last { // forget one: a listing drops its stale entry
			delete(ix.last, k)
			break
		}
	}
	ix.last[id] = key
}

func (ix *ledgerIndex) poke() {
	select {
	case ix.wake <- struct{}{}:
	default:
	}
}

// run writes entries until ctx ends, after building the index once.
func (ix *ledgerIndex) run(ctx context.Context) {
	if ix == nil {
		return
	}
	tick := time.NewTicker(indexRetry)
	defer tick.Stop()
	var lastBuild time.Time
	for {
		if !ix.ready.Load() && time.Since(lastBuild) >= indexBuildRetry {
			lastBuild = time.Now()
			if err := ix.build(ctx); err != nil && ctx.Err() == nil {
				ix.lp.r.log.Warn("agent: building the session index failed; listings read every session until it is built, and the build is tried again", "error", err)
			}
		}
		ix.flush(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ix.wake:
		case <-tick.C:
		}
	}
}

// flush writes the noted entries, then deletes the dropped ones whose
// session has no entry left to write; what fails stays for the next round.
func (ix *ledgerIndex) flush(ctx context.Context) {
	ix.flushing.Lock()
	defer ix.flushing.Unlock()
	ix.mu.Lock()
	metas := ix.metas
	ix.metas = map[string]storage.SessionMeta{}
	ix.mu.Unlock()
	for id, meta := range metas {
		key, err := ix.sessions.PutIndex(ctx, meta)
		ix.mu.Lock()
		if err != nil {
			if _, newer := ix.metas[id]; !newer {
				ix.metas[id] = meta
			}
		} else {
			ix.remember(id, key)
		}
		ix.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			ix.lp.r.logger(id).Warn("agent: writing the session's index entry failed; it is tried again", "error", err)
		}
	}
	ix.mu.Lock()
	drops := map[string]string{}
	current := map[string]bool{}
	for _, key := range ix.last {
		current[key] = true
	}
	for key, id := range ix.drops {
		switch _, waiting := ix.metas[id]; {
		case current[key]:
			delete(ix.drops, key) // the entry this host wrote last for its session: kept
		case !waiting || id == "":
			drops[key] = id // never the last entry of a session whose new one is not written
			delete(ix.drops, key)
		}
	}
	ix.mu.Unlock()
	for key, id := range drops {
		if err := ix.sessions.DeleteIndex(ctx, key); err != nil {
			ix.mu.Lock()
			ix.drops[key] = id
			ix.mu.Unlock()
		}
	}
}

// build writes the entry of every session committed before the index
// existed, then the build's marker.
func (ix *ledgerIndex) build(ctx context.Context) error {
	done, err := ix.sessions.Migrated(ctx, storage.MigrationLedgerSessionIndex)
	if err != nil || done {
		ix.ready.Store(done)
		return err
	}
	n, failed := 0, 0
	for s, err := range ix.lp.led.Sessions(ctx) {
		if err != nil {
			return err
		}
		wrote, err := ix.ensure(ctx, s)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			// The others are still indexed; the build ends without its
			// marker and is tried again.
			ix.lp.r.logger(s.ID).Warn("agent: indexing a session failed", "error", err)
			failed++
			continue
		}
		if wrote {
			n++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d sessions could not be indexed; the build is tried again in %s", failed, indexBuildRetry)
	}
	if err := ix.sessions.MarkMigrated(ctx, storage.MigrationLedgerSessionIndex, ix.lp.r.hostID, n); err != nil {
		return err
	}
	ix.ready.Store(true)
	return nil
}

// ensure writes a session's current entry when it is missing, and
// reports whether it wrote one.
func (ix *ledgerIndex) ensure(ctx context.Context, s ledger.SessionInfo) (bool, error) {
	if s.Deleted {
		return false, nil
	}
	key, err := ix.sessions.IndexKey(s.ID, updatedOf(s))
	if err != nil {
		return false, err
	}
	if ok, err := ix.sessions.IndexExists(ctx, key); err != nil || ok {
		return false, err
	}
	sess, ok, err := ix.lp.sessionRow(ctx, s)
	if err != nil || !ok {
		return false, err
	}
	_, err = ix.sessions.PutIndex(ctx, metaOfRow(sess))
	return err == nil, err
}

// swept is the ledger's Swept hook: an idle session's entry is written
// when its write was lost.
func (ix *ledgerIndex) swept(ctx context.Context, s ledger.SessionInfo) {
	if ix == nil || !ix.ready.Load() {
		return
	}
	if _, err := ix.ensure(ctx, s); err != nil && ctx.Err() == nil {
		ix.lp.r.logger(s.ID).Warn("agent: checking the session's index entry after a sweep failed", "error", err)
	}
}

// metaOfRow is a listing row as an index entry's value.
func metaOfRow(s Session) storage.SessionMeta {
	return storage.SessionMeta{ID: s.ID, ChannelID: s.ChannelID, Title: s.Title, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
		Turns: s.Turns, LastSeq: s.LastSeq, LastStatus: string(s.LastStatus)}
}

// list is a page of the listing from the index: entries from the
// cursor's, each checked against its session's control record. The
// control records of a batch of entries are read at once (indexReaders at
// a time), as many as the page still needs plus one.
func (ix *ledgerIndex) list(ctx context.Context, limit int, after *cursor) (SessionPage, error) {
	afterKey := ""
	if after != nil {
		k, err := ix.sessions.IndexKey(after.I, time.Unix(0, after.U))
		if err != nil {
			return SessionPage{}, invalid("cursor", "it is not a cursor this server returned; pass nextCursor from the previous page, or nothing to start")
		}
		afterKey = k
	}
	next, stop := iter.Pull2(ix.sessions.ListIndexAfter(ctx, afterKey))
	defer stop()
	page := SessionPage{Sessions: []Session{}}
	seen := map[string]bool{}
	var lastAt time.Time
	var lastID string
	for more := true; more; {
		// The next batch of entries, of sessions not listed yet.
		var batch []storage.IndexEntry
		for len(batch) < limit+1-len(page.Sessions) {
			e, err, ok := next()
			if !ok {
				more = false
				break
			}
			if err != nil {
				if errors.Is(err, storage.ErrBadRecord) || errors.Is(err, storage.ErrNewerFormat) {
					ix.lp.r.log.Warn("agent: skipping an unreadable session-index entry", "key", e.Key, "error", err)
					continue
				}
				return SessionPage{}, storeErr("listing the session index", err)
			}
			if seen[e.Meta.ID] {
				continue // another entry of a session listed above: left to a later check
			}
			batch = append(batch, e)
		}
		infos, err := ix.infos(ctx, batch)
		if err != nil {
			return SessionPage{}, err
		}
		for i, e := range batch {
			if seen[e.Meta.ID] {
				continue
			}
			row, ok, err := ix.check(ctx, afterKey, e, infos[i])
			if err != nil {
				return SessionPage{}, err
			}
			if !ok {
				continue
			}
			if len(page.Sessions) == limit {
				page.NextCursor = encodeCursor(lastAt, lastID)
				return page, nil
			}
			seen[e.Meta.ID] = true
			page.Sessions = append(page.Sessions, row)
			lastAt, lastID = e.Updated, e.Meta.ID
		}
	}
	return page, nil
}

// indexReaders bounds the control records a listing reads at once.
const indexReaders = 8

// sessionRead is a control record read for an entry.
type sessionRead struct {
	info ledger.SessionInfo
	err  error
}

// infos reads the control records of a batch's sessions, indexReaders at
// a time.
func (ix *ledgerIndex) infos(ctx context.Context, batch []storage.IndexEntry) ([]sessionRead, error) {
	out := make([]sessionRead, len(batch))
	sem := make(chan struct{}, indexReaders)
	var wg sync.WaitGroup
	for i, e := range batch {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i].info, out[i].err = ix.lp.led.SessionInfo(ctx, e.Meta.ID)
		}()
	}
	wg.Wait()
	for i, r := range out {
		switch {
		case r.err == nil, errors.Is(r.err, ledger.ErrUnknownSession):
		case errors.Is(r.err, ledger.ErrFormat):
			// Skipped, as the listing from the control records skips it.
			ix.lp.r.logger(batch[i].Meta.ID).Warn("agent: listing skips a session whose control record this build cannot read", "error", r.err)
		default:
			return nil, storeErr("reading a session's control record", r.err)
		}
	}
	return out, nil
}

// check decides what an entry lists, given its session's control record:
// the row, or ok false when the entry lists nothing (its session is gone,
// or listed at its current entry). afterKey is the listing's cursor.
func (ix *ledgerIndex) check(ctx context.Context, afterKey string, e storage.IndexEntry, read sessionRead) (Session, bool, error) {
	info := read.info
	if read.err != nil {
		// No control record (a session of serving mode local not adopted
		// yet: its entry is local mode's, which restores from it), or one
		// this build cannot read. Skipped, not deleted.
		return Session{}, false, nil
	}
	if info.Deleted {
		ix.mu.Lock()
		delete(ix.last, e.Meta.ID) // nothing of the session is kept
		ix.mu.Unlock()
		ix.drop(e.Key, "")
		return Session{}, false, nil
	}
	if at := updatedOf(info); at.Equal(e.Updated) && e.Meta.Turns == int64(info.CommitSeq) {
		row := sessionOf(localMeta(e.Meta))
		row.UpdatedAt = at
		return row, true, nil
	}
	id := e.Meta.ID
	current, err := ix.sessions.IndexKey(id, updatedOf(info))
	if err != nil {
		return Session{}, false, err
	}
	exists, err := ix.sessions.IndexExists(ctx, current)
	if err != nil {
		return Session{}, false, storeErr("reading the session index", err)
	}
	if exists && current != e.Key {
		ix.drop(e.Key, "")
		if current > e.Key || current <= afterKey {
			// The listing reaches the current entry further on, or an
			// earlier page had it.
			return Session{}, false, nil
		}
		// The current entry sorts between the cursor and here, and this
		// listing did not see it: it was written after the listing began.
		// The session is listed here instead.
	}
	row, ok, err := ix.lp.sessionRow(ctx, info)
	if err != nil || !ok {
		return Session{}, false, err
	}
	if !exists {
		// The current entry is missing: write it.
		ix.note(metaOfRow(row))
		if current != e.Key {
			ix.drop(e.Key, id)
		}
	}
	return row, true, nil
}
