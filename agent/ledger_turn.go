package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"agentkit/agent/sessiondb"
	"agentkit/ledger"
	"agentkit/record"
)

// A turn in serving mode ledger: the ledger's runner, on the host holding
// the session's lease, hands it one message (handle); the turn runs from
// the committed transcript (the local copy holds committed turns only and
// is brought up to the turn before this one) and its events are committed
// with the turn, in its output.

// handle is the ledger's Handler: it runs one turn of a session this host
// holds, consuming one message, through runTurn. A message no agentkit
// can read is dead-lettered at once (ledger.Permanent); one of a newer
// format is tried again, and so reaches a newer host when one takes the
// session over, or the dead letters after maxAttempts. A turn whose lease
// is lost returns the error: the ledger runs it again, on whichever host
// holds the session.
func (lp *ledgerPath) handle(ctx context.Context, lt *ledger.Turn) error {
	r, id := lp.r, lt.SessionID
	var msg ledgerMessage
	if err := json.Unmarshal(lt.Event.Payload, &msg); err != nil {
		return ledger.Permanent(fmt.Errorf("agent: event %q of session %s is not a message this agentkit reads: %w", lt.Event.ID, id, err))
	}
	if err := record.Check(kindLedgerMessage, fmt.Sprintf("event %q of session %s", lt.Event.ID, id), msg.V); errors.Is(err, record.ErrNewerFormat) {
		return fmt.Errorf("agent: event %q of session %s has format %d, newer than this agentkit's %d: %w", lt.Event.ID, id, msg.V, ledgerFormat, err)
	} else if err != nil {
		return ledger.Permanent(fmt.Errorf("agent: event %q of session %s is not a message this agentkit reads: %w", lt.Event.ID, id, err))
	}
	if msg.Message == "" {
		return ledger.Permanent(fmt.Errorf("agent: event %q of session %s is not a message this agentkit reads: it has no message", lt.Event.ID, id))
	}
	_, err := r.runTurn(ctx, &ledgerCommit{lp: lp, lt: lt, msg: msg}, turnInput{
		message: msg.Message, files: msg.Files, source: msg.Source, eventID: lt.Event.ID,
	})
	return err
}

// ledgerCommit is a turn's hold on the ledger: the runner's turn and the
// message it consumes.
type ledgerCommit struct {
	lp  *ledgerPath
	lt  *ledger.Turn
	msg ledgerMessage
}

// begin implements turnCommit: the local copy is brought up to the
// committed transcript, which must end at the turn before this one; a
// session's first turn takes its row from the message.
func (lc *ledgerCommit) begin(ctx context.Context) (sessiondb.Meta, error) {
	id := lc.lt.SessionID
	m, _, err := lc.lp.syncLedger(ctx, id)
	if err != nil {
		return m, err
	}
	if uint64(m.Turns) != lc.lt.Seq-1 {
		return m, fmt.Errorf("agent: session %s: the local copy has %d committed turns, and the ledger commits turn %d next", id, m.Turns, lc.lt.Seq)
	}
	if m.Turns == 0 {
		s := lc.msg.Start
		if s == nil {
			return m, ledger.Permanent(fmt.Errorf("agent: the first message of session %s carries no session metadata", id))
		}
		m = sessiondb.Meta{ID: id, ChannelID: s.ChannelID, Title: s.Title, CreatedAt: s.CreatedAt, UpdatedAt: s.CreatedAt, TokenDigest: s.digest()}
	}
	return m, nil
}

// check implements turnCommit: the ledger's fence (ledger.Turn.Check).
func (lc *ledgerCommit) check() error { return lc.lt.Check() }

// flush implements turnCommit: nothing is written or published before
// the commit; the events wait in the turn.
func (lc *ledgerCommit) flush(*turn) error { return nil }

// commit implements turnCommit: the turn's header and events are the
// turn's output in the ledger's fenced commit; only then is the local
// copy written. A turn whose lease is lost, whose renewal is overdue or
// whose host is closing does not commit: the ledger runs it again.
func (lc *ledgerCommit) commit(ctx context.Context, t *turn) error {
	r, id := lc.lp.r, lc.lt.SessionID
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	m := t.meta
	header, _ := json.Marshal(ledgerHeader{Kind: ledgerKind, V: ledgerFormat, Hash: lc.msg.Hash, Retryable: temporary(t.failure),
		Session: ledgerSession{ChannelID: m.ChannelID, Title: m.Title, CreatedAt: m.CreatedAt, TokenDigest: m.TokenDigest}})
	c, err := lc.lt.Commit(ctx, append([]json.RawMessage{header}, t.events()...))
	if err != nil {
		return err
	}
	if cached, err := lc.lp.cacheTurns(context.WithoutCancel(ctx), id, []ledger.Committed{c}); err != nil {
		r.logger(id).Warn("agent: writing a committed turn to the local copy failed; the next read fetches it again", "error", err)
		r.convs.drop(id)
		t.conv = nil
	} else {
		lc.lp.ix.committed(cached, c.At) // the listing's entry, in the background
	}
	t.pending, t.recs = nil, nil
	return nil
}

