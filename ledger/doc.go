// Package ledger lets several hosts serve one agent's sessions from one
// shared store without losing or doubling a message: the durable-session
// ledger (05-ledger.md). It is built on the kv contract alone, the CAS
// group for everything that coordinates and plain Put, Get and Delete for
// payloads and committed turns, so it runs on every store agentkit has a
// driver for. CheckStore is its start-up check; Open runs it.
//
// # Keys
//
// Every key is under agentkit/v1/{agent}/durable-session/, the family
// package keys gives the ledger (keys.Scope.LedgerPrefix); inside it the
// ledger builds its keys itself (keys.go), with keys.Segment encoding the
// ids, and package storage, which builds the keys of the runtime's other
// records, never writes there:
//
//	ctl/{sessionId}                                 the control record (compare-and-set only)
//	data/{sessionId}/in/{epoch}/{nonce}             an event payload too large to inline
//	data/{sessionId}/turns/{commitSeq}              a committed turn, written after its commit
//	data/{sessionId}/out/{commitSeq}/{gen}-{turnId} a large turn output, written before its commit
//	data/{sessionId}/keys/{eventId}                 a kept key: a keyed id past the window, written before it leaves it
//	dlq/{sessionId}/{eventId}/{inboxSeq}            a dead letter
//
// Control records have a prefix of their own, so the janitor and Sessions
// read one record per session whatever the sessions hold. Every record
// carries a format version ("v", FormatVersion) under the version rule of
// package record, the runtime's one codec; a newer one is refused with
// ErrFormat, never misread.
//
// # The control record
//
// A fence protects a write only when the check and the write are one
// compare-and-set of one key, so each session has one control record
// holding together the lease (holder, generation, renewal counter), the
// committed head (commit sequence, last turn id), the inbox (next inbox
// sequence, pending entries with their attempts and inline payload or blob
// reference), the de-duplication window (the last DedupWindow consumed
// event ids, default 64, each with the turn that consumed it), the count
// of kept keys, the blob epoch, and the committed turns not yet flushed
// to their own key.
//
// # Delivery: the acknowledgement is one compare-and-set
//
// Deliver appends the event to the inbox with one compare-and-set of the
// control record; its success is the acknowledgement, and nothing is
// acknowledged before it. A payload over InlineLimit is first written to a
// blob. The host caches the record and its version, so an uncontended
// delivery to a session it served last costs exactly that one write and no
// read. A delivery of a known event id (pending, or in the window) is a
// duplicate and writes nothing; so is a keyed one whose id is kept (see
// below). When no host holds the session, the same
// write makes this host the holder with a new generation, and counts the
// first attempt of the head event; otherwise the event waits for the
// holder, which drains it (Delivery.Local tells which). A write whose
// answer was lost is settled by reading the record back: a record carrying
// the write's nonce is the write; an unchanged version means it did not
// land and the very same write is sent again, so a late copy and the
// retry cannot both apply; any other record is judged afresh (the event
// already there is the earlier write).
//
// A full inbox (MaxPending events or MaxPendingBytes of payload) refuses
// the delivery with a BusyError carrying RetryAfter: nothing is
// acknowledged and then dropped.
//
// # Keyed events: idempotency for a time, not a count
//
// An event whose id a source may send again much later (Event.Keyed: a
// client's Idempotency-Key, a reminder's id) is remembered for
// IdempotencyWindow (24 hours by default) after it was consumed, however
// many events follow. Its id leaves the window into a kept key,
// data/{sid}/keys/{eventId}, which the holder writes with a plain put
// BEFORE the compare-and-set that evicts the id (Turn.Commit and
// dead-lettering wait for it), and which the control record counts. A
// delivery of a keyed id the record does not know reads that key after
// it knows the record's version V (a read, or its cached write), and
// appends with a compare-and-set expecting V. An eviction at or before V
// wrote its kept key before this host learnt of V, so the read finds it:
// a duplicate. An eviction after V changed the version, so the append
// fails and is judged again on a fresh read. So de-duplication stays
// atomic with the acknowledgement, still one compare-and-set; a keyed
// delivery reads one key more once the session keeps any, an unkeyed one
// costs what it did. The janitor deletes a kept key once IdempotencyWindow
// + ClockSkew have passed since it was written, on its own wall clock,
// while its id is in neither the inbox nor the window, and counts the
// rest again from a listing (never below the truth, which a delivery
// relies on when the count is 0 and it reads nothing). A keyed delivery to
// a session keeping MaxKeys kept keys is refused with a BusyError (Keys
// set) until the oldest expire. A retry after the window is a new event.
//
// # Turns consume one event each, in inbox order
//
// The holder runs one turn per event, oldest first. One event per turn
// keeps a poison event from taking innocent ones to the dead-letter store
// with it, gives each message its own answer (the turn a client's event id
// finds is the answer to that message), and bounds a turn's length by one
// message. A turn's attempt is counted in the control record before the
// turn starts (riding on the write that acquired the lease or committed
// the previous turn when there is one), so a crash loop is counted too.
//
// # Commits and the committed transcript
//
// Turn.Commit is one compare-and-set that succeeds only while this host
// holds the lease's generation: it removes the event from the inbox,
// advances the commit sequence, records the event id in the window with
// its turn, and carries the turn's record (its output inline, or a
// reference to the out/ key written just before when the output is over
// TurnInlineLimit). Right after, the holder writes the turn to
// turns/{commitSeq}, and its next write drops the turn from the control
// record. Only committed content is ever written to turns/{seq}, always
// the same bytes for a sequence number, so a stale holder can never land
// anything under a key a committed turn is read from. Transcript reads the
// control record first and each turn from it or from turns/{seq}, which is
// written before the record lets go of it: every host reads exactly the
// committed turns, in order, without gaps, whichever host committed them.
// A fenced commit fails with ErrFenced and its output is discarded.
//
// This differs from 05-ledger.md's layout (turn output keyed by generation
// and turn id, written before the commit): keying by commit sequence and
// writing only after the commit gives readers one key per turn, fetched
// directly and in parallel, with no losing attempts to tell apart, for the
// same two writes per turn (a compare-and-set and a put).
//
// # Drain before release
//
// The holder keeps running turns while the inbox has events. It gives the
// lease up with a compare-and-set that clears the holder only if the inbox
// is empty; a delivery that landed meanwhile changed the version, so the
// release fails and the holder drains on. No wake-up is lost. Close hands
// leases over with their events still queued, and other hosts' janitors
// take such sessions at once.
//
// # Leases, clocks and self-fencing
//
// Every write the holder makes counts as a renewal (it bumps the renewal
// counter); a renewal loop, independent of the turn, writes when none has
// happened for Lease/3, so a long model call keeps the lease. Another host
// takes a session over only after the (generation, renewal counter) pair
// has not changed for Lease + Margin on its own monotonic clock, counted
// from when it first read the pair. Wall clocks are never compared across
// hosts. The holder starts no new side effect once
// Lease × (1 − DriftAllowance) has passed since it sent its last
// successful renewal: Turn.Check then fails with ErrSelfFenced and the
// turn's context ends with that cause. Correctness does not rest on clocks:
// a zombie's commit fails the generation check. Side effects outside the
// store cannot be fenced; Turn.IdempotencyKey gives each one a key,
// {sessionId}/{commitSeq}/{n}, the same for every attempt of a turn.
//
// # The janitor and the orphan sweep
//
// Run scans the control records by prefix every JanitorInterval
// (jittered) and takes over, at most TakeoverRate per second, sessions
// whose holder went silent and sessions with events and no holder, and
// collects expired kept keys. The
// sweep deletes an idle session's orphans without clocks: one
// compare-and-set advances the blob epoch from E to E+1, then blobs of
// epoch E-1 or older that the record does not reference are deleted; a
// delivery's append refuses a blob stamped more than one epoch behind the
// record, and writes it again, so a blob whose append is on its way is
// never taken. Large outputs are deleted once their turn is decided or
// their generation can no longer commit.
//
// # Poison events
//
// An event whose turn has started MaxAttempts times (default 5), or whose
// Handler returned an error wrapped with Permanent, is written to the
// dead-letter store with the last attempt's error, then leaves the inbox
// by the holder's compare-and-set, and the session moves on. DeadLetters lists, Replay
// puts an event back at the end of its inbox, Drop removes it. A dead
// letter is created with PutIfAbsent under a key of its own
// dead-lettering and is never deleted: Replay and Drop overwrite it with a
// tombstone, so the late write of a host that froze while dead-lettering
// cannot bring it back.
//
// # What the ledger does not do
//
// It does not fence effects outside the store: a tool called by a turn
// whose lease was lost may have run, which is what idempotency keys are
// for. Only what the handler passes to Commit is committed: files a turn
// writes on the host's disk do not follow a takeover. Effects to run only
// after a turn counts (journal records, hooks) belong after a successful
// Commit. A delivery that failed with an error other than a BusyError may
// have landed; the source retries with the same event id.
package ledger
