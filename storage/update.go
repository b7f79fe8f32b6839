package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// casAttempts bounds the compare-and-set loop of an update that keeps
// losing to other writers.
const casAttempts = 32

// ErrSkip, returned by an update function, leaves the stored document as
// it is: the update ends without writing and returns nil.
var ErrSkip = errors.New("storage: update skipped")

// Update replaces the snapshot of run runID with what update returns given
// the stored one (nil when there is none). When update returns ErrSkip
// nothing is written.
//
// Over the derived table on a backend with the CAS group, Update is a
// compare-and-set loop: a write made by another host between the read and
// the write makes the update run again on the newer snapshot, so a
// conditional change (mark a run interrupted only if it is still running)
// never overwrites a newer snapshot. Over a native table, the memory table
// or a backend without CAS it reads, calls update and writes, and a
// concurrent write can be lost.
func (e *EvalRuns) Update(ctx context.Context, runID string, update func(old json.RawMessage) (json.RawMessage, error)) error {
	if runID == "" {
		return errors.New("storage: the eval run id is empty; give the run an id")
	}
	b := e.a.b
	if b.evalsMode == ModeDerived && b.caps.CAS {
		return derivedEvals{b.db}.update(ctx, e.a.Name(), runID, true, update)
	}
	var old json.RawMessage
	for r, err := range e.List(ctx) {
		if err != nil {
			return err
		}
		if r.ID == runID {
			old = r.Snapshot
		}
	}
	doc, err := update(old)
	if errors.Is(err, ErrSkip) {
		return nil
	}
	if err != nil {
		return err
	}
	return e.Put(ctx, runID, doc)
}

// UpdateSnapshot replaces the agent's A/B snapshot with what update returns
// given the stored one (nil when there is none). When update returns
// ErrSkip nothing is written.
//
// Over the derived snapshot on a backend with the CAS group it is a
// compare-and-set loop, so hosts updating the snapshot at the same time
// never lose each other's writes: each update runs on the latest stored
// snapshot. Over a native snapshot table or a backend without CAS it reads
// (when the backend can Get), calls update and writes; a concurrent update
// can then be lost, and callers that need every host's view kept write a
// merge of what they read and their own state, read it back, and write
// again when their state is missing.
func (t *ABs) UpdateSnapshot(ctx context.Context, update func(old json.RawMessage) (json.RawMessage, error)) error {
	b := t.a.b
	if b.snapsMode == ModeDerived && b.caps.CAS {
		key, err := snapshotKey(t.a.Name())
		if err != nil {
			return err
		}
		return casUpdate(ctx, b.db, key, func(data []byte) (json.RawMessage, error) {
			var rec snapshotRecord
			if _, err := record.Unmarshal(KindABSnapshot, key, data, &rec); err != nil {
				return nil, err
			}
			return rec.Snapshot, nil
		}, func(doc json.RawMessage) ([]byte, error) {
			if err := checkJSON("A/B snapshot", doc); err != nil {
				return nil, err
			}
			return record.Marshal(KindABSnapshot, snapshotRecord{Agent: t.a.Name(), Snapshot: doc})
		}, update)
	}
	var old json.RawMessage
	if b.snapsMode == ModeNative || b.caps.Get {
		var err error
		old, err = t.GetSnapshot(ctx)
		if err != nil && !errors.Is(err, kv.ErrNotFound) {
			return err
		}
	}
	doc, err := update(old)
	if errors.Is(err, ErrSkip) {
		return nil
	}
	if err != nil {
		return err
	}
	return t.PutSnapshot(ctx, doc)
}

// casUpdate runs a compare-and-set loop on key: read it with its version,
// decode the document, update it, encode it and write it on the condition
// that the version has not changed (or that the key is still absent).
func casUpdate(ctx context.Context, db *kv.DB, key string,
	decode func([]byte) (json.RawMessage, error),
	encode func(json.RawMessage) ([]byte, error),
	update func(json.RawMessage) (json.RawMessage, error),
) error {
	return casUpdateHooked(ctx, db, key, func(data []byte) (json.RawMessage, error) {
		if data == nil {
			return nil, nil
		}
		return decode(data)
	}, encode, update, nil)
}

// errStale, from a decode function of casUpdateHooked, means what the
// record refers to changed since it was read: the update runs again, as
// after a conflict.
var errStale = errors.New("storage: the record changed while it was read")

// casUpdateHooked is casUpdate for records that refer to other keys:
// decode is called with nil when the key holds nothing, and settled, when
// not nil, is called after every conditional write with its error (nil,
// a conflict, or an error whose outcome is unknown), before the next
// attempt.
func casUpdateHooked(ctx context.Context, db *kv.DB, key string,
	decode func([]byte) (json.RawMessage, error),
	encode func(json.RawMessage) ([]byte, error),
	update func(json.RawMessage) (json.RawMessage, error),
	settled func(error),
) error {
	for attempt := 1; ; attempt++ {
		data, ver, err := db.GetWithVersion(ctx, key)
		var old json.RawMessage
		switch {
		case errors.Is(err, kv.ErrNotFound):
			ver, data = "", nil
		case err != nil:
			return err
		}
		old, err = decode(data)
		if err == nil {
			var doc json.RawMessage
			if doc, err = update(old); errors.Is(err, ErrSkip) {
				return nil
			}
			if err != nil {
				return err
			}
			var rec []byte
			if rec, err = encode(doc); err != nil {
				return err
			}
			if ver == "" {
				_, err = db.PutIfAbsent(ctx, key, rec)
			} else {
				_, err = db.PutIfVersion(ctx, key, rec, ver)
			}
			if settled != nil {
				settled(err)
			}
			if err == nil || !errors.Is(err, kv.ErrConflict) {
				return err
			}
		} else if !errors.Is(err, errStale) {
			return err
		}
		if attempt == casAttempts {
			return fmt.Errorf("storage: updating %q lost to other writers %d times in a row: %w", key, casAttempts, err)
		}
		// Another host wrote in between: wait a little, at random, so that
		// hosts racing on the key do not collide again, and run again.
		wait := time.Duration(rand.Int64N(int64(attempt)*int64(5*time.Millisecond))) + time.Millisecond
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// PruneSamples deletes the derived samples of one session in one
// experiment taken before before, and returns how many it deleted. Samples
// are cumulative, so a session's latest sample holds everything its earlier
// ones did: the A/B recorder prunes those once a later sample and the
// snapshot hold them. Over a native A/B table (which owns its retention) or
// a backend without List and Delete it deletes nothing.
func (t *ABs) PruneSamples(ctx context.Context, experiment, sessionID string, before time.Time) (int, error) {
	b := t.a.b
	if b.absMode != ModeDerived || !b.caps.List || !b.caps.Delete {
		return 0, nil
	}
	prefix, err := t.a.keys.ABSessionPrefix(experiment, sessionID)
	if err != nil {
		return 0, fmt.Errorf("storage: %w", err)
	}
	before = before.UTC().Truncate(time.Millisecond)
	var old []string
	for key, err := range b.db.ListKeys(ctx, prefix) {
		if err != nil {
			return 0, err
		}
		k, err := keys.Parse(key)
		if err != nil || k.Family != keys.FamilyABSample {
			continue // not a sample this package wrote: leave it
		}
		if k.At.Before(before) {
			old = append(old, key)
		}
	}
	for i, key := range old {
		if err := b.db.Delete(ctx, key); err != nil {
			return i, err
		}
	}
	return len(old), nil
}
