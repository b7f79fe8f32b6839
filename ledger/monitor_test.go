package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"agentkit/kv/memkv"
)

// monitor checks the ledger's invariants over the whole history of a
// simulation. The store calls it, under the world's lock, at every write:
// each change of a control record is checked against the one before it,
// and every plain write against the committed state.
//
//	I1 every acknowledged event ends in exactly one committed turn or in the
//	   dead-letter store: never committed twice, never dropped from the
//	   inbox other than by its commit or its dead-lettering (checked at
//	   every change, and at the end against the clients' acknowledgements)
//	I2 each (session, generation) has at most one committing host, and that
//	   host held the lease of that generation in the record it changed;
//	   generations never decrease
//	I3 events leave the inbox from its head, in inbox order
//	I4 the commit sequence grows by one, without gaps
//	I5 no pending entry references a missing blob (checked when a record is
//	   written and when a blob is deleted)
//	I6 turns/{seq} only ever receives the committed turn of seq, and every
//	   committed turn was computed from exactly the committed turns before
//	   it (its output carries a digest of the transcript its handler read)
//	I7 a keyed id leaves the de-duplication window only once its kept key
//	   is in the store, and that kept key names the turn (or the dead
//	   letter) that consumed it; a kept key is deleted only
//	   IdempotencyWindow after it was written, in real time, whatever the
//	   writer's and the deleter's clocks say (within ClockSkew); and a
//	   keyed id is queued again only after its kept key was deleted
//
// plus the self-fencing rule: no side effect of generation g after a higher
// generation exists.
type monitor struct {
	keys     layout
	base     baseView
	mu       sync.Mutex // guards violations (the rest is guarded by the world's lock)
	viol     []string
	sessions map[string]*monSession
	bySeg    map[string]string // encoded session segment -> session id
	trace    string            // the only session whose changes are logged, if set (LEDGER_SIM_TRACE)
	// silence is Lease + Margin: no held session may be taken over before
	// its holder has been silent that long (0: not checked).
	silence time.Duration
	// keyWindow is the IdempotencyWindow (0: deletions of kept keys are
	// not timed), and offset the wall-clock offset of a host, by its id.
	keyWindow time.Duration
	offset    func(host string) time.Duration
	// keysCollected counts kept keys deleted past the window, keyedAgain
	// keyed events queued again after that.
	keysCollected, keyedAgain int
}

// monKey is what the monitor knows of a keyed id past the window.
type monKey struct {
	evicted   bool // left the window since it was last queued
	collected bool // its kept key was deleted since then
}

type monSession struct {
	committed    []turnRecord // index seq-1
	committedIDs map[string]uint64
	commits      map[string]int    // times each id was committed
	expired      map[string]int    // re-deliveries of an id the session had forgotten
	holders      map[uint64]string // generation -> committing host
	lastConsumed uint64
	maxGen       uint64
	deadIDs      map[string]int // times dead-lettered
	keys         map[string]*monKey
	log          []string  // the changes, for a failure's report
	lifeAt       time.Time // when (holder, generation, renewal) last changed
}

func newMonitor(k layout, base *memkv.Store) *monitor {
	return &monitor{keys: k, base: baseView{base}, sessions: map[string]*monSession{}, bySeg: map[string]string{}}
}

// baseView reads the shared store without faults (the world's lock is
// held by the caller).
type baseView struct{ s *memkv.Store }

func (b baseView) has(key string) bool {
	_, err := b.s.Get(context.Background(), key)
	return err == nil
}

func (m *monitor) violate(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.viol) < 50 {
		m.viol = append(m.viol, fmt.Sprintf(format, args...))
	}
}

func (m *monitor) violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.viol)
}

func (m *monitor) session(sid string) *monSession {
	ms, ok := m.sessions[sid]
	if !ok {
		ms = &monSession{committedIDs: map[string]uint64{}, commits: map[string]int{}, expired: map[string]int{},
			holders: map[uint64]string{}, deadIDs: map[string]int{}, keys: map[string]*monKey{}}
		m.sessions[sid] = ms
		m.bySeg[seg(sid)] = sid
	}
	return ms
}

