package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/storage"
)

// The store mirror (serving mode local): sessions are served from this
// host's disk and committed to the store after every turn (mirror_path.go
// is its commit path, mirror_commit.go the commit, mirror_retry.go the
// backlog, restore.go the import at start-up and on demand). This file
// holds the mirror and its bookkeeping of what the store has of each
// session (the mirror state).

// Timing of the session mirror.
const (
	// mirrorTimeout bounds the store operations of one flush.
	mirrorTimeout = 30 * time.Second
	// headTimeout bounds the read of the session head before a turn: a
	// store slower than that lets the turn run from the local copy.
	headTimeout = 10 * time.Second
	// readHeadTimeout bounds the read of the session head before a read
	// of the session (its events, its row): a store slower than that lets
	// the read answer from the local copy.
	readHeadTimeout = 2 * time.Second
	// retryMin and retryMax bound the background retry's back-off, which
	// doubles after each round that leaves writes owed.
	retryMin = time.Second
	retryMax = 5 * time.Minute
)

// storeMirror mirrors sessions to the store through the record layer
// (storage.Sessions): each batch is committed with the session head's
// compare-and-set (storage.Sessions.Commit), so a host never overwrites
// newer turns another host committed. What the store refused is kept (the
// local database knows what was committed) and retried at the next turn,
// at the next start, and in the background with back-off, until it lands.
type storeMirror struct {
	r        *Runtime
	sessions *storage.Sessions

	failed atomic.Int64
	forks  atomic.Int64

	mu      sync.Mutex
	backlog map[string]bool // sessions the store lacks something of
	wake    chan struct{}
	// unsaved holds, per session, a mirror state whose commit reached the
	// store but is not yet written to the local database: it goes with the
	// session's next local write of its mirror state (the next turn's last
	// write), or with the background saver's (saveInterval, grouping every
	// session waiting), or at Close. Until then it is the session's mirror
	// state (state reads it). Losing it (a crash) leaves the pending commit
	// recorded before the commit, which the next flush retries and finds
	// landed. An entry is read and changed only under its session's
	// mirror lock; mu guards the map.
	unsaved map[string]sessiondb.MirrorState

	// follows holds, per session with subscribers, the cancel of its
	// follower (guarded by r.mu); followWG counts followers.
	follows  map[string]context.CancelFunc
	followWG sync.WaitGroup
}

// saveInterval is how long a committed mirror state waits in memory for
// the session's next write before the background saver writes it.
const saveInterval = time.Second

func newStoreMirror(r *Runtime, sessions *storage.Sessions) *storeMirror {
	return &storeMirror{r: r, sessions: sessions, backlog: map[string]bool{}, wake: make(chan struct{}, 1), unsaved: map[string]sessiondb.MirrorState{}, follows: map[string]context.CancelFunc{}}
}

// storeMeta is a session row as the store's metadata, naming batch.
func storeMeta(m sessiondb.Meta, batch int64) storage.SessionMeta {
	return storage.SessionMeta{
		ID: m.ID, ChannelID: m.ChannelID, Title: m.Title,
		CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, Turns: m.Turns,
		LastSeq: m.LastSeq, LastStatus: m.LastStatus, Batches: batch,
		TokenDigest: m.TokenDigest,
	}
}

// localMeta is the store's metadata as a session row.
func localMeta(h storage.SessionMeta) sessiondb.Meta {
	return sessiondb.Meta{
		ID: h.ID, ChannelID: h.ChannelID, Title: h.Title,
		CreatedAt: h.CreatedAt.UTC(), UpdatedAt: h.UpdatedAt.UTC(),
		Turns: h.Turns, LastSeq: h.LastSeq, LastStatus: h.LastStatus,
		TokenDigest: h.Digest(),
	}
}

