// Package agent is agentkit's runtime: agents defined in Go, the turn loop
// that runs them, and the sessions, continuation tokens, reminders, session
// actors, host KV and host files that outlive a process.
//
// Define an agent and open a runtime on a state root:
//
//	echo, _ := model.NewEcho(nil) // or model.NewOpenAI(...)
//	rt, err := agent.Open(ctx, agent.Config{
//		Agent: agent.Agent{
//			Name:         "support",
//			Instructions: "You answer questions about orders.",
//			Model:        echo,
//			Tools:        []tool.Tool{lookupOrder},
//		},
//		StateRoot: ".agentkit",
//	})
//	defer rt.Close()
//	res, err := rt.StartSession(ctx, agent.StartRequest{Message: "hello"})
//	// later, in the same or another process on the same store:
//	res, err = rt.Continue(ctx, agent.ContinueRequest{
//		Token: res.ContinuationToken, Message: "and then?"})
//
// # One turn, two serving modes
//
// A turn is one function, runTurn (turn.go), whatever the serving mode: the
// model and tool loop, a check before every model and tool call, the turn's
// events, and only once the turn is committed its effects (the AfterTurn
// hooks, the memory journal's record, the A/B sample). What differs between
// the modes is the commit path (path.go), chosen at Open:
//
//   - Serving mode local (ServingLocal, the default; mirror_path.go): a turn
//     runs on the host that gets the request, from this host's copy of the
//     session brought up to the store's (the turns other hosts committed are
//     taken first), and is committed to the store with the session head's
//     compare-and-set (package storage). A store write that fails never
//     fails the turn: it is kept and retried until it lands (mirror_retry.go),
//     and a turn that loses the head to another host stays in the
//     session's history as a turn.forked event, on every host.
//     At start-up recent sessions are restored within the policy's caps
//     (restore.go).
//   - Serving mode ledger (ServingLedger; ledger_path.go, ledger_turn.go):
//     a request is a message queued in the session's inbox (package ledger);
//     the one host holding the session's lease runs its turn from the
//     committed transcript and commits it with the ledger's fenced commit.
//     Nothing of a turn counts before that commit; a turn whose lease is
//     lost runs again on the next holder.
//
// # Where a session lives
//
//	what                                  type                     package          where
//	the session as callers see it         Session, Event           agent            (answers only)
//	the local copy: row and events        sessiondb.Meta, Record   agent/sessiondb  this host: sessions/sessions.db
//	local mode: head, batches, metadata,  storage.Head, Batch,     storage          the shared store
//	  index entry, continuation record    SessionMeta
//	ledger mode: control record, inbox,   (the ledger's own)       ledger           the shared store
//	  committed turns, dead letters
//	continuation token record             (storage's)              storage          the shared store, both modes
//	session-index entry (listing hint)    storage.SessionMeta      storage          the shared store, both modes (ledger_index.go)
//	session actor state and schedules     actor.Ref                actor            this host: actors/
//	workspace files                       files                    workspace        this host: workspace/{id}/
//	memory journal records                memory.Record            memory           this host (or the hosted service)
//
// In serving mode local the local copy is the session's working copy and
// the store holds what every host committed; in serving mode ledger the
// local copy caches committed turns only, and the committed transcript is
// the truth. docs/runtime.md draws the turn and its commit path.
//
// Every session is an actor (package actor) of class SessionClass: a JSON
// object state that tools change through tool.Env.Actor and programs
// through SessionActor, scheduled tasks, and messages and events that are
// views of the session's events. Runtime.Actors is the host of those
// actors and of classes of the agent's own (Agent.DefineActors); their
// databases are created by a first write and stay on this host
// (actors.go).
//
// The HTTP server (package server) and the agentkit command run agents
// through this package only: a config-defined agent (package config) and a
// Go-defined one take the same path. The server needs nothing below it:
// this package exports the errors it answers (errors.go, actors.go) and
// the dead-letter and ledger calls (deadletters.go).
package agent
