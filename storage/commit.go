package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// maxSkip bounds how many taken batch numbers Commit steps over (batches
// that hosts wrote and never linked, because they lost the head or died
// before writing it).
const maxSkip = 16

// CommitRequest is one attempt to append a batch to a session in the store.
type CommitRequest struct {
	// Writer is the committing host's id.
	Writer string
	// Base is the last batch the host's copy holds, committed earlier by
	// it or read from the store (the zero BatchRef: none yet).
	Base BatchRef
	// Meta is the session's metadata as of the batch's last event: the
	// head's body. Commit sets its Batches.
	Meta SessionMeta
	// BatchID is the new batch's id (NewBatchID). An attempt whose outcome
	// is unknown (a store error) is retried with the same id, Base, Meta
	// and Events, so Commit can tell its own earlier write from another
	// host's.
	BatchID string
	// Events are the events after Base, in order. At least one.
	Events []json.RawMessage
	// Retry says an earlier attempt with this BatchID may have reached the
	// store (its outcome is unknown). Commit then also looks for that
	// batch below a head that moved on.
	Retry bool
	// Known, when set, is the head as the caller last read or wrote it,
	// with its version (Loaded.Head and Loaded.Version, or the result of
	// its last Commit): Commit uses it instead of reading the head. A stale
	// one is safe: the head write then fails its compare-and-set, and
	// Commit reads the head as it would have. Ignored on a store without
	// the CAS group, and on a retry.
	Known *KnownHead
	// Copies, when set, asks Commit to write the session's copies with
	// the batch: its metadata (sessions/{id}/meta) and index entry for
	// Meta, the removal of the previous index entry, and its continuation
	// token's record. On a store with the batch capability they go in the
	// same atomic batch as the event batch and the head, so they are
	// written exactly when the head is; elsewhere Commit leaves them to
	// the caller (CommitResult.Copied is false).
	Copies *Copies
}

// Copies are the records a commit writes beside the batch and the head.
type Copies struct {
	// PrevIndexKey is the session-index entry the session's last commit
	// wrote; it is removed when the new entry's key differs ("" for none).
	PrevIndexKey string
	// TokenDigest is the digest of the continuation token to record
	// (continuations/{digest}), or "" when the store has it already.
	TokenDigest string
}

// KnownHead is a session head with its version, as a host last saw it.
type KnownHead struct {
	// Head is the head; it is not a tombstone.
	Head Head
	// Version is its version; empty means the session had no head.
	Version kv.Version
}

// Outcome is how a commit ended.
type Outcome int

