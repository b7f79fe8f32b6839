package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"agentkit/agent/sessiondb"
	"agentkit/kv"
	"agentkit/ledger"
	"agentkit/storage"
)

// A session served in serving mode local before the agent moved to
// serving mode ledger is adopted the first time a ledger host is asked
// for it (by its token or its id): its head in the store is marked moved
// to the ledger by compare-and-set, so no host of serving mode local
// commits to it again (a turn of one is refused with ErrSessionMoved);
// its whole history is then read and becomes its committed transcript in
// the ledger, one committed turn per turn, created create-only (two hosts
// adopting it at once write the same records, and one creates it).

// adopt adopts session id into the ledger, when the store holds it as a
// session of serving mode local. It reports whether the ledger has the
// session now. No such session is (false, nil).
func (lp *ledgerPath) adopt(ctx context.Context, id string) (bool, error) {
	r := lp.r
	sessions := r.agentStore.Sessions()
	h, err := sessions.MarkMoved(ctx, id, ServingLedger, r.hostID, r.now())
	switch {
	case errors.Is(err, kv.ErrNotFound), errors.Is(err, storage.ErrSessionDeleted):
		return false, nil
	case err != nil:
		return false, storeErr("marking a session of serving mode local moved to the ledger", err)
	}
	l, err := sessions.LoadMoved(ctx, id)
	if err != nil {
		return false, storeErr("reading a session of serving mode local", err)
	}
	recs, _, err := records(id, l.Batches)
	if err != nil {
		return false, err
	}
	turns, err := adoptedTurns(id, h, recs)
	if err != nil {
		return false, err
	}
	if len(turns) == 0 {
		return false, nil
	}
	created, err := lp.led.Adopt(ctx, id, turns)
	if err != nil {
		return false, ledgerErr(id, err)
	}
	if created {
		r.logger(id).Info("agent: adopted a session of serving mode local into the ledger", slog.Int("turns", len(turns)))
	}
	return true, nil
}

// adoptedTurns groups a session's events (in sequence order) by turn:
// each turn is its header and its events, as a committed turn of serving
// mode ledger carries them. A keyed turn's event id is its
// Idempotency-Key, so a retry of it after the move is found.
func adoptedTurns(id string, h storage.Head, recs []sessiondb.Record) ([]ledger.AdoptedTurn, error) {
	var turns []ledger.AdoptedTurn
	session := ledgerSession{ChannelID: h.ChannelID, Title: h.Title, CreatedAt: h.CreatedAt.UTC(), TokenDigest: h.Digest()}
	for _, rec := range recs {
		var ev Event
		if err := json.Unmarshal(rec.Data, &ev); err != nil {
			return nil, fmt.Errorf("agent: event %d of session %s is damaged: %w", rec.Seq, id, err)
		}
		n := int64(len(turns))
		switch {
		case ev.Turn == n+1:
			header := ledgerHeader{Kind: ledgerKind, V: ledgerFormat, Session: session}
			eventID := fmt.Sprintf("adopted/%d", ev.Turn)
			if ev.Idempotency != nil {
				eventID, header.Hash = ev.Idempotency.Key, ev.Idempotency.Hash
			}
			hb, err := json.Marshal(header)
			if err != nil {
				return nil, err
			}
			turns = append(turns, ledger.AdoptedTurn{Output: []json.RawMessage{hb}, EventID: eventID})
		case ev.Turn != n:
			return nil, fmt.Errorf("agent: session %s: event %d belongs to turn %d after turn %d; it cannot be adopted into the ledger", id, rec.Seq, ev.Turn, n)
		}
		t := &turns[len(turns)-1]
		t.Output = append(t.Output, slices.Clone(rec.Data))
		t.At = ev.At
	}
	return turns, nil
}
