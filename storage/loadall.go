package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// LoadAll reads a whole session, as Load(ctx, id, BatchRef{}) does, with
// one List over the session's folder (sessions/{id}/: its head, metadata,
// batches and parts) instead of a read per record: the way restore reads
// many sessions. A record the listing missed (written while it ran) is
// read on its own. Without List in the store it is Load.
func (s *Sessions) LoadAll(ctx context.Context, id string) (Loaded, error) {
	if !s.caps().List {
		return s.Load(ctx, id, BatchRef{})
	}
	prefix, err := key(s.a.keys.SessionPrefix(id))
	if err != nil {
		return Loaded{}, err
	}
	var l Loaded
	var head, meta []byte
	batches := map[int64][]byte{}
	parts := map[string][]byte{} // "{batchId}/{n}" -> bytes
	for e, err := range s.db().List(ctx, prefix) {
		if err != nil {
			return l, err
		}
		l.Bytes += int64(len(e.Value))
		rest := strings.TrimPrefix(e.Key, prefix)
		switch {
		case rest == "head":
			head = e.Value
		case rest == "meta":
			meta = e.Value
		case strings.HasPrefix(rest, "events/"):
			if n, err := strconv.ParseInt(strings.TrimPrefix(rest, "events/"), 10, 64); err == nil && n > 0 {
				batches[n] = e.Value
			}
		case strings.HasPrefix(rest, "parts/"):
			parts[strings.TrimPrefix(rest, "parts/")] = e.Value
		}
	}
	lb := listedBatches{s: s, id: id, records: batches, parts: parts}
	if head == nil {
		if meta == nil {
			return l, fmt.Errorf("storage: session %q: %w", id, kv.ErrNotFound)
		}
		legacy, err := lb.legacy(ctx, meta)
		legacy.Bytes += l.Bytes + lb.read
		return legacy, err
	}
	hk, err := key(s.a.keys.SessionHead(id))
	if err != nil {
		return l, err
	}
	var h Head
	if _, err := record.Unmarshal(KindSessionHead, hk, head, &h); err != nil {
		return l, err
	}
	if h.ID != id {
		return l, fmt.Errorf("%w: the session head at %q names session %q", ErrBadRecord, hk, h.ID)
	}
	if h.Deleted {
		return l, fmt.Errorf("%w: %s", ErrSessionDeleted, id)
	}
	l.Head = h
	for cur := h.Tip(); cur.Number > 0; {
		b, err := lb.batch(ctx, cur.Number)
		if errors.Is(err, kv.ErrNotFound) && cur.ID == "" {
			cur = BatchRef{Number: cur.Number - 1} // a batch from before heads whose write was dropped
			continue
		}
		if err != nil {
			l.Bytes += lb.read
			return l, err
		}
		if cur.ID != "" && b.ID != cur.ID {
			l.Bytes += lb.read
			return l, fmt.Errorf("%w: event batch %d of session %q has id %q where its successor names %q", ErrBadRecord, cur.Number, id, b.ID, cur.ID)
		}
		l.Batches = append(l.Batches, b)
		cur = b.prev()
	}
	for i, j := 0, len(l.Batches)-1; i < j; i, j = i+1, j-1 {
		l.Batches[i], l.Batches[j] = l.Batches[j], l.Batches[i]
	}
	l.Bytes += lb.read
	return l, nil
}

// listedBatches decodes batches from a session's listing, reading on its
// own what the listing lacks.
type listedBatches struct {
	s       *Sessions
	id      string
	records map[int64][]byte
	parts   map[string][]byte
	read    int64 // bytes read beyond the listing
}

// batch returns batch n with its events.
func (lb *listedBatches) batch(ctx context.Context, n int64) (Batch, error) {
	data, ok := lb.records[n]
	if !ok {
		b, read, err := lb.s.readBatch(ctx, lb.id, n)
		lb.read += read
		return b, err
	}
	k, err := key(lb.s.a.keys.EventBatch(lb.id, uint64(n)))
	if err != nil {
		return Batch{}, err
	}
	var rec batchRecord
	if _, err := record.Unmarshal(KindEventBatch, k, data, &rec); err != nil {
		return Batch{}, err
	}
	if rec.SessionID != lb.id || rec.Number != n {
		return Batch{}, fmt.Errorf("%w: the event batch at %q is batch %d of session %q", ErrBadRecord, k, rec.Number, rec.SessionID)
	}
	if rec.Parts == 0 {
		return rec.Batch, nil
	}
	var buf bytes.Buffer
	for i := 1; i <= rec.Parts; i++ {
		seg, err := keys.Segment(rec.ID)
		if err != nil {
			return Batch{}, fmt.Errorf("storage: %w", err)
		}
		part, ok := lb.parts[seg+"/"+keys.Seq(uint64(i))]
		if !ok {
			// Not listed: read the parts one by one, checked as Load does.
			events, read, err := lb.s.readParts(ctx, rec)
			lb.read += read
			rec.Events = events
			return rec.Batch, err
		}
		buf.Write(part)
	}
	sum := sha256.Sum256(buf.Bytes())
	if buf.Len() != rec.Size || hex.EncodeToString(sum[:]) != rec.SHA256 {
		return Batch{}, fmt.Errorf("%w: the parts of event batch %d of session %q do not match its size and digest", ErrBadRecord, rec.Number, rec.SessionID)
	}
	if err := json.Unmarshal(buf.Bytes(), &rec.Events); err != nil {
		return Batch{}, fmt.Errorf("%w: the parts of event batch %d of session %q do not decode: %v", ErrBadRecord, rec.Number, rec.SessionID, err)
	}
	return rec.Batch, nil
}

// legacy reads a session written before heads existed from its listed
// metadata and batches, by number.
func (lb *listedBatches) legacy(ctx context.Context, meta []byte) (Loaded, error) {
	var l Loaded
	k, err := key(lb.s.a.keys.SessionMeta(lb.id))
	if err != nil {
		return l, err
	}
	var m SessionMeta
	if _, err := record.Unmarshal(KindSessionMeta, k, meta, &m); err != nil {
		return l, err
	}
	if m.ID != lb.id {
		return l, fmt.Errorf("%w: the session metadata at %q names session %q", ErrBadRecord, k, m.ID)
	}
	l.Head = Head{SessionMeta: m}
	for n := int64(1); n <= m.Batches; n++ {
		if _, ok := lb.records[n]; !ok {
			continue // a dropped write
		}
		b, err := lb.batch(ctx, n)
		if err != nil {
			return l, err
		}
		l.Batches = append(l.Batches, b)
	}
	return l, nil
}