// syncLedger brings the local copy of a session up to its committed
// transcript and returns the session's row (only the id when no turn is
// committed yet). It reads the control record, and the turns committed
// since the local copy's last, from the store. A deleted or unknown
// session is ErrSessionNotFound (a deleted one's local copy is removed;
// an unknown one's, a session of serving mode local, is kept); a store
// failure ErrStoreUnavailable.
func (lp *ledgerPath) syncLedger(ctx context.Context, id string) (sessiondb.Meta, bool, error) {
	r := lp.r
	m, found, err := lp.syncLedgerOnce(ctx, id)
	if errors.Is(err, ledger.ErrDeleted) && found {
		if rerr := r.removeLocal(context.WithoutCancel(ctx), id); rerr != nil {
			r.logger(id).Warn("agent: removing the local copy of a deleted session failed", "error", rerr)
		}
	}
	return m, found && err == nil, err
}

// syncLedgerOnce is syncLedger without the removal; found says whether
// the local copy had the session.
func (lp *ledgerPath) syncLedgerOnce(ctx context.Context, id string) (sessiondb.Meta, bool, error) {
	r := lp.r
	m, err := r.db.Get(ctx, id)
	found := err == nil
	if err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
		return m, false, err
	}
	after := uint64(0)
	if found {
		after = uint64(m.Turns)
	}
	adopted := false
	for {
		p, err := lp.led.Transcript(ctx, id, after, ledger.DefaultPageSize)
		if errors.Is(err, ledger.ErrUnknownSession) && !adopted {
			// A session of serving mode local, maybe: adopt it and read
			// again.
			adopted = true
			ok, aerr := lp.adopt(ctx, id)
			if aerr != nil {
				return m, found, aerr
			}
			if ok {
				continue
			}
		}
		if err != nil {
			if errors.Is(err, ledger.ErrDeleted) || errors.Is(err, ledger.ErrUnknownSession) {
				// A local row of a session the ledger never had (one
				// served in serving mode local before) is kept: only a
				// tombstone removes the local copy.
				return m, found, fmt.Errorf("%w: %s: %w", ErrSessionNotFound, id, err)
			}
			return m, found, storeErr("reading the session's transcript", err)
		}
		if p.Head < after {
			return m, found, fmt.Errorf("agent: session %s: the local copy has %d turns, the ledger %d committed", id, after, p.Head)
		}
		if len(p.Turns) > 0 {
			got, err := lp.cacheTurns(ctx, id, p.Turns)
			if err != nil {
				return m, found, err
			}
			m, found = got, true
		}
		after = p.Next
		if !p.More {
			break
		}
	}
	if !found {
		return sessiondb.Meta{ID: id}, false, nil
	}
	return m, true, nil
}

// cacheTurns writes committed turns to the local copy, those after its
// last in order, in one transaction, and returns the session's row.
func (lp *ledgerPath) cacheTurns(ctx context.Context, id string, turns []ledger.Committed) (sessiondb.Meta, error) {
	r := lp.r
	st, unref := r.refSession(id)
	defer unref()
	st.mirror.Lock()
	defer st.mirror.Unlock()
	m, err := r.db.Get(ctx, id)
	found := err == nil
	if err != nil && !errors.Is(err, sessiondb.ErrNotFound) {
		return m, err
	}
	var created *sessiondb.Meta
	var recs []sessiondb.Record
	for _, c := range turns {
		if found && int64(c.Seq) <= m.Turns {
			continue
		}
		if int64(c.Seq) != m.Turns+1 {
			return m, fmt.Errorf("agent: session %s: committed turn %d does not follow the local copy's turn %d", id, c.Seq, m.Turns)
		}
		lt, err := decodeLedgerTurn(id, c)
		if err != nil {
			return m, err
		}
		if !found {
			s := lt.header.Session
			m = sessiondb.Meta{ID: id, ChannelID: s.ChannelID, Title: s.Title, CreatedAt: s.CreatedAt, UpdatedAt: s.CreatedAt, TokenDigest: s.digest()}
			cm := m
			created, found = &cm, true
		}
		for _, ev := range lt.events {
			if ev.Seq != m.LastSeq+1 {
				return m, fmt.Errorf("agent: session %s: committed turn %d holds event %d after event %d", id, c.Seq, ev.Seq, m.LastSeq)
			}
			m.LastSeq, m.UpdatedAt = ev.Seq, ev.At
			if ev.Type == EventTurnFinished {
				m.LastStatus = string(ev.Status)
			}
		}
		m.Turns = int64(c.Seq)
		recs = append(recs, lt.recs...)
	}
	if len(recs) == 0 {
		return m, nil
	}
	err = r.db.Write(ctx, func(tx *sessiondb.Tx) error {
		if created != nil {
			if err := tx.Put(*created); err != nil {
				return err
			}
		}
		return tx.Record(m, recs...)
	})
	if err != nil {
		return m, fmt.Errorf("agent: writing committed turns of session %s to the local copy: %w", id, err)
	}
	if m.TokenDigest != "" {
		r.tokens.put(m.TokenDigest, id)
	}
	return m, nil
}
