package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"agentkit/kv"
)

// Rewrite is a one-time change of the bytes a Handler's program keeps in
// the ledger, for a migration of its formats: Payload gets each event's
// payload and Output each element of a committed turn's output, and
// returns the new bytes and true when it changes them. A rewrite must not
// change what a record means (the same events, the same turns): the ledger
// treats the new bytes as the same record.
type Rewrite struct {
	Payload func(sessionID string, payload json.RawMessage) (json.RawMessage, bool)
	Output  func(sessionID string, element json.RawMessage) (json.RawMessage, bool)
}

// RewriteStats counts the records Rewrite changed.
type RewriteStats struct {
	// Controls is the control records whose inbox or unflushed turns
	// changed; Blobs, Turns, Outs and DeadLetters the payload blobs,
	// committed turns, large outputs and dead letters.
	Controls, Blobs, Turns, Outs, DeadLetters int
}

// Rewrite applies rw to every record of every session of the agent: the
// control record by compare-and-set (its lease and inbox untouched, so a
// holder writing at the same moment only reads it again), dead letters by
// compare-and-set (so a replay or drop at the same moment is never undone),
// payload blobs, committed turns and large outputs by a plain write of
// the rewritten bytes. Deleted sessions are skipped. It is idempotent: a
// record rw leaves unchanged is not written. A committed turn a paused
// host flushes again after the rewrite gets its old bytes back; run the
// rewrite again to catch it.
func (l *Ledger) Rewrite(ctx context.Context, rw Rewrite) (RewriteStats, error) {
	var st RewriteStats
	var ids []string
	for c, err := range l.controls(ctx) {
		if err != nil {
			return st, err
		}
		if c.Deleted == nil {
			ids = append(ids, c.Session)
		}
	}
	for _, sid := range ids {
		if err := l.rewriteSession(ctx, sid, rw, &st); err != nil {
			return st, fmt.Errorf("ledger: rewriting session %s: %w", sid, err)
		}
	}
	return st, nil
}

func (l *Ledger) rewriteSession(ctx context.Context, sid string, rw Rewrite, st *RewriteStats) error {
	s := l.session(sid)
	changed := false
	_, _, err := l.update(ctx, s, "rewrite", func(c *control) (*control, error) {
		changed = false
		if c == nil || c.Deleted != nil {
			return nil, nil
		}
		for i := range c.Pending {
			if e := &c.Pending[i]; len(e.Inline) > 0 && rw.Payload != nil {
				if p, ok := rw.Payload(sid, e.Inline); ok {
					e.Inline, e.Size, changed = p, len(p), true
				}
			}
		}
		for i := range c.Unflushed {
			if rewriteOutput(sid, c.Unflushed[i].Output, rw) {
				changed = true
			}
		}
		if !changed {
			return nil, nil
		}
		return c, nil
	})
	if err != nil {
		return err
	}
	if changed {
		st.Controls++
	}
	if rw.Payload != nil {
		n, err := l.rewriteAll(ctx, l.keys.inPrefix(sid), func(data []byte) ([]byte, bool, error) {
			b, err := decodeBlob(data)
			if err != nil {
				return nil, false, err
			}
			p, ok := rw.Payload(sid, b.Payload)
			if !ok {
				return nil, false, nil
			}
			b.Payload = p
			return encode(kindBlob, b), true, nil
		}, false)
		st.Blobs += n
		if err != nil {
			return err
		}
		n, err = l.rewriteAll(ctx, l.keys.dlqSession(sid), func(data []byte) ([]byte, bool, error) {
			d, err := decodeDeadLetter(data)
			if err != nil {
				return nil, false, err
			}
			p, ok := rw.Payload(sid, d.Payload)
			if !ok || len(d.Payload) == 0 {
				return nil, false, nil
			}
			d.Payload = p
			return encode(kindDeadLetter, d), true, nil
		}, true)
		st.DeadLetters += n
		if err != nil {
			return err
		}
	}
	if rw.Output != nil {
		turn := func(data []byte) ([]byte, bool, error) {
			t, err := decodeTurn(data)
			if err != nil {
				return nil, false, err
			}
			if !rewriteOutput(sid, t.Output, rw) {
				return nil, false, nil
			}
			return encode(kindTurn, t), true, nil
		}
		n, err := l.rewriteAll(ctx, l.keys.data(sid)+"turns/", turn, false)
		st.Turns += n
		if err != nil {
			return err
		}
		n, err = l.rewriteAll(ctx, l.keys.outPrefix(sid), turn, false)
		st.Outs += n
		if err != nil {
			return err
		}
	}
	return nil
}

// rewriteOutput applies rw.Output to each element of out, in place, and
// reports whether one changed.
func rewriteOutput(sid string, out []json.RawMessage, rw Rewrite) bool {
	if rw.Output == nil {
		return false
	}
	changed := false
	for i, o := range out {
		if n, ok := rw.Output(sid, o); ok {
			out[i], changed = n, true
		}
	}
	return changed
}

// rewriteAll rewrites every record under prefix with fn, by
// compare-and-set when cas is set (read again on a conflict), else by a
// plain write, and returns how many it wrote. A record that cannot be
// read is left as it is.
func (l *Ledger) rewriteAll(ctx context.Context, prefix string, fn func([]byte) ([]byte, bool, error), cas bool) (int, error) {
	var ks []string
	for k, err := range l.store.ListKeys(ctx, prefix) {
		if err != nil {
			return 0, err
		}
		ks = append(ks, k)
	}
	n := 0
	for _, k := range ks {
		for attempt := 0; ; attempt++ {
			var data []byte
			var ver kv.Version
			var err error
			if cas {
				data, ver, err = l.store.GetWithVersion(ctx, k)
			} else {
				data, err = l.store.Get(ctx, k)
			}
			if errors.Is(err, kv.ErrNotFound) {
				break
			}
			if err != nil {
				return n, err
			}
			next, ok, err := fn(data)
			if err != nil {
				l.log.Warn("ledger: rewrite: leaving a record it cannot read", "key", k, "err", err)
				break
			}
			if !ok {
				break
			}
			if !cas {
				err = l.store.Put(ctx, k, next)
			} else {
				_, err = l.store.PutIfVersion(ctx, k, next, ver)
				if errors.Is(err, kv.ErrConflict) && attempt < 8 {
					continue
				}
			}
			if err != nil {
				return n, err
			}
			n++
			break
		}
	}
	return n, nil
}
