package agent

import (
	"context"

	"agentkit/agent/sessiondb"
)

// DisableConversationCache makes r rebuild every turn's conversation from
// the session database, as if nothing were cached: the reference the
// cache's tests compare against.
func DisableConversationCache(r *Runtime) { r.convs = newConversationCache(0, conversationIdle) }

// CachedConversations returns how many conversations r holds in its cache.
func CachedConversations(r *Runtime) int { return r.convs.len() }

// LoseUnsavedMirrorState drops the mirror states r keeps in memory, as a
// crash would, and reports how many there were.
func LoseUnsavedMirrorState(r *Runtime) int {
	mr := r.path.(*storeMirror)
	mr.mu.Lock()
	defer mr.mu.Unlock()
	n := len(mr.unsaved)
	clear(mr.unsaved)
	return n
}

// FireLedgerReminder delivers a reminder's firing as the scheduler does in
// serving mode ledger.
func FireLedgerReminder(r *Runtime, sessionID, reminderID, message string) error {
	_, err := r.path.submit(context.Background(), turnRequest{sessionID: sessionID, reminder: reminderID, message: message, source: SourceReminder})
	return err
}

// WithCommitPathDouble returns cfg with the commit path replaced by a
// test double (memPath, pathdouble_test.go): sessions live in the local
// database only, and each commit is kept in memory.
func WithCommitPathDouble(cfg Config) Config {
	cfg.newPath = func(r *Runtime) (commitPath, error) {
		return &memPath{r: r, commits: map[string][][]sessiondb.Record{}}, nil
	}
	return cfg
}

// DoubleCommits returns how many turns of a session ("": of every
// session) the test double of the commit path committed (-1 when r does
// not run on the double).
func DoubleCommits(r *Runtime, sessionID string) int {
	p, ok := r.path.(*memPath)
	if !ok {
		return -1
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if sessionID == "" {
		n := 0
		for _, c := range p.commits {
			n += len(c)
		}
		return n
	}
	return len(p.commits[sessionID])
}

// FenceDouble makes the test double's check fail from its n-th call on
// (ErrDoubleFenced), and every commit fail with commitErr when it is not
// nil.
func FenceDouble(r *Runtime, n int, commitErr error) {
	p := r.path.(*memPath)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checks, p.fenceAt, p.commitErr = 0, n, commitErr
}

// ErrDoubleFenced is the test double's fence.
var ErrDoubleFenced = errFenced

// BuildLedgerIndex runs the one-time build of serving mode ledger's
// session index now (ledger_index.go), as a host does at start.
func BuildLedgerIndex(r *Runtime) error { return r.path.(*ledgerPath).ix.build(context.Background()) }

// FlushLedgerIndex writes and deletes the session-index entries waiting
// in the background, now.
func FlushLedgerIndex(r *Runtime) { r.path.(*ledgerPath).ix.flush(context.Background()) }

// SweepLedgerIndex runs the janitor's Swept hook of the session index for
// a session, as after a sweep.
func SweepLedgerIndex(r *Runtime, id string) error {
	lp := r.path.(*ledgerPath)
	info, err := lp.led.SessionInfo(context.Background(), id)
	if err != nil {
		return err
	}
	lp.ix.swept(context.Background(), info)
	return nil
}

// LedgerIndexSettled reports whether every entry of the session index is
// its session's current one (one per live session, at its last commit),
// after writing what waits in the background.
func LedgerIndexSettled(r *Runtime) (bool, error) {
	lp := r.path.(*ledgerPath)
	lp.ix.flush(context.Background())
	seen := map[string]bool{}
	for e, err := range lp.ix.sessions.ListIndex(context.Background()) {
		if err != nil {
			return false, err
		}
		info, err := lp.led.SessionInfo(context.Background(), e.Meta.ID)
		if err != nil || info.Deleted || !updatedOf(info).Equal(e.Updated) || seen[e.Meta.ID] {
			return false, nil
		}
		seen[e.Meta.ID] = true
	}
	return true, nil
}

// ListLedgerSessionsByScan lists a page of serving mode ledger's sessions
// from every control record, as before the session index, for
// benchmarks to compare.
func ListLedgerSessionsByScan(r *Runtime, limit int) (SessionPage, error) {
	return r.path.(*ledgerPath).listScan(context.Background(), limit, nil)
}
