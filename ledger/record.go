package ledger

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"agentkit/record"
)

// FormatVersion is the format of every record the ledger writes (control
// records, payload blobs, turns, large outputs, dead letters, kept keys), in the "v"
// field. A record with a higher version was written by a newer agentkit and
// is refused with ErrFormat, never misread.
const FormatVersion = 1

// control is a session's control record: the lease, the committed head and
// the inbox index in one CAS-written value, so one compare-and-set checks the
// fence and makes the change together.
type control struct {
	Version int    `json:"v"`
	Session string `json:"session"`
	// Holder is the host id holding the lease, "" for none.
	Holder string `json:"holder,omitempty"`
	// Gen is the generation: it grows by one with every acquisition,
	// takeover and deletion, and fences every older holder.
	Gen uint64 `json:"gen"`
	// Renew counts the holder's writes within the generation; a contender
	// watches (Gen, Renew) to decide that a holder is gone.
	Renew uint64 `json:"renew"`
	// Commit is the sequence number of the last committed turn (0: none).
	Commit uint64 `json:"commit"`
	// LastTurn is the id of the last committed turn's attempt.
	LastTurn string `json:"lastTurn,omitempty"`
	// NextSeq is the inbox sequence number of the next delivery.
	NextSeq uint64 `json:"nextSeq"`
	// Epoch is the blob epoch; see sweep.
	Epoch uint64 `json:"epoch"`
	// Swept is Commit as of the last orphan sweep.
	Swept uint64 `json:"swept,omitempty"`
	// Pending is the inbox, in delivery order.
	Pending []entry `json:"pending,omitempty"`
	// Recent are the last consumed event ids (the de-duplication window),
	// oldest first.
	Recent []recent `json:"recent,omitempty"`
	// Unflushed are committed turns not yet known to be written to their
	// turns/{seq} key, in commit order.
	Unflushed []turnRecord `json:"unflushed,omitempty"`
	// Deleted is set on a tombstone.
	Deleted *tombstone `json:"deleted,omitempty"`
	// Created and Updated are wall-clock times for display only (the
	// protocol never compares clocks).
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// Write is a nonce unique to the write that produced this value, so a
	// writer whose compare-and-set had an unknown outcome recognises its
	// own write on re-reading.
	Write string `json:"w"`
	// Keys counts the kept keys (data/{sid}/keys/{eventId}) of keyed ids
	// that have left Recent: the write that evicts an id adds it, and the
	// janitor's collection counts them again from a listing. It is never
	// below their true number, so 0 means no kept key needs reading.
	Keys int `json:"keys,omitempty"`
	// KeysAt is about when the oldest counted kept key was written (the
	// writer's wall clock): the janitor collects once it has expired.
	KeysAt time.Time `json:"keysAt,omitzero"`
	// KeysSwept counts the collections, so that one can tell whether
	// another ran meanwhile.
	KeysSwept uint64 `json:"keysSwept,omitempty"`
}

// entry is one pending event.
type entry struct {
	Seq uint64 `json:"seq"`
	ID  string `json:"id"`
	// Inline holds a small payload; otherwise Blob is "{epoch}/{nonce}" of
	// its blob.
	Inline json.RawMessage `json:"inline,omitempty"`
	Blob   string          `json:"blob,omitempty"`
	Size   int             `json:"size"`
	// Attempts counts the turns started on this event, written before each
	// starts, so a crash loop is counted too.
	Attempts int `json:"attempts,omitempty"`
	// LastError is the error of the last failed attempt, when it was seen.
	LastError string `json:"lastError,omitempty"`
	// Replayed marks an event put back from the dead-letter store; From is
	// the inbox sequence of the dead-lettering it came from, whose record
	// is deleted before the event's commit.
	Replayed bool   `json:"replayed,omitempty"`
	From     uint64 `json:"from,omitempty"`
	// Keyed marks an event whose id a source retries (Event.Keyed).
	Keyed bool `json:"k,omitempty"`
}

