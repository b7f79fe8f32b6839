// Package actor gives Go programs durable actors: state, message history,
// progress events and scheduled tasks, addressed by class and id, each
// actor in a SQLite database of its own on the host that serves it.
//
// A class fixes the Go type of its actors' state and their initial state:
//
//	type Status struct {
//		Status    string `json:"status"`
//		LastReply string `json:"lastReply"`
//	}
//
//	host, err := actor.Open(actor.Options{Dir: "state/actors"})
//	agents, err := actor.Define(host, "support", func() Status { return Status{Status: "idle"} })
//	a, err := agents.Actor("user-42")
//	st, err := a.SetState(ctx, []byte(`{"status":"processing"}`)) // RFC 7396 merge patch
//	err = a.ReplaceState(ctx, Status{Status: "idle", LastReply: "Done."})
//	st, err = a.State(ctx)
//
// # State
//
// State is one JSON value, read whole: meant for small structured data
// (status, preferences, a last-seen time). SetState applies an RFC 7396
// merge patch (package mergepatch: nested objects merge, null deletes,
// arrays and scalars replace, numbers keep their digits); ReplaceState
// replaces the value. The read, the merge and the write are one SQLite
// transaction, so concurrent SetState calls on one actor never lose a
// patch, and a change is on disk when the call returns (WAL,
// synchronous=FULL unless Options.Synchronous says otherwise). A patch or
// value the state type cannot hold is refused with ErrInvalidState and
// nothing is stored. The stored JSON is kept as it is: keys the Go type
// does not know survive a SetState.
//
// # Where it is stored
//
// Each actor has a folder, {Dir}/{class}/{id}/ (names encoded so any
// string is a safe file name), holding system.db, the system database of
// its state, messages, events and tasks, and data.db, the author's own SQL
// database returned by Ref.SQL. Folders are created owner-only (0700) and
// files 0600, SQLite's -wal and -shm files included; Dir itself, and a
// database found with group or other permissions when it is opened, are
// made owner-only. Nothing is created before the actor's first write:
// reading an actor that was never written gives its initial state and
// empty logs and costs no file. The system database records its format (Format); a build
// that finds a newer one refuses it with ErrNewerFormat and an error that
// says to upgrade. Ref.Delete removes an actor: its folder, its schedule
// index entry and its key-value records.
//
// Messages and events are append-only logs (Log) keyed by a sequence
// number: an append, the last N records and a page after a cursor are each
// one B-tree descent, so they cost the same at a thousand and a million
// records. A HistorySource can supply the logs of some actors from
// elsewhere (a session's own events).
//
// The Host keeps at most Options.MaxOpen system databases open, closing the
// least recently used when it needs room and any unused for
// Options.IdleTimeout, so thousands of actors fit in a few file
// descriptors.
//
// # Scheduled tasks
//
// Ref.Schedule stores a task (a handler name and a JSON payload) to run At
// a time, After a delay, or on a Cron expression. Host.Run runs due tasks
// through the handlers registered with Host.Handle. Tasks survive
// restarts; one whose time passed while no Host ran runs once, late, when
// Run starts (a cron task then moves on to its next time, without running
// once per missed time). A one-off task is removed after a run that
// returns nil; a failed run is retried after Options.RetryDelay, doubling,
// up to Options.MaxAttempts runs, then the task stays listed as Failed. The
// attempt count is stored before each run, so a handler that crashes the
// process does not run forever. Across a crash a task may run again (at
// least once, never lost).
//
// Run finds due actors through a small index, {Dir}/schedules.db, written
// before each task, so it never opens every actor's database to look.
//
// # Migration from the key-value layout
//
// Earlier builds kept the same stores as key-value entries under
// agentkit/v1/{agent}/actors/{actorId}/ (state, messages/{seq},
// events/{seq}, schedules/{id}, seq zero-padded to 20 digits). With
// Options.Store, an actor of Options.LegacyClass with no database reads
// from there, and its first write migrates it; a read never does. The
// migration claims a marker key ({prefix}migrated, naming this host),
// copies every record into a new database built under a temporary name,
// moves it into place and syncs it, then marks the migration done and
// deletes the copied keys. A crash at any step leaves the key-value
// records readable until the database is durable, and the next write
// finishes the job. The marker stays: a host that finds it but lacks the
// database refuses the actor with a *MigratedError naming the host that
// has it, instead of serving an empty actor.
package actor
