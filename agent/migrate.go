package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"agentkit/keys"
	"agentkit/ledger"
)

// migrateTokens rewrites, once, what earlier builds stored of continuation
// tokens in plain, in the store: the record layer's records
// (storage.Sessions.MigrateTokens) and, in serving mode ledger, the
// session metadata carried by the ledger's messages and committed turns
// (ledger.Ledger.Rewrite). The local database was rewritten when it
// opened. more, when set, is the commit path's own part (the ledger's
// rewrite, lp.rewriteTokens), returning how many records it rewrote. A
// store that fails leaves the migration to the next start; every reader
// takes both forms meanwhile.
func (r *Runtime) migrateTokens(ctx context.Context, more func(context.Context) (int, error)) {
	var n int
	var mf func(context.Context) error
	if more != nil {
		mf = func(ctx context.Context) error {
			var err error
			n, err = more(ctx)
			return err
		}
	}
	m, err := r.agentStore.Sessions().MigrateTokens(ctx, r.hostID, mf)
	if err != nil {
		r.log.Warn("agent: rewriting plain continuation tokens as digests stopped; the next start goes on with it", r.logStoreName(), slog.String("error", err.Error()))
		return
	}
	if n += m.Rewritten(); n > 0 {
		r.log.Info("agent: rewrote the continuation tokens earlier builds stored in plain as their digests",
			slog.Int("continuationRecords", m.Continuations), slog.Int("heads", m.Heads), slog.Int("metadata", m.Metas),
			slog.Int("indexEntries", m.IndexEntries), slog.Int("ledgerRecords", n-m.Rewritten()))
		if r.embedded != nil {
			// The embedded store's old pages leave the write-ahead log.
			if err := r.db.Checkpoint(ctx); err != nil {
				r.log.Warn("agent: checkpointing the session database after the token migration failed", "error", err)
			}
		}
	}
}

// rewriteTokens is the ledger's part of migrateTokens: the session
// metadata its messages and committed turns carry.
func (lp *ledgerPath) rewriteTokens(ctx context.Context) (int, error) {
	st, err := lp.led.Rewrite(ctx, ledger.Rewrite{Payload: digestMessage, Output: digestHeader})
	return st.Controls + st.Blobs + st.Turns + st.Outs + st.DeadLetters, err
}

// digestMessage rewrites a ledger message of format 1 whose session
// metadata carries a plain token (ledger.Rewrite's Payload).
func digestMessage(_ string, p json.RawMessage) (json.RawMessage, bool) {
	if !bytes.Contains(p, []byte(`"token"`)) {
		return nil, false
	}
	var msg ledgerMessage
	if err := json.Unmarshal(p, &msg); err != nil || msg.V != 1 || msg.Start == nil || msg.Start.LegacyToken == "" {
		return nil, false
	}
	msg.V, msg.Start.TokenDigest, msg.Start.LegacyToken = ledgerFormat, keys.TokenDigest(msg.Start.LegacyToken), ""
	b, err := json.Marshal(msg)
	return b, err == nil
}

// digestHeader rewrites a committed turn's header of format 1 that
// carries a plain token (ledger.Rewrite's Output; the turn's events carry
// no token and are left as they are).
func digestHeader(_ string, e json.RawMessage) (json.RawMessage, bool) {
	if !bytes.Contains(e, []byte(`"kind":"`+ledgerKind+`"`)) || !bytes.Contains(e, []byte(`"token"`)) {
		return nil, false
	}
	var h ledgerHeader
	if err := json.Unmarshal(e, &h); err != nil || h.Kind != ledgerKind || h.V != 1 || h.Session.LegacyToken == "" {
		return nil, false
	}
	h.V, h.Session.TokenDigest, h.Session.LegacyToken = ledgerFormat, keys.TokenDigest(h.Session.LegacyToken), ""
	b, err := json.Marshal(h)
	if err != nil {
		panic(fmt.Sprintf("agent: encoding a turn header: %v", err)) // plain structs
	}
	return b, true
}