// The outcomes of Commit.
const (
	// Committed: the batch is in the store, linked from the head (which
	// another host may already have moved past).
	Committed Outcome = iota + 1
	// Behind: the store's head is not the request's base: another host
	// committed batches this host's copy lacks. Nothing was written (a
	// batch written before the head was found moved is removed again).
	Behind
	// Deleted: the session's head is a tombstone.
	Deleted
	// Moved: the session's head is marked moved to the session ledger.
	Moved
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case Behind:
		return "behind"
	case Deleted:
		return "deleted"
	case Moved:
		return "moved"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// CommitResult is what Commit did.
type CommitResult struct {
	Outcome Outcome
	// Batch is the committed batch (Committed).
	Batch BatchRef
	// Head is the head Commit wrote (Committed, unless another host has
	// committed on top of the batch since) or found (Behind, Deleted).
	Head Head
	// Version is the version of the head Commit wrote, when it wrote it
	// and the store has the CAS group: pass it back as Known.
	Version kv.Version
	// Copied says the request's Copies were written with the head, and
	// IndexKey is then the index entry's key.
	Copied   bool
	IndexKey string
}

// Commit appends a batch to a session in the store, never overwriting what
// another host committed. It is the session mirror's one write path for
// batches and heads:
//
//  1. Read the head. A tombstone ends with Deleted. A head that is not
//     req.Base (another host committed since this host's copy was made)
//     ends with Behind, unless it is this request's own batch from an
//     earlier attempt, or links back to it (Committed).
//  2. Write the batch at the next free number after the base with
//     PutIfAbsent, its parts first: a batch record is never overwritten, so
//     a host racing for the same number (or a slow one) can only fail to
//     create it and move on, never replace what another host's head names.
//  3. Write the head naming the batch with PutIfVersion over the version
//     read in step 1 (PutIfAbsent for a session's first commit). The store
//     lets one host win. A loser reads the head again: if it names (or
//     links back to) the loser's batch, the write had landed and only the
//     answer was lost (Committed); otherwise the loser removes its batch
//     and gets Behind (or Deleted), so its turn stays on its own disk as a
//     fork.
//
// A head always names a batch that is already complete in the store, so a
// reader never waits for one. A store error in any step is returned as it
// is: the outcome is unknown, and the caller retries the same request
// later (same BatchID, Base, Meta and Events).
//
// On a store with the batch capability (kv.Batcher) steps 2 and 3 are one
// atomic batch: the parts, the batch (create-only), the head (compare-and-
// set) and the requested Copies are written together or not at all, in
// one round trip. A loser then has nothing to remove.
//
// Without the CAS group the head and batch are written with Get-then-Put
// (still refusing to write over a head that moved, but with a window
// between the read and the write); without Get, blindly.
func (s *Sessions) Commit(ctx context.Context, req CommitRequest) (CommitResult, error) {
	id := req.Meta.ID
	switch {
	case id == "":
		return CommitResult{}, errors.New("storage: CommitRequest.Meta.ID is empty")
	case req.BatchID == "":
		return CommitResult{}, errors.New("storage: CommitRequest.BatchID is empty; use NewBatchID")
	case len(req.Events) == 0:
		return CommitResult{}, errors.New("storage: CommitRequest.Events is empty; there is nothing to commit")
	}
	var h Head
	var ver kv.Version
	var err error
	if k := req.Known; k != nil && s.caps().CAS && !req.Retry {
		h, ver = k.Head, k.Version
		if ver == "" {
			err = fmt.Errorf("storage: known to have no head: %w", kv.ErrNotFound)
		}
	} else {
		h, ver, err = s.ReadHead(ctx, id)
	}
	absent := errors.Is(err, kv.ErrNotFound)
	switch {
	case absent && !s.caps().Get:
		// A store that cannot be read: write blindly.
	case absent && req.Base.Number == 0:
		// No head and no batch yet: a new session.
	case absent:
		// No head: a session written before heads existed, whose metadata
		// then says how far the store is.
		if m, _, err := s.ReadMeta(ctx, id); err == nil {
			if m.Batches > req.Base.Number {
				return CommitResult{Outcome: Behind, Head: Head{SessionMeta: m}}, nil
			}
		} else if !errors.Is(err, kv.ErrNotFound) {
			return CommitResult{}, err
		}
	case err != nil:
		return CommitResult{}, err
	case h.Deleted:
		return CommitResult{Outcome: Deleted, Head: h}, nil
	case h.Moved != nil:
		return CommitResult{Outcome: Moved, Head: h}, nil
	case h.BatchID == req.BatchID:
		// An earlier attempt of this request landed.
		return CommitResult{Outcome: Committed, Batch: h.Tip(), Head: h}, nil
	case !h.Tip().matches(req.Base) && !req.Retry:
		return CommitResult{Outcome: Behind, Head: h}, nil
	case !h.Tip().matches(req.Base):
		if n, ok, err := s.findOwn(ctx, id, h, req); err != nil {
			return CommitResult{}, err
		} else if ok {
			return CommitResult{Outcome: Committed, Batch: BatchRef{Number: n, ID: req.BatchID}, Head: h}, nil
		}
		return CommitResult{Outcome: Behind, Head: h}, nil
	}

	if s.caps().Batch {
		return s.commitBatch(ctx, req, ver)
	}
	n, err := s.placeBatch(ctx, req)
	if err != nil {
		return CommitResult{}, err
	}
	next := Head{SessionMeta: req.Meta, BatchID: req.BatchID, Writer: req.Writer}
	next.Batches = n
	nv, err := s.putHead(ctx, next, ver)
	if err == nil {
		return CommitResult{Outcome: Committed, Batch: next.Tip(), Head: next, Version: nv}, nil
	}
	if !errors.Is(err, kv.ErrConflict) {
		return CommitResult{}, err
	}
	// Lost the head, or won it with an earlier attempt whose answer was
	// lost: look again, and never report a conflict for an own success.
	return s.lostHead(ctx, req, n, true)
}

// placeBatch writes the request's batch at the first free number after the
// base and returns the number. A number holding this request's batch (from
// an earlier attempt) is taken as placed.
func (s *Sessions) placeBatch(ctx context.Context, req CommitRequest) (int64, error) {
	b := Batch{
		SessionID: req.Meta.ID, ID: req.BatchID, Prev: req.Base.Number, PrevID: req.Base.ID,
		Writer: req.Writer, Events: req.Events,
	}
	for n := req.Base.Number + 1; n <= req.Base.Number+maxSkip; n++ {
		b.Number = n
		err := s.writeBatch(ctx, b)
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, kv.ErrConflict) {
			return 0, err
		}
		rec, _, rerr := s.readBatchRecord(ctx, req.Meta.ID, n)
		switch {
		case rerr == nil && rec.ID == req.BatchID:
			return n, nil
		case rerr != nil && !errors.Is(rerr, kv.ErrNotFound):
			return 0, rerr
		}
		// Another host's batch, or one deleted meanwhile: try the next
		// number.
	}
	return 0, fmt.Errorf("storage: session %q: batch numbers %d to %d after the head are all taken by batches no head names; a host is writing them faster than it commits", req.Meta.ID, req.Base.Number+1, req.Base.Number+maxSkip)
}

