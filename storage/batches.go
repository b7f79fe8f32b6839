package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentkit/kv"
	"agentkit/record"
)

// DefaultPartSize is the largest value the record layer writes in one key
// unless the backend says its limit is lower (a MaxValueSize() int method,
// as NATS's driver has): an event batch whose record would be larger is
// stored in parts of at most this size. It fits every driver agentkit
// ships, NATS's 1 MiB default included.
const DefaultPartSize = 512 << 10

// Batch is one event batch of a session: the events of one commit, in
// sequence order, as the JSON documents the runtime recorded.
type Batch struct {
	// SessionID is the session the batch belongs to.
	SessionID string `json:"sessionId"`
	// Number is the batch's number in its key (events/{batch}).
	Number int64 `json:"batch"`
	// ID is the batch's random id, which the head names. Empty in a batch
	// written before heads existed.
	ID string `json:"id,omitempty"`
	// Prev and PrevID name the batch this one follows (0 and "" for the
	// first). A batch without an ID follows batch Number-1.
	Prev   int64  `json:"prev,omitempty"`
	PrevID string `json:"prevId,omitempty"`
	// Writer is the host id of the host that wrote the batch.
	Writer string `json:"writer,omitempty"`
	// Events are the batch's events.
	Events []json.RawMessage `json:"events"`
}

// prev returns the batch this one follows.
func (b Batch) prev() BatchRef {
	if b.ID == "" {
		return BatchRef{Number: b.Number - 1}
	}
	return BatchRef{Number: b.Prev, ID: b.PrevID}
}