// recent is a consumed event id in the de-duplication window.
type recent struct {
	ID string `json:"id"`
	// Seq is the commit sequence of the turn that consumed it; 0 when it
	// was dead-lettered.
	Seq  uint64 `json:"seq,omitempty"`
	Dead bool   `json:"dead,omitempty"`
	// Inbox is the inbox sequence of a dead-lettered event: its record is
	// dlq/{sid}/{id}/{Inbox}, and any other record of the id is stale.
	Inbox uint64 `json:"inbox,omitempty"`
	// Keyed marks a keyed event: its key is kept (keptKey) before it
	// leaves the window.
	Keyed bool `json:"k,omitempty"`
}

// tombstone records a deletion.
type tombstone struct {
	At   time.Time `json:"at"`
	Host string    `json:"host"`
	// Discarded lists the events that were pending when the session was
	// deleted: acknowledged, then dropped by the deletion.
	Discarded []string `json:"discarded,omitempty"`
	// Purged is true once the session's other keys were deleted.
	Purged bool `json:"purged,omitempty"`
}

// turnRecord is a committed turn: in the control record until flushed (with
// Ref instead of Output when the output is large), then at
// data/{sid}/turns/{seq} with its Output.
type turnRecord struct {
	Version int    `json:"v"`
	Session string `json:"session,omitempty"`
	Seq     uint64 `json:"seq"`
	Gen     uint64 `json:"gen"`
	Holder  string `json:"holder"`
	TurnID  string `json:"turn"`
	// EventIDs and InboxSeqs are the consumed events, in inbox order.
	EventIDs  []string          `json:"events"`
	InboxSeqs []uint64          `json:"inbox"`
	Output    []json.RawMessage `json:"output,omitempty"`
	Ref       string            `json:"ref,omitempty"`
	At        time.Time         `json:"at"`
}

// blobRecord is an event payload stored apart from the control record.
type blobRecord struct {
	Version int             `json:"v"`
	Session string          `json:"session"`
	EventID string          `json:"event"`
	Payload json.RawMessage `json:"payload"`
}

// deadLetter is the record at dlq/{sid}/{eventId}/{inboxSeq}. It is
// created with PutIfAbsent and never deleted while the session lives: a
// replay or a drop overwrites it with a tombstone (Closed set), so a late
// copy of the creating write, from a host that froze while writing it, can
// never bring it back.
type deadLetter struct {
	Version int `json:"v"`
	// Closed is "replayed" or "dropped" on a tombstone.
	Closed    string          `json:"closed,omitempty"`
	Session   string          `json:"session"`
	EventID   string          `json:"event"`
	InboxSeq  uint64          `json:"inboxSeq"`
	Payload   json.RawMessage `json:"payload"`
	Attempts  int             `json:"attempts"`
	LastError string          `json:"lastError,omitempty"`
	Gen       uint64          `json:"gen"`
	Holder    string          `json:"holder"`
	At        time.Time       `json:"at"`
	// Keyed is the event's Keyed, so a replay keeps it.
	Keyed bool `json:"keyed,omitempty"`
}

// keptKey is the record at data/{sid}/keys/{eventId}: the id of a keyed
// event that left the de-duplication window, kept for IdempotencyWindow so
// that a retry is still recognised. The holder writes it before the write
// that evicts the id from Recent, so an id leaves the window only once its
// kept key is in the store; the janitor deletes it once
// IdempotencyWindow + ClockSkew have passed since At.
type keptKey struct {
	Version int    `json:"v"`
	Session string `json:"session"`
	EventID string `json:"event"`
	// Seq is the turn that consumed the event; Dead and Inbox are set
	// instead when it was dead-lettered (as in recent).
	Seq   uint64 `json:"seq,omitempty"`
	Dead  bool   `json:"dead,omitempty"`
	Inbox uint64 `json:"inbox,omitempty"`
	// At is when it was written, on the writing host's wall clock; Host
	// is that host.
	At   time.Time `json:"at"`
	Host string    `json:"host"`
}

func (c *control) clone() *control {
	if c == nil {
		return nil
	}
	d := *c
	d.Pending = slices.Clone(c.Pending)
	d.Recent = slices.Clone(c.Recent)
	d.Unflushed = slices.Clone(c.Unflushed)
	if c.Deleted != nil {
		t := *c.Deleted
		d.Deleted = &t
	}
	return &d
}

