package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentkit/kv"
)

// AdoptedTurn is a turn of a session that ran outside the ledger, for
// Adopt: its output as Commit would have taken it, the id of the event it
// consumed (a client's Idempotency-Key, or an id made for it), and when
// it was committed.
type AdoptedTurn struct {
	Output  []json.RawMessage
	EventID string
	At      time.Time
}

// Adopt makes a session that ran outside the ledger (serving mode local)
// one of the ledger's, with turns as its committed transcript, turn 1
// first: their records are written (turns/{seq}), then the session's
// control record is created, create-only, committed through len(turns),
// with no holder, an empty inbox, and the turns' event ids in the
// de-duplication window. It reports whether this call created the
// session: false when the ledger has it already (another host adopted it
// first). The records hold only what turns hold, so hosts adopting one
// session at once write the same bytes and one of them creates the
// control record. A deleted session is ErrDeleted.
//
// The caller must first stop every other writer of the session's history
// (agent marks the session's head moved), so that turns is all of it.
func (l *Ledger) Adopt(ctx context.Context, sessionID string, turns []AdoptedTurn) (bool, error) {
	if sessionID == "" || len(turns) == 0 {
		return false, errors.New("ledger: Adopt needs a session id and at least one turn")
	}
	key := l.keys.ctl(sessionID)
	c, _, err := l.readControl(ctx, key)
	switch {
	case err != nil:
		return false, err
	case c != nil && c.Deleted != nil:
		return false, fmt.Errorf("%w: %s", ErrDeleted, sessionID)
	case c != nil:
		return false, nil
	}
	for i, t := range turns {
		for j, o := range t.Output {
			if !json.Valid(o) {
				return false, fmt.Errorf("ledger: output element %d of adopted turn %d is not a JSON value", j, i+1)
			}
		}
		seq := uint64(i + 1)
		rec := turnRecord{Version: FormatVersion, Session: sessionID, Seq: seq, Holder: adoptedHolder, TurnID: adoptedTurnID(seq),
			EventIDs: []string{t.EventID}, InboxSeqs: []uint64{0}, Output: t.Output, At: t.At.UTC()}
		if err := l.put(ctx, l.keys.turn(sessionID, seq), encode(kindTurn, rec)); err != nil {
			return false, err
		}
	}
	n := uint64(len(turns))
	c = &control{Version: FormatVersion, Session: sessionID, Commit: n, LastTurn: adoptedTurnID(n), NextSeq: 1,
		Created: turns[0].At.UTC(), Updated: turns[n-1].At.UTC(), Write: randomHex(8)}
	for i, t := range turns {
		c.remember(recent{ID: t.EventID, Seq: uint64(i + 1)}, l.opts.DedupWindow)
	}
	l.step("adopt:before-write")
	_, err = l.cas(ctx, key, encode(kindControl, c), true, "")
	l.step("adopt:after-write")
	if errors.Is(err, kv.ErrExists) || errors.Is(err, kv.ErrConflict) {
		return false, nil // another host adopted it first
	}
	if err != nil {
		return false, err
	}
	l.session(sessionID).invalidate()
	return true, nil
}

// adoptedHolder names the holder of adopted turns.
const adoptedHolder = "adopted"

// adoptedTurnID is the attempt id of adopted turn seq.
func adoptedTurnID(seq uint64) string { return fmt.Sprintf("adopted-%d", seq) }