// batchRecord is a batch as stored. A batch too large for one value keeps
// its events in parts (keys.BatchPart): Parts, Size and SHA256 describe
// them and Events is empty; such a record is format version 2.
type batchRecord struct {
	Batch
	Parts  int    `json:"parts,omitempty"`
	Size   int    `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// RecordVersion is 2 for a batch stored in parts, which a version-1
// reader would take for an empty batch.
func (r batchRecord) RecordVersion() int {
	if r.Parts > 0 {
		return 2
	}
	return 1
}

// NewBatchID returns a fresh random batch id: 32 hex digits.
func NewBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// partSize is the largest value written in one key.
func (b *Binding) partSize() int {
	n := DefaultPartSize
	if m, ok := b.db.Backend().(interface{ MaxValueSize() int }); ok {
		if limit := m.MaxValueSize() - 4<<10; limit > 0 && limit < n {
			n = limit
		}
	}
	return n
}

// batchOps returns the writes that store batch b at its number: its parts
// first when it is too large for one value (under keys unique to its id,
// so no other host ever writes them), then its record, created only if
// the number is free (the last op, a PutIfAbsent).
func (s *Sessions) batchOps(b Batch) ([]kv.BatchOp, error) {
	k, err := key(s.a.keys.EventBatch(b.SessionID, uint64(b.Number)))
	if err != nil {
		return nil, err
	}
	rec := batchRecord{Batch: b}
	data, err := record.Marshal(KindEventBatch, rec)
	if err != nil {
		return nil, err
	}
	var ops []kv.BatchOp
	if size := s.a.b.partSize(); len(data) > size {
		events, err := json.Marshal(b.Events)
		if err != nil {
			return nil, fmt.Errorf("storage: encoding the events of batch %d: %w", b.Number, err)
		}
		sum := sha256.Sum256(events)
		rec = batchRecord{Batch: b, Size: len(events), SHA256: hex.EncodeToString(sum[:])}
		rec.Events = nil
		for off := 0; off < len(events); off += size {
			rec.Parts++
			pk, err := key(s.a.keys.BatchPart(b.SessionID, b.ID, uint64(rec.Parts)))
			if err != nil {
				return nil, err
			}
			ops = append(ops, kv.BatchOp{Kind: kv.BatchPut, Key: pk, Value: events[off:min(off+size, len(events))]})
		}
		if data, err = record.Marshal(KindEventBatch, rec); err != nil {
			return nil, err
		}
	}
	return append(ops, kv.BatchOp{Kind: kv.BatchPutIfAbsent, Key: k, Value: data}), nil
}

// writeBatch stores batch b at its number, one write at a time
// (batchOps): the parts with Put, then the record, created only if the
// number is free (PutIfAbsent) on a store with the CAS group. A taken
// number is an error matching kv.ErrExists; so is, on a store with Get but
// without the CAS group, a number found taken by a Get first.
func (s *Sessions) writeBatch(ctx context.Context, b Batch) error {
	ops, err := s.batchOps(b)
	if err != nil {
		return err
	}
	for _, op := range ops[:len(ops)-1] {
		if err := s.db().Put(ctx, op.Key, op.Value); err != nil {
			return err
		}
	}
	rec := ops[len(ops)-1]
	switch {
	case s.caps().CAS:
		_, err = s.db().PutIfAbsent(ctx, rec.Key, rec.Value)
		return err
	case s.caps().Get:
		if _, err := s.db().Get(ctx, rec.Key); err == nil {
			return &kv.Error{Driver: s.a.b.name, Op: "put", Key: rec.Key, Err: fmt.Errorf("%w: %w", kv.ErrConflict, kv.ErrExists)}
		} else if !errors.Is(err, kv.ErrNotFound) {
			return err
		}
	}
	return s.db().Put(ctx, rec.Key, rec.Value)
}

// readBatchRecord reads the record of batch n, without its parts. It
// returns the record, the bytes read and an error matching kv.ErrNotFound
// when the batch is not there.
func (s *Sessions) readBatchRecord(ctx context.Context, id string, n int64) (batchRecord, int64, error) {
	k, err := key(s.a.keys.EventBatch(id, uint64(n)))
	if err != nil {
		return batchRecord{}, 0, err
	}
	if !s.caps().Get {
		return batchRecord{}, 0, fmt.Errorf("storage: %q cannot read event batches (no Get): %w", s.a.b.name, kv.ErrNotFound)
	}
	data, err := s.db().Get(ctx, k)
	if err != nil {
		return batchRecord{}, 0, err
	}
	var rec batchRecord
	if _, err := record.Unmarshal(KindEventBatch, k, data, &rec); err != nil {
		return batchRecord{}, int64(len(data)), err
	}
	if rec.SessionID != id || rec.Number != n {
		return batchRecord{}, int64(len(data)), fmt.Errorf("%w: the event batch at %q is batch %d of session %q", ErrBadRecord, k, rec.Number, rec.SessionID)
	}
	return rec, int64(len(data)), nil
}

// readParts reads the events of a batch stored in parts and checks them
// against the record's size and digest.
func (s *Sessions) readParts(ctx context.Context, rec batchRecord) ([]json.RawMessage, int64, error) {
	var buf bytes.Buffer
	buf.Grow(rec.Size)
	for i := 1; i <= rec.Parts; i++ {
		pk, err := key(s.a.keys.BatchPart(rec.SessionID, rec.ID, uint64(i)))
		if err != nil {
			return nil, 0, err
		}
		data, err := s.db().Get(ctx, pk)
		if errors.Is(err, kv.ErrNotFound) {
			return nil, int64(buf.Len()), fmt.Errorf("%w: part %d of %d of event batch %d of session %q is missing", ErrBadRecord, i, rec.Parts, rec.Number, rec.SessionID)
		}
		if err != nil {
			return nil, int64(buf.Len()), err
		}
		buf.Write(data)
	}
	sum := sha256.Sum256(buf.Bytes())
	if buf.Len() != rec.Size || hex.EncodeToString(sum[:]) != rec.SHA256 {
		return nil, int64(buf.Len()), fmt.Errorf("%w: the parts of event batch %d of session %q do not match its size and digest", ErrBadRecord, rec.Number, rec.SessionID)
	}
	var events []json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &events); err != nil {
		return nil, int64(buf.Len()), fmt.Errorf("%w: the parts of event batch %d of session %q do not decode: %v", ErrBadRecord, rec.Number, rec.SessionID, err)
	}
	return events, int64(buf.Len()), nil
}

// readBatch reads batch n with its events (from its parts, if any).
func (s *Sessions) readBatch(ctx context.Context, id string, n int64) (Batch, int64, error) {
	rec, read, err := s.readBatchRecord(ctx, id, n)
	if err != nil || rec.Parts == 0 {
		return rec.Batch, read, err
	}
	events, more, err := s.readParts(ctx, rec)
	rec.Events = events
	return rec.Batch, read + more, err
}

// deleteBatch removes batch n and its parts if it is the batch with id
// batchID: a batch this host wrote and then lost the head with. Nothing
// references it, so removing it is safe; failures are ignored (the batch
// is then an orphan that readers never reach).
func (s *Sessions) deleteBatch(ctx context.Context, id string, n int64, batchID string) {
	if !s.caps().Delete || batchID == "" {
		return
	}
	rec, _, err := s.readBatchRecord(ctx, id, n)
	if err != nil || rec.ID != batchID {
		return
	}
	for i := 1; i <= rec.Parts; i++ {
		if pk, err := s.a.keys.BatchPart(id, batchID, uint64(i)); err == nil {
			_ = s.db().Delete(ctx, pk)
		}
	}
	if k, err := s.a.keys.EventBatch(id, uint64(n)); err == nil {
		_ = s.db().Delete(ctx, k)
	}
}

// Loaded is what Load read of a session.
type Loaded struct {
	// Head is the session's head; for a session written before heads
	// existed, its metadata with BatchID empty.
	Head Head
	// Batches are the batches after the base, oldest first.
	Batches []Batch
	// Diverged is true when the base is not in the store's chain of
	// batches (a copy made before the store was rewritten): Batches then
	// hold the whole session, and the caller's copy is not a prefix of it.
	Diverged bool
	// Version is the head's version, on a store with the CAS group: pass
	// it, with Head, as CommitRequest.Known.
	Version kv.Version
	// Bytes is how many bytes were read.
	Bytes int64
}

// Load reads what the store has of a session beyond base, the last batch
// the caller already holds (the zero BatchRef: nothing): the head, then the
// batches from the head back to base, following each batch's link to the
// one before, so a batch number that a losing host wrote and never linked
// is never read as part of the session. A session without a head is read
// the way it was written before heads existed: its metadata, and batches
// by number (missing ones skipped). A session the store does not have is an
// error matching kv.ErrNotFound; a deleted one ErrSessionDeleted.
func (s *Sessions) Load(ctx context.Context, id string, base BatchRef) (Loaded, error) {
	var l Loaded
	h, ver, n, err := s.readHead(ctx, id)
	l.Bytes, l.Version = n, ver
	switch {
	case errors.Is(err, kv.ErrNotFound):
		legacy, err := s.loadLegacy(ctx, id, base)
		legacy.Bytes += n
		return legacy, err
	case err != nil:
		return l, err
	case h.Deleted:
		return l, fmt.Errorf("%w: %s", ErrSessionDeleted, id)
	case h.Moved != nil:
		l.Head = h
		return l, fmt.Errorf("%w: %s (by host %s, %s)", ErrSessionMoved, id, h.Moved.Host, h.Moved.At.Format(time.RFC3339))
	}
	l.Head = h
	if h.Tip().matches(base) {
		return l, nil
	}
	var read int64
	l.Batches, read, l.Diverged, err = s.walk(ctx, id, h.Tip(), base)
	l.Bytes += read
	if err == nil && l.Diverged {
		var more int64
		l.Batches, more, _, err = s.walk(ctx, id, h.Tip(), BatchRef{})
		l.Bytes += more
	}
	return l, err
}

// walk reads the batches from tip back to (not including) base and returns
// them oldest first. diverged is true when the chain passes below base
// without meeting it.
func (s *Sessions) walk(ctx context.Context, id string, tip, base BatchRef) (batches []Batch, read int64, diverged bool, err error) {
	cur := tip
	for cur.Number > 0 {
		if cur.Number == base.Number {
			if cur.matches(base) {
				break
			}
			diverged = true
			break
		}
		if cur.Number < base.Number {
			diverged = true
			break
		}
		b, n, err := s.readBatch(ctx, id, cur.Number)
		read += n
		if errors.Is(err, kv.ErrNotFound) && cur.ID == "" {
			// A batch from before heads whose write was dropped.
			cur = BatchRef{Number: cur.Number - 1}
			continue
		}
		if err != nil {
			return nil, read, false, err
		}
		if cur.ID != "" && b.ID != cur.ID {
			return nil, read, false, fmt.Errorf("%w: event batch %d of session %q has id %q where its successor names %q", ErrBadRecord, cur.Number, id, b.ID, cur.ID)
		}
		batches = append(batches, b)
		cur = b.prev()
	}
	for i, j := 0, len(batches)-1; i < j; i, j = i+1, j-1 {
		batches[i], batches[j] = batches[j], batches[i]
	}
	return batches, read, diverged, nil
}

// loadLegacy reads a session written before heads existed: the metadata,
// then the batches after base by number.
func (s *Sessions) loadLegacy(ctx context.Context, id string, base BatchRef) (Loaded, error) {
	var l Loaded
	m, n, err := s.ReadMeta(ctx, id)
	l.Bytes = n
	if err != nil {
		return l, err
	}
	l.Head = Head{SessionMeta: m}
	if base.Number > m.Batches {
		l.Diverged = true
		base = BatchRef{}
	}
	for b := base.Number + 1; b <= m.Batches; b++ {
		batch, n, err := s.readBatch(ctx, id, b)
		l.Bytes += n
		if errors.Is(err, kv.ErrNotFound) {
			continue // a dropped write
		}
		if err != nil {
			return l, err
		}
		l.Batches = append(l.Batches, batch)
	}
	return l, nil
}

// chainHas reports whether the chain ending at tip passes through batch
// (n, batchID): whether a batch a host committed is still part of the
// session after other hosts committed on top of it.
func (s *Sessions) chainHas(ctx context.Context, id string, tip BatchRef, n int64, batchID string) (bool, error) {
	cur := tip
	for cur.Number > n {
		rec, _, err := s.readBatchRecord(ctx, id, cur.Number)
		if errors.Is(err, kv.ErrNotFound) && cur.ID == "" {
			cur = BatchRef{Number: cur.Number - 1}
			continue
		}
		if err != nil {
			return false, err
		}
		cur = rec.prev()
	}
	return cur.Number == n && cur.ID == batchID, nil
}