// records decodes the events of loaded batches for the local database,
// returning them and the highest sequence number.
func records(id string, batches []storage.Batch) ([]sessiondb.Record, int64, error) {
	var recs []sessiondb.Record
	var last int64
	for _, b := range batches {
		for _, raw := range b.Events {
			var ev struct {
				Seq  int64     `json:"seq"`
				Type string    `json:"type"`
				At   time.Time `json:"at"`
			}
			if err := json.Unmarshal(raw, &ev); err != nil || ev.Seq <= 0 {
				return nil, 0, fmt.Errorf("%w: an event in batch %d of session %s is damaged", ErrStoreUnavailable, b.Number, id)
			}
			recs = append(recs, sessiondb.Record{SessionID: id, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: raw})
			last = max(last, ev.Seq)
		}
	}
	slices.SortFunc(recs, func(a, b sessiondb.Record) int { return int(a.Seq - b.Seq) })
	recs = slices.CompactFunc(recs, func(a, b sessiondb.Record) bool { return a.Seq == b.Seq })
	return recs, last, nil
}

// state returns a session's row and mirror state: the local database's,
// or the state kept in memory since its last commit (unsaved). The caller
// holds the session's mirror lock.
func (mr *storeMirror) state(ctx context.Context, id string) (sessiondb.Meta, sessiondb.MirrorState, error) {
	m, ms, err := mr.r.db.Mirror(ctx, id)
	if err != nil {
		return m, ms, err
	}
	if u, ok := mr.unsavedState(id); ok {
		ms = u
		m.MirroredSeq, m.Batches, m.IndexKey, m.TokenMirrored = u.MirroredSeq, u.Batch, u.IndexKey, u.TokenMirrored
	}
	return m, ms, nil
}

func (mr *storeMirror) unsavedState(id string) (sessiondb.MirrorState, bool) {
	mr.mu.Lock()
	defer mr.mu.Unlock()
	u, ok := mr.unsaved[id]
	return u, ok
}

// keep holds a committed mirror state in memory until it is saved.
func (mr *storeMirror) keep(id string, ms sessiondb.MirrorState) {
	mr.mu.Lock()
	mr.unsaved[id] = ms
	mr.mu.Unlock()
}

// forget drops what the mirror keeps in memory of a session removed
// here.
func (mr *storeMirror) forget(id string) { mr.saved(id) }

// saved forgets the state kept in memory: the local database has it (or a
// newer one), or the session is gone.
func (mr *storeMirror) saved(id string) {
	mr.mu.Lock()
	delete(mr.unsaved, id)
	mr.mu.Unlock()
}

// save writes the mirror states kept in
// memory, of every session whose mirror lock it gets (all of them when
// wait is set), in one write of the local database.
func (mr *storeMirror) save(ctx context.Context, wait bool) {
	r := mr.r
	mr.mu.Lock()
	ids := make([]string, 0, len(mr.unsaved))
	for id := range mr.unsaved {
		ids = append(ids, id)
	}
	mr.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	states := map[string]sessiondb.MirrorState{}
	for _, id := range ids {
		st, unref := r.refSession(id)
		if wait {
			st.mirror.Lock()
		} else if !st.mirror.TryLock() {
			unref()
			continue // a flush of the session is under way: it saves the state
		}
		defer unref()
		defer st.mirror.Unlock()
		if ms, ok := mr.unsavedState(id); ok {
			states[id] = ms
		}
	}
	err := r.db.Write(ctx, func(tx *sessiondb.Tx) error {
		for id, ms := range states {
			if err := tx.SetMirror(id, ms); err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		r.log.Warn("agent: mirror: saving mirror states failed; the pending commits they settle are retried", "error", err)
		return
	}
	for id := range states {
		mr.saved(id)
	}
}

// loadedState is the mirror state of a session just read from the store.
func (mr *storeMirror) loadedState(h storage.Head, last int64) sessiondb.MirrorState {
	seq := max(h.LastSeq, last)
	indexKey, _ := mr.sessions.IndexKey(h.ID, h.UpdatedAt)
	return sessiondb.MirrorState{
		MirroredSeq: seq, Batch: h.Batches, BatchID: h.BatchID,
		IndexKey: indexKey, TokenMirrored: true, MetaSeq: seq,
	}
}