// pendingBytes is the payload size of the inbox.
func (c *control) pendingBytes() (total, inline int64) {
	for _, e := range c.Pending {
		total += int64(e.Size)
		if e.Blob == "" {
			inline += int64(e.Size)
		}
	}
	return total, inline
}

// find reports where an event id is known: pending (index), or recent.
func (c *control) find(id string) (pending int, rec *recent) {
	for i := range c.Pending {
		if c.Pending[i].ID == id {
			return i, nil
		}
	}
	for i := len(c.Recent) - 1; i >= 0; i-- {
		if c.Recent[i].ID == id {
			return -1, &c.Recent[i]
		}
	}
	return -1, nil
}

// maxEvict bounds the ids one write pushes out of the window, so that the
// kept keys written before it stay few (after DedupWindow was lowered, the
// window shrinks over several writes).
const maxEvict = 32

// evicted returns the ids that remember(·, n) pushes out of the window, the
// oldest first.
func (c *control) evicted(n int) []recent {
	over := min(len(c.Recent)+1-n, maxEvict)
	if over <= 0 {
		return nil
	}
	return c.Recent[:over]
}

// remember adds a consumed id to the window, keeping the last n (dropping
// at most maxEvict at once).
func (c *control) remember(r recent, n int) {
	over := len(c.evicted(n))
	c.Recent = append(c.Recent, r)
	if over > 0 {
		c.Recent = slices.Delete(c.Recent, 0, over)
	}
}

// keep counts the kept keys of evicted keyed ids, written at the times in
// at.
func (c *control) keep(evicted []recent, at map[string]time.Time) {
	for _, e := range evicted {
		if t := at[e.ID]; c.Keys == 0 || c.KeysAt.IsZero() || t.Before(c.KeysAt) {
			c.KeysAt = t
		}
		c.Keys++
	}
}

// unflushed returns the unflushed record of seq.
func (c *control) unflushed(seq uint64) *turnRecord {
	for i := range c.Unflushed {
		if c.Unflushed[i].Seq == seq {
			return &c.Unflushed[i]
		}
	}
	return nil
}

// dropFlushed removes unflushed turns up to and including seq.
func (c *control) dropFlushed(seq uint64) {
	c.Unflushed = slices.DeleteFunc(c.Unflushed, func(t turnRecord) bool { return t.Seq <= seq })
}

// The kinds of the ledger's records (package record's version rule):
// each record type carries its version in its first field, "v", because a
// turn record also lives inside the control record.
var (
	kindControl    = record.NewKind("control record", FormatVersion)
	kindTurn       = record.NewKind("turn record", FormatVersion)
	kindBlob       = record.NewKind("payload blob", FormatVersion)
	kindDeadLetter = record.NewKind("dead letter", FormatVersion)
	kindKeptKey    = record.NewKind("kept idempotency key", FormatVersion)
)

// decode reads a ledger record of kind k into v (record.Unmarshal): an
// error matching ErrFormat (record.ErrUnreadable) when it is not one, or
// of a newer format.
func decode[T any](k record.Kind, data []byte) (*T, error) {
	v := new(T)
	if _, err := record.Unmarshal(k, k.String(), data, v); err != nil {
		return nil, err
	}
	return v, nil
}

func decodeControl(data []byte) (*control, error) { return decode[control](kindControl, data) }
func decodeTurn(data []byte) (*turnRecord, error) { return decode[turnRecord](kindTurn, data) }
func decodeBlob(data []byte) (*blobRecord, error) { return decode[blobRecord](kindBlob, data) }
func decodeDeadLetter(data []byte) (*deadLetter, error) {
	return decode[deadLetter](kindDeadLetter, data)
}
func decodeKeptKey(data []byte) (*keptKey, error) { return decode[keptKey](kindKeptKey, data) }

// encode encodes a ledger record of kind k (record.Marshal). The records
// are the package's own types, so a failure is a bug.
func encode(k record.Kind, v any) []byte {
	b, err := record.Marshal(k, v)
	if err != nil {
		panic(err)
	}
	return b
}

// mustJSON encodes a plain JSON value (tests: payloads and outputs).
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("ledger: encoding a record: %v", err)) // unreachable: plain structs and validated raw JSON
	}
	return b
}
