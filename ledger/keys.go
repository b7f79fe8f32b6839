package ledger

import (
	"strings"

	"agentkit/keys"
)

// layout builds the ledger's keys under "agentkit/v1/{agent}/durable-session/":
//
//	ctl/{sessionId}                                  the control record (CAS)
//	data/{sessionId}/in/{epoch}/{nonce}              an event payload (plain put)
//	data/{sessionId}/turns/{commitSeq}               a committed turn (plain put, after its commit)
//	data/{sessionId}/out/{commitSeq}/{gen}-{turnId}  a large turn output, before its commit
//	data/{sessionId}/keys/{eventId}                  a kept key (plain put, before its id leaves the window)
//	dlq/{sessionId}/{eventId}/{inboxSeq}             a dead letter (one per dead-lettering)
//
// Control records sit under their own prefix so the janitor's scan and the
// session list read one record per session, whatever the sessions hold.
// Numbers are zero-padded to keys.SeqDigits digits; caller-controlled parts
// (session and event ids) are encoded with keys.Segment.
type layout struct {
	root string // agentkit/v1/{agent}/durable-session/
}

func newLayout(scope keys.Scope) layout { return layout{root: scope.LedgerPrefix()} }

func (k layout) ctlPrefix() string { return k.root + "ctl/" }
func (k layout) dlqPrefix() string { return k.root + "dlq/" }

// seg encodes a caller-controlled segment; the callers validate that it is
// not empty first.
func seg(raw string) string {
	s, _ := keys.Segment(raw)
	return s
}

func (k layout) ctl(sid string) string        { return k.ctlPrefix() + seg(sid) }
func (k layout) data(sid string) string       { return k.root + "data/" + seg(sid) + "/" }
func (k layout) inPrefix(sid string) string   { return k.data(sid) + "in/" }
func (k layout) outPrefix(sid string) string  { return k.data(sid) + "out/" }
func (k layout) keysPrefix(sid string) string { return k.data(sid) + "keys/" }

// kept is the key of an event id's kept key.
func (k layout) kept(sid, eventID string) string { return k.keysPrefix(sid) + seg(eventID) }
func (k layout) turn(sid string, seq uint64) string {
	return k.data(sid) + "turns/" + keys.Seq(seq)
}

// blob is the key of a payload blob; ref is the entry's "{epoch}/{nonce}".
func (k layout) blob(sid, ref string) string { return k.inPrefix(sid) + ref }

func blobRef(epoch uint64, nonce string) string { return keys.Seq(epoch) + "/" + nonce }

// blobEpoch returns the epoch of a blob reference, ok false when malformed.
func blobEpoch(ref string) (uint64, bool) {
	e, _, ok := strings.Cut(ref, "/")
	if !ok {
		return 0, false
	}
	n, err := keys.ParseSeq(e)
	return n, err == nil
}

// out is the key of a large turn output; ref is "{commitSeq}/{gen}-{turnId}".
func (k layout) out(sid, ref string) string { return k.outPrefix(sid) + ref }

func outRef(seq, gen uint64, turnID string) string {
	return keys.Seq(seq) + "/" + keys.Seq(gen) + "-" + turnID
}

// parseOutRef splits an out reference into its commit sequence and
// generation.
func parseOutRef(ref string) (seq, gen uint64, ok bool) {
	s, rest, ok := strings.Cut(ref, "/")
	if !ok {
		return 0, 0, false
	}
	g, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, 0, false
	}
	a, err1 := keys.ParseSeq(s)
	b, err2 := keys.ParseSeq(g)
	return a, b, err1 == nil && err2 == nil
}

func (k layout) dlqSession(sid string) string        { return k.dlqPrefix() + seg(sid) + "/" }
func (k layout) dlqEvent(sid, eventID string) string { return k.dlqSession(sid) + seg(eventID) + "/" }
func (k layout) dlq(sid, eventID string, inbox uint64) string {
	return k.dlqEvent(sid, eventID) + keys.Seq(inbox)
}
