package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"agentkit/kv"
)

// MarkMoved marks a session's head moved to the session ledger (to names
// the serving mode), by compare-and-set, so that from the moment it lands
// no host of serving mode local runs or commits a turn of the session: a
// commit finds Outcome Moved, a turn's begin ErrSessionMoved. It returns
// the head as marked. A head marked already is returned as it is (another
// adopter got there first); a tombstone is ErrSessionDeleted; no head at
// all kv.ErrNotFound. The store must have the CAS group: without it two
// writers could not be ordered.
func (s *Sessions) MarkMoved(ctx context.Context, id, to, host string, at time.Time) (Head, error) {
	if !s.caps().CAS {
		return Head{}, fmt.Errorf("%w: moving a session to the ledger needs the CAS group", ErrNoCAS)
	}
	for range 8 {
		h, ver, err := s.ReadHead(ctx, id)
		switch {
		case err != nil:
			return Head{}, err
		case h.Deleted:
			return h, fmt.Errorf("%w: %s", ErrSessionDeleted, id)
		case h.Moved != nil:
			return h, nil
		}
		h.Moved = &MovedMark{To: to, At: at.UTC(), Host: host}
		h.Writer = host
		_, err = s.putHead(ctx, h, ver)
		if err == nil {
			return h, nil
		}
		if !errors.Is(err, kv.ErrConflict) {
			return Head{}, err
		}
		// A host committed meanwhile: mark its newer head.
	}
	return Head{}, fmt.Errorf("storage: session %q: its head kept changing while it was moved; try again", id)
}

// LoadMoved reads the whole history of a session whose head is marked
// moved (MarkMoved): the head and every batch, oldest first. A head not
// marked is ErrSessionMoved's opposite: an error saying so, as the
// session's history could still grow.
func (s *Sessions) LoadMoved(ctx context.Context, id string) (Loaded, error) {
	var l Loaded
	h, ver, n, err := s.readHead(ctx, id)
	l.Bytes, l.Version = n, ver
	switch {
	case err != nil:
		return l, err
	case h.Deleted:
		return l, fmt.Errorf("%w: %s", ErrSessionDeleted, id)
	case h.Moved == nil:
		return l, fmt.Errorf("storage: session %q is not marked moved; mark it first (MarkMoved), so that no host adds to it", id)
	}
	l.Head = h
	var read int64
	l.Batches, read, _, err = s.walk(ctx, id, h.Tip(), BatchRef{})
	l.Bytes += read
	return l, err
}
