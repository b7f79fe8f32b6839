package agent

import (
	"context"

	"agentkit/agent/sessiondb"
)

// commitPath is what differs between the serving modes, and nothing else
// does: how a turn request reaches a turn, how a turn begins (the local
// copy brought up to the store's) and commits, what follows the commit,
// and how sessions are found, listed, deleted and followed. The turn
// itself (runTurn: the model and tool loop, the checks between calls, the
// events, the effects after the commit) is one function for every path.
//
// Two paths exist. The store mirror (mirror_path.go, serving mode local)
// runs a turn on the host that gets the request and commits it with the
// session head's compare-and-set; a store write that fails never fails
// the turn and is retried. The ledger (ledger_path.go, serving mode
// ledger) queues a request in the session's inbox, runs it on the host
// holding the session's lease and commits it with the ledger's fenced
// commit; nothing counts before that commit. Open picks one; no code
// outside the two paths and Open asks which.
//
// The Runtime calls submit, session, list and remove inside an operation
// (enter); follow and unfollow from Subscribe; drain, stop, close and
// stats from Drain, Close and Info.
type commitPath interface {
	// submit runs a turn request and answers it: a new session (req.start)
	// or a follow-up of req.sessionID, from a client or a reminder. The
	// answer is the turn's result, or Queued when the path accepted the
	// message for a turn that runs elsewhere or later.
	submit(ctx context.Context, req turnRequest) (TurnResult, error)
	// session returns a session's row, the local copy brought up to the
	// store's (ErrSessionNotFound when no host has it,
	// ErrStoreUnavailable when the store fails).
	session(ctx context.Context, id string) (sessiondb.Meta, error)
	// list returns a page of the agent's sessions, newest first.
	list(ctx context.Context, limit int, after *cursor) (SessionPage, error)
	// remove deletes a session for every host, then here. The caller
	// found it with session.
	remove(ctx context.Context, id string) error
	// follow prepares to stream the session's commits of other hosts to
	// this host's subscribers and returns the function that starts it;
	// Subscribe calls follow before it takes r.mu (follow may read the
	// store) and the returned function holding r.mu. unfollow, called
	// holding r.mu, stops it.
	follow(id string) func()
	unfollow(id string)
	// start runs the path's background work until ctx ends; Open calls it
	// once.
	start(ctx context.Context)
	// drain makes the path take no new work from shared queues (Drain,
	// and Close's first step); stop is Close's next step, before it waits
	// for running operations; close its last, once none runs.
	drain()
	stop()
	close()
	// stats reports the writes the store refused, the sessions it lacks
	// something of, and the forks since Open (zero where the path has
	// none).
	stats() (failed int64, backlog int, forks int64)
	// flushOwed writes what the store lacks of every session now and
	// returns how many sessions still lack something (Runtime.Flush).
	flushOwed(ctx context.Context) (int, error)
}

// turnCommit is one turn's hold on its commit path: runTurn calls begin
// once, check before every model and tool call, flush when recorded
// events may be written before the turn ends (before a tool runs, or when
// the model is slow), and commit once the turn has its turn.finished
// event.
type turnCommit interface {
	// begin brings the local copy of the session up to the store's and
	// returns its row (ErrSessionNotFound when the session is gone).
	begin(ctx context.Context) (sessiondb.Meta, error)
	// check fails once the turn may no longer have side effects (the
	// ledger's lease is lost); nil otherwise.
	check() error
	// flush writes and publishes the events recorded so far, or keeps
	// them for the commit.
	flush(t *turn) error
	// commit makes the turn's events part of the session for every host,
	// then does what the path does after a commit (the local copy). An
	// error means the turn did not count: runTurn runs no effect of it.
	commit(ctx context.Context, t *turn) error
}