// digest is the digest of a transcript prefix, as handlers record it.
func digest(turns []Committed) string {
	h := sha256.New()
	for _, t := range turns {
		fmt.Fprintf(h, "%d|%s|%s\n", t.Seq, t.TurnID, strings.Join(t.EventIDs, ","))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func recordsDigest(turns []turnRecord) string {
	cs := make([]Committed, len(turns))
	for i := range turns {
		cs[i] = turns[i].committed("")
	}
	return digest(cs)
}

// simOutput is what the simulation's handler commits.
type simOutput struct {
	Event string `json:"event"`
	Base  string `json:"base"` // digest of the committed turns before this one
	Host  string `json:"host"`
}

// controlChanged checks one change of a control record.
func (m *monitor) controlChanged(key string, oldData, newData []byte) {
	nc, err := decodeControl(newData)
	if err != nil {
		m.violate("control record %s written unreadable: %v", key, err)
		return
	}
	oc := &control{}
	if oldData != nil {
		if oc, err = decodeControl(oldData); err != nil {
			m.violate("control record %s was unreadable: %v", key, err)
			return
		}
	}
	sid := nc.Session
	ms := m.session(sid)
	if m.trace == "" || m.trace == sid {
		ids := func(es []entry) string {
			var b strings.Builder
			for _, e := range es {
				fmt.Fprintf(&b, "%s#%d/a%d ", e.ID, e.Seq, e.Attempts)
			}
			return b.String()
		}
		ms.log = append(ms.log, fmt.Sprintf("%s holder=%s gen=%d renew=%d commit=%d pending=[%s] recent=%d unflushed=%d w=%s",
			time.Now().Format("15:04:05.000"), nc.Holder, nc.Gen, nc.Renew, nc.Commit, ids(nc.Pending), len(nc.Recent), len(nc.Unflushed), nc.Write))
	}
	if nc.Gen < oc.Gen {
		m.violate("I2 %s: generation went from %d down to %d", sid, oc.Gen, nc.Gen)
	}
	ms.maxGen = max(ms.maxGen, nc.Gen)
	if oc.Holder != "" && nc.Gen > oc.Gen && nc.Deleted == nil && m.silence > 0 {
		if quiet := time.Since(ms.lifeAt); quiet < m.silence {
			m.violate("takeover %s: %s took generation %d from %s after %s of silence; the rule is lease + margin, %s",
				sid, nc.Holder, nc.Gen, oc.Holder, quiet, m.silence)
		}
	}
	if oc.Holder != nc.Holder || oc.Gen != nc.Gen || oc.Renew != nc.Renew {
		ms.lifeAt = time.Now()
	}
	if oc.Deleted != nil && nc.Deleted == nil {
		m.violate("%s: a tombstone was overwritten by a live record", sid)
	}
	var consumed []entry // the entries this change took out of the inbox
	switch {
	case nc.Commit == oc.Commit:
	case nc.Commit != oc.Commit+1:
		m.violate("I4 %s: commit sequence went from %d to %d", sid, oc.Commit, nc.Commit)
	default:
		u := nc.unflushed(nc.Commit)
		if u == nil {
			m.violate("I6 %s: commit %d is not in the record's unflushed turns", sid, nc.Commit)
			break
		}
		if u.Gen != nc.Gen || u.Holder != nc.Holder || oc.Gen != u.Gen || oc.Holder != u.Holder {
			m.violate("I2 %s: turn %d committed by generation %d (host %s) while the record was at generation %d (host %s)",
				sid, u.Seq, u.Gen, u.Holder, oc.Gen, oc.Holder)
		}
		if h, ok := ms.holders[u.Gen]; ok && h != u.Holder {
			m.violate("I2 %s: generation %d committed by two hosts, %s and %s", sid, u.Gen, h, u.Holder)
		}
		ms.holders[u.Gen] = u.Holder
		if u.Seq != uint64(len(ms.committed))+1 {
			m.violate("I4 %s: turn %d committed after %d turns", sid, u.Seq, len(ms.committed))
		}
		for _, id := range u.EventIDs {
			// An id is committed again only after a re-delivery that came
			// when the session no longer remembered it (the window).
			if prev, ok := ms.committedIDs[id]; ok && ms.commits[id] >= 1+ms.expired[id] {
				m.violate("I1 %s: event %s committed twice (turns %d and %d)", sid, id, prev, u.Seq)
			}
			ms.committedIDs[id] = u.Seq
			ms.commits[id]++
		}
		if len(u.Output) > 0 {
			var out simOutput
			if err := json.Unmarshal(u.Output[0], &out); err == nil && out.Base != "" {
				n := min(int(u.Seq)-1, len(ms.committed))
				if want := recordsDigest(ms.committed[:n]); out.Base != want {
					m.violate("I6 %s: turn %d (host %s) was computed from a transcript that is not the committed one (digest %s, want %s)",
						sid, u.Seq, u.Holder, out.Base, want)
				}
			}
		}
		ms.committed = append(ms.committed, *u)
		for i, id := range u.EventIDs {
			consumed = append(consumed, entry{ID: id, Seq: u.InboxSeqs[i]})
		}
	}
	// Entries that left the inbox.
	still := map[uint64]bool{}
	for _, e := range nc.Pending {
		still[e.Seq] = true
	}
	var gone []entry
	for _, e := range oc.Pending {
		if !still[e.Seq] {
			gone = append(gone, e)
		}
	}
	if nc.Deleted != nil && oc.Deleted == nil {
		for _, e := range gone {
			if !slices.Contains(nc.Deleted.Discarded, e.ID) {
				m.violate("I1 %s: deletion dropped event %s without listing it", sid, e.ID)
			}
		}
		gone = nil
	}
	for i, e := range gone {
		if i >= len(oc.Pending) || oc.Pending[i].Seq != e.Seq {
			m.violate("I3 %s: event %s (inbox %d) left the inbox but was not at its head", sid, e.ID, e.Seq)
		}
		if e.Seq <= ms.lastConsumed {
			m.violate("I3 %s: event %s (inbox %d) consumed after inbox %d", sid, e.ID, e.Seq, ms.lastConsumed)
		}
		ms.lastConsumed = max(ms.lastConsumed, e.Seq)
		switch {
		case slices.ContainsFunc(consumed, func(c entry) bool { return c.Seq == e.Seq && c.ID == e.ID }):
		case m.isDead(nc, e.ID) && m.base.has(m.keys.dlq(sid, e.ID, e.Seq)):
			ms.deadIDs[e.ID]++
		default:
			m.violate("I1 %s: event %s (inbox %d) left the inbox without a commit or a dead letter", sid, e.ID, e.Seq)
		}
	}
	for _, c := range consumed {
		if !slices.ContainsFunc(gone, func(e entry) bool { return e.Seq == c.Seq }) {
			m.violate("I1 %s: turn committed event %s (inbox %d) that was not pending", sid, c.ID, c.Seq)
		}
	}
	// New entries: fresh sequence numbers; a known id only outside the
	// de-duplication window; a replay only of an event never committed.
	for _, e := range nc.Pending {
		if e.Seq >= nc.NextSeq {
			m.violate("%s: entry %d beyond nextSeq %d", sid, e.Seq, nc.NextSeq)
		}
		if e.Seq < oc.NextSeq {
			continue // not new
		}
		pendingBefore := slices.ContainsFunc(oc.Pending, func(p entry) bool { return p.ID == e.ID })
		_, rec := oc.find(e.ID)
		_, committed := ms.committedIDs[e.ID]
		switch {
		case e.Replayed && committed && ms.commits[e.ID] >= 1+ms.expired[e.ID]:
			m.violate("I1 %s: committed event %s was replayed from a stale dead letter", sid, e.ID)
		case e.Replayed:
		case pendingBefore || rec != nil:
			m.violate("I1 %s: event %s was queued again while the session still remembered it (pending or in the window)", sid, e.ID)
		case committed || ms.deadIDs[e.ID] > 0:
			if k := ms.keys[e.ID]; e.Keyed && (k == nil || !k.collected) {
				m.violate("I7 %s: keyed event %s was queued again while its kept key was in the store", sid, e.ID)
			}
			if e.Keyed {
				m.keyedAgain++
			}
			delete(ms.keys, e.ID)
			ms.expired[e.ID]++ // a re-delivery after the window: a new event, as documented
		}
	}
	// I7: ids leaving the window (not to the inbox: a replay) have their
	// kept key in the store if they are keyed.
	if nc.Deleted == nil {
		for _, r := range oc.Recent {
			if slices.ContainsFunc(nc.Recent, func(n recent) bool { return n.ID == r.ID }) ||
				slices.ContainsFunc(nc.Pending, func(e entry) bool { return e.ID == r.ID }) {
				continue
			}
			ms.keys[r.ID] = &monKey{evicted: true}
			if r.Keyed && !m.base.has(m.keys.kept(sid, r.ID)) {
				m.violate("I7 %s: keyed event %s left the window before its kept key was written", sid, r.ID)
			}
		}
	}
	// I5: every blob the record references exists.
	for _, e := range nc.Pending {
		if e.Blob != "" && !m.base.has(m.keys.blob(sid, e.Blob)) {
			m.violate("I5 %s: pending event %s references the missing blob %s", sid, e.ID, e.Blob)
		}
	}
}

func (m *monitor) isDead(c *control, id string) bool {
	_, r := c.find(id)
	return r != nil && r.Dead
}

// beforeDelete checks that a blob being deleted is not referenced (I5).
func (m *monitor) beforeDelete(key string) {
	rest, ok := strings.CutPrefix(key, m.keys.root+"data/")
	if !ok {
		return
	}
	segment, tail, _ := strings.Cut(rest, "/")
	sid, ok := m.bySeg[segment]
	if !ok {
		return
	}
	c := m.current(sid)
	if c == nil || c.Deleted != nil {
		return // a deleted session's keys go
	}
	if strings.HasPrefix(tail, "keys/") {
		m.keptDeleted(sid, key)
		return
	}
	ref, isBlob := strings.CutPrefix(tail, "in/")
	if !isBlob {
		if strings.HasPrefix(tail, "turns/") {
			m.violate("I6 %s: committed turn key %s deleted", sid, key)
		}
		return
	}
	for _, e := range c.Pending {
		if e.Blob == ref {
			m.violate("I5 %s: blob %s deleted while pending event %s references it", sid, ref, e.ID)
		}
	}
}

// beforePut checks plain writes of turn keys and turn outputs (I6).
func (m *monitor) beforePut(key string, value []byte) {
	rest, ok := strings.CutPrefix(key, m.keys.root+"data/")
	if !ok {
		return
	}
	segment, tail, _ := strings.Cut(rest, "/")
	sid, ok := m.bySeg[segment]
	if !ok {
		return
	}
	ms := m.session(sid)
	switch {
	case strings.HasPrefix(tail, "turns/"):
		t, err := decodeTurn(value)
		if err != nil {
			m.violate("I6 %s: %s written unreadable: %v", sid, key, err)
			return
		}
		if t.Seq == 0 || t.Seq > uint64(len(ms.committed)) {
			m.violate("I6 %s: %s written before turn %d was committed", sid, key, t.Seq)
			return
		}
		want := ms.committed[t.Seq-1]
		if t.TurnID != want.TurnID || t.Gen != want.Gen || !slices.Equal(t.EventIDs, want.EventIDs) || !sameOutput(t, &want) {
			m.violate("I6 %s: %s written with turn %s (gen %d), but the committed turn is %s (gen %d)",
				sid, key, t.TurnID, t.Gen, want.TurnID, want.Gen)
		}
	case strings.HasPrefix(tail, "keys/"):
		k, err := decodeKeptKey(value)
		if err != nil {
			m.violate("I7 %s: %s written unreadable: %v", sid, key, err)
			return
		}
		switch {
		case k.Dead && ms.deadIDs[k.EventID] == 0:
			m.violate("I7 %s: kept key of %s says dead-lettered; it never was", sid, k.EventID)
		case !k.Dead && !slices.ContainsFunc(ms.committed, func(t turnRecord) bool { return t.Seq == k.Seq && slices.Contains(t.EventIDs, k.EventID) }):
			m.violate("I7 %s: kept key of %s names turn %d, which did not consume it", sid, k.EventID, k.Seq)
		}
	case strings.HasPrefix(tail, "out/"):
		ref := strings.TrimPrefix(tail, "out/")
		for _, c := range ms.committed {
			if c.Ref == ref {
				t, err := decodeTurn(value)
				if err != nil || t.TurnID != c.TurnID {
					m.violate("I6 %s: the output %s of committed turn %d was overwritten", sid, key, c.Seq)
				}
			}
		}
	}
}

// keptDeleted checks the deletion of a live session's kept key (I7): at
// least keyWindow after it was written, in real time (its time is on its
// writer's clock, whose offset the monitor knows).
func (m *monitor) keptDeleted(sid, key string) {
	data, err := m.base.s.Get(context.Background(), key)
	if err != nil {
		return
	}
	k, err := decodeKeptKey(data)
	if err != nil {
		return
	}
	if m.keyWindow > 0 {
		var off time.Duration
		if m.offset != nil {
			off = m.offset(k.Host)
		}
		if written := k.At.Add(-off); time.Since(written) < m.keyWindow {
			m.violate("I7 %s: the kept key of %s was deleted %s after it was written (by %s); the window is %s",
				sid, k.EventID, time.Since(written), k.Host, m.keyWindow)
		}
	}
	if mk := m.session(sid).keys[k.EventID]; mk != nil && mk.evicted {
		mk.collected = true
		m.keysCollected++
	}
}

// sameOutput compares a flushed turn's output with the committed one
// (whose output may be by reference).
func sameOutput(t, want *turnRecord) bool {
	if want.Ref != "" {
		return true // checked when out/ was written
	}
	if len(t.Output) != len(want.Output) {
		return false
	}
	for i := range t.Output {
		if string(t.Output[i]) != string(want.Output[i]) {
			return false
		}
	}
	return true
}

// current returns a session's control record in the base store.
func (m *monitor) current(sid string) *control {
	data, err := m.base.s.Get(context.Background(), m.keys.ctl(sid))
	if err != nil {
		return nil
	}
	c, err := decodeControl(data)
	if err != nil {
		return nil
	}
	return c
}

// effect records a side effect of generation gen (self-fencing).
func (m *monitor) effect(sid string, gen uint64) {
	ms := m.session(sid)
	if ms.maxGen > gen {
		m.violate("self-fencing %s: a side effect of generation %d started after generation %d existed", sid, gen, ms.maxGen)
	}
}