// findOwn looks for the request's batch, from an earlier attempt, in the
// chain of head h (which moved past the base): if the attempt landed and
// other hosts committed on top of it, it is there. If it is not, a batch
// the attempt left unlinked is removed.
func (s *Sessions) findOwn(ctx context.Context, id string, h Head, req CommitRequest) (int64, bool, error) {
	for n := req.Base.Number + 1; n <= req.Base.Number+maxSkip && n <= h.Batches; n++ {
		rec, _, err := s.readBatchRecord(ctx, id, n)
		if errors.Is(err, kv.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		if rec.ID != req.BatchID {
			continue
		}
		ok, err := s.chainHas(ctx, id, h.Tip(), n, req.BatchID)
		if err != nil || ok {
			return n, ok, err
		}
		s.deleteBatch(ctx, id, n, req.BatchID)
		return 0, false, nil
	}
	return 0, false, nil
}

// commitBatch is steps 2 and 3 of Commit in one atomic batch per attempt:
// the batch's parts, the batch record at the next free number (create-
// only), the head over version ver, and the Copies. A taken number is
// stepped over as placeBatch does; a lost head leaves nothing behind.
func (s *Sessions) commitBatch(ctx context.Context, req CommitRequest, ver kv.Version) (CommitResult, error) {
	id := req.Meta.ID
	b := Batch{
		SessionID: id, ID: req.BatchID, Prev: req.Base.Number, PrevID: req.Base.ID,
		Writer: req.Writer, Events: req.Events,
	}
	for n := req.Base.Number + 1; n <= req.Base.Number+maxSkip; n++ {
		b.Number = n
		next := Head{SessionMeta: req.Meta, BatchID: req.BatchID, Writer: req.Writer}
		next.Batches = n
		ops, err := s.batchOps(b)
		if err != nil {
			return CommitResult{}, err
		}
		batchAt := len(ops) - 1
		headOp, err := s.headOp(next, ver)
		if err != nil {
			return CommitResult{}, err
		}
		headAt := len(ops)
		ops = append(ops, headOp)
		var indexKey string
		if req.Copies != nil {
			var copies []kv.BatchOp
			if copies, indexKey, err = s.copyOps(next.SessionMeta, *req.Copies); err != nil {
				return CommitResult{}, err
			}
			ops = append(ops, copies...)
		}
		vers, err := s.db().WriteBatch(ctx, ops)
		if err == nil {
			return CommitResult{Outcome: Committed, Batch: next.Tip(), Head: next, Version: vers[headAt], Copied: req.Copies != nil, IndexKey: indexKey}, nil
		}
		var be *kv.BatchError
		if !errors.Is(err, kv.ErrConflict) || !errors.As(err, &be) {
			return CommitResult{}, err
		}
		switch be.Index {
		case batchAt:
			// The number is taken: by another host's batch (next number),
			// or, when an earlier attempt of this request wrote its batch
			// without its head, by this one.
			rec, _, rerr := s.readBatchRecord(ctx, id, n)
			switch {
			case rerr == nil && rec.ID == req.BatchID:
				return s.commitHeadOnly(ctx, req, next, ver)
			case rerr != nil && !errors.Is(rerr, kv.ErrNotFound):
				return CommitResult{}, rerr
			}
			continue
		case headAt:
			return s.lostHead(ctx, req, n, false)
		}
		return CommitResult{}, err
	}
	return CommitResult{}, fmt.Errorf("storage: session %q: batch numbers %d to %d after the head are all taken by batches no head names; a host is writing them faster than it commits", id, req.Base.Number+1, req.Base.Number+maxSkip)
}

// commitHeadOnly writes the head (and copies) naming a batch an earlier
// attempt placed.
func (s *Sessions) commitHeadOnly(ctx context.Context, req CommitRequest, next Head, ver kv.Version) (CommitResult, error) {
	headOp, err := s.headOp(next, ver)
	if err != nil {
		return CommitResult{}, err
	}
	ops := []kv.BatchOp{headOp}
	var indexKey string
	if req.Copies != nil {
		copies, k, err := s.copyOps(next.SessionMeta, *req.Copies)
		if err != nil {
			return CommitResult{}, err
		}
		ops, indexKey = append(ops, copies...), k
	}
	vers, err := s.db().WriteBatch(ctx, ops)
	if err == nil {
		return CommitResult{Outcome: Committed, Batch: next.Tip(), Head: next, Version: vers[0], Copied: req.Copies != nil, IndexKey: indexKey}, nil
	}
	var be *kv.BatchError
	if errors.Is(err, kv.ErrConflict) && errors.As(err, &be) && be.Index == 0 {
		return s.lostHead(ctx, req, next.Batches, true)
	}
	return CommitResult{}, err
}

// lostHead settles a head write that lost its compare-and-set: the head
// is read again, and an own earlier success (the head names the batch, or
// links back to it) is Committed, never a conflict. Otherwise the request
// is Behind (or Deleted), and its batch at number n, when placed says it
// is there, is removed.
func (s *Sessions) lostHead(ctx context.Context, req CommitRequest, n int64, placed bool) (CommitResult, error) {
	id := req.Meta.ID
	h, _, err := s.ReadHead(ctx, id)
	if err != nil {
		return CommitResult{}, err
	}
	if h.BatchID == req.BatchID {
		return CommitResult{Outcome: Committed, Batch: h.Tip(), Head: h}, nil
	}
	if !h.Deleted {
		ok, err := s.chainHas(ctx, id, h.Tip(), n, req.BatchID)
		if err != nil {
			return CommitResult{}, err
		}
		if ok {
			return CommitResult{Outcome: Committed, Batch: BatchRef{Number: n, ID: req.BatchID}, Head: h}, nil
		}
	}
	if placed {
		s.deleteBatch(ctx, id, n, req.BatchID)
	}
	if h.Deleted {
		return CommitResult{Outcome: Deleted, Head: h}, nil
	}
	return CommitResult{Outcome: Behind, Head: h}, nil
}

// headOp is the write of head h over version ver: PutIfVersion, or
// PutIfAbsent for a session without a head.
func (s *Sessions) headOp(h Head, ver kv.Version) (kv.BatchOp, error) {
	k, err := key(s.a.keys.SessionHead(h.ID))
	if err != nil {
		return kv.BatchOp{}, err
	}
	h.SessionMeta = h.SessionMeta.stored()
	data, err := record.Marshal(KindSessionHead, h)
	if err != nil {
		return kv.BatchOp{}, err
	}
	if ver == "" {
		return kv.BatchOp{Kind: kv.BatchPutIfAbsent, Key: k, Value: data}, nil
	}
	return kv.BatchOp{Kind: kv.BatchPutIfVersion, Key: k, Value: data, Version: ver}, nil
}

// copyOps are the writes of a session's copies for metadata m: the
// metadata record, the index entry (and the removal of the previous one),
// the token's record. It returns them and the index entry's key.
func (s *Sessions) copyOps(m SessionMeta, c Copies) ([]kv.BatchOp, string, error) {
	metaKey, err := key(s.a.keys.SessionMeta(m.ID))
	if err != nil {
		return nil, "", err
	}
	indexKey, err := key(s.a.keys.SessionIndex(m.UpdatedAt, m.ID))
	if err != nil {
		return nil, "", err
	}
	data, err := record.Marshal(KindSessionMeta, m.stored())
	if err != nil {
		return nil, "", err
	}
	ops := []kv.BatchOp{
		{Kind: kv.BatchPut, Key: metaKey, Value: data},
		{Kind: kv.BatchPut, Key: indexKey, Value: data},
	}
	if c.PrevIndexKey != "" && c.PrevIndexKey != indexKey {
		ops = append(ops, kv.BatchOp{Kind: kv.BatchDelete, Key: c.PrevIndexKey})
	}
	if c.TokenDigest != "" {
		if !keys.IsTokenDigest(c.TokenDigest) {
			return nil, "", fmt.Errorf("storage: Copies.TokenDigest is not a token digest (keys.TokenDigest)")
		}
		tk, err := key(s.a.keys.Continuation(c.TokenDigest))
		if err != nil {
			return nil, "", err
		}
		rec, err := record.Marshal(KindContinuation, continuationRecord{SessionID: m.ID})
		if err != nil {
			return nil, "", err
		}
		ops = append(ops, kv.BatchOp{Kind: kv.BatchPut, Key: tk, Value: rec})
	}
	return ops, indexKey, nil
}
