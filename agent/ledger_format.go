package agent

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/ledger"
	"agentkit/record"
)

// What serving mode ledger writes into the ledger: the messages queued in
// a session's inbox and the committed turns' output.

// ledgerKind marks the header of a committed turn's output.
const ledgerKind = "agentkit.turn"

// ledgerFormat is the format version of ledgerMessage and ledgerHeader;
// both are checked by package record's version rule (their version is the
// "v" field, though not the first). Version 2 carries the session's token
// digest in place of its plain token (ledgerSession), which a version-1
// reader would take for none.
const ledgerFormat = 2

// The kinds of what serving mode ledger writes into the ledger.
var (
	kindLedgerMessage = record.NewKind("ledger message", ledgerFormat)
	kindTurnHeader    = record.NewKind("turn header", ledgerFormat)
)

// ledgerMessage is the payload of a ledger event: one user message, or a
// reminder firing.
type ledgerMessage struct {
	V       int               `json:"v"`
	Source  string            `json:"source"`
	Message string            `json:"message"`
	Files   map[string]string `json:"workspaceFiles,omitempty"`
	// Start is set on a session's first message: the session's metadata.
	Start *ledgerSession `json:"start,omitempty"`
	// Hash is the request hash of a keyed request (idempotency.go), so a
	// key reused for another message is told apart.
	Hash string `json:"hash,omitempty"`
}

// ledgerSession is a session's metadata as the ledger carries it.
type ledgerSession struct {
	ChannelID string    `json:"channelId"`
	Title     string    `json:"title,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// TokenDigest is the digest of the session's first continuation token
	// (keys.TokenDigest); the token is never stored.
	TokenDigest string `json:"tokenDigest,omitempty"`
	// LegacyToken is the plain token a version-1 record of an earlier
	// build carries: read for its digest, never written.
	LegacyToken string `json:"token,omitempty"`
}

// digest returns the session's token digest, from either form.
func (s ledgerSession) digest() string {
	if s.TokenDigest == "" && s.LegacyToken != "" {
		return keys.TokenDigest(s.LegacyToken)
	}
	return s.TokenDigest
}

// ledgerHeader is the first element of a committed turn's output; the
// turn's events follow it, one element each.
type ledgerHeader struct {
	Kind    string        `json:"kind"`
	V       int           `json:"v"`
	Session ledgerSession `json:"session"`
	// Hash is the consumed message's request hash, if it had one.
	Hash      string `json:"hash,omitempty"`
	Retryable bool   `json:"retryable,omitempty"`
}

// ledgerTurn is a committed turn decoded: its header, its events and their
// stored form.
type ledgerTurn struct {
	header ledgerHeader
	events []Event
	recs   []sessiondb.Record
}

// decodeLedgerTurn reads a committed turn of session id.
func decodeLedgerTurn(id string, c ledger.Committed) (ledgerTurn, error) {
	var lt ledgerTurn
	if len(c.Output) < 2 {
		return lt, fmt.Errorf("agent: committed turn %d of session %s has %d output elements; a turn has a header and events", c.Seq, id, len(c.Output))
	}
	if err := json.Unmarshal(c.Output[0], &lt.header); err != nil || lt.header.Kind != ledgerKind {
		return lt, fmt.Errorf("agent: committed turn %d of session %s has no turn header", c.Seq, id)
	}
	if err := record.Check(kindTurnHeader, fmt.Sprintf("turn %d of session %s", c.Seq, id), lt.header.V); err != nil {
		if errors.Is(err, record.ErrNewerFormat) {
			return lt, fmt.Errorf("agent: committed turn %d of session %s has format %d, newer than this agentkit's %d; upgrade this host: %w", c.Seq, id, lt.header.V, ledgerFormat, err)
		}
		return lt, fmt.Errorf("agent: committed turn %d of session %s: %w", c.Seq, id, err)
	}
	for i, data := range c.Output[1:] {
		var ev Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return lt, fmt.Errorf("agent: event %d of committed turn %d of session %s is damaged: %w", i+1, c.Seq, id, err)
		}
		if ev.SessionID != id || ev.Turn != int64(c.Seq) {
			return lt, fmt.Errorf("agent: event %d of committed turn %d of session %s names session %q turn %d", i+1, c.Seq, id, ev.SessionID, ev.Turn)
		}
		lt.events = append(lt.events, ev)
		lt.recs = append(lt.recs, sessiondb.Record{SessionID: id, Seq: ev.Seq, At: ev.At, Type: ev.Type, Data: data})
	}
	return lt, nil
}

// result is the answer a committed turn gives.
func (lt ledgerTurn) result(id string) TurnResult {
	res := TurnResult{SessionID: id}
	for _, ev := range lt.events {
		res.LastSeq = ev.Seq
		if ev.Type == EventTurnFinished {
			res.Turn = Turn{Status: ev.Status, Result: ev.Result, Retryable: lt.header.Retryable}
			if ev.Usage != nil {
				res.Turn.Usage = *ev.Usage
			}
		}
	}
	return res
}

// keyedSessionID is the session id a keyed start takes: the same on every
// host for the same key, so a retry after a lost answer finds the session
// the first attempt created.
func keyedSessionID(agentName, key string) string {
	sum := sha256.Sum256([]byte("agentkit/start/" + agentName + "/" + key))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
