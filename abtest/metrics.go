package abtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// SessionMetrics is what one session did in one experiment so far: the
// content of every A/B sample. Samples are cumulative: each carries the
// session's whole history, every turn's latency included (in a bounded
// sketch), so the latest sample of a session holds everything its earlier
// ones did and a lost sample never merges two turns into one.
type SessionMetrics struct {
	// Variant is the variant the session is enrolled in.
	Variant string `json:"variant"`
	// Turns counts the session's completed and failed turns.
	Turns int64 `json:"turns"`
	// FailedTurns counts the turns that ended with status failed.
	FailedTurns int64 `json:"failedTurns"`
	// InputTokens and OutputTokens sum the turns' token usage.
	InputTokens  int64 `json:"inputTokens"`
	OutputTokens int64 `json:"outputTokens"`
	// Latency holds every turn's latency in milliseconds, from the turn's
	// start to its end, model calls and tools included: one count per
	// turn, in a sketch whose size does not grow with the turns. (Format 1
	// of a sample, read still, listed each latency in "latenciesMs".)
	Latency LatencySketch `json:"latency"`
	// UpdatedAt is when the session's latest turn ended.
	UpdatedAt time.Time `json:"updatedAt"`
}

// Turn is one finished turn, as AddTurn takes it.
type Turn struct {
	Failed       bool
	InputTokens  int64
	OutputTokens int64
	Latency      time.Duration
	At           time.Time
}

// AddTurn returns m with one more turn.
func (m SessionMetrics) AddTurn(t Turn) SessionMetrics {
	m.Latency = m.Latency.Add(t.Latency.Milliseconds())
	m.Turns++
	if t.Failed {
		m.FailedTurns++
	}
	m.InputTokens += t.InputTokens
	m.OutputTokens += t.OutputTokens
	m.UpdatedAt = t.At.UTC()
	return m
}

// check reports a metrics document no session could have produced.
func (m SessionMetrics) check() error {
	switch {
	case m.Turns < 0 || m.FailedTurns < 0 || m.FailedTurns > m.Turns:
		return fmt.Errorf("turns %d and failedTurns %d are inconsistent", m.Turns, m.FailedTurns)
	case m.Latency.Count() != m.Turns:
		return fmt.Errorf("%d latencies for %d turns", m.Latency.Count(), m.Turns)
	case m.Variant == "":
		return errors.New("no variant")
	}
	return nil
}

// UnmarshalJSON reads a sample's metrics in either format: "latency" (a
// LatencySketch), or format 1's "latenciesMs" (every latency), which it
// turns into a sketch.
func (m *SessionMetrics) UnmarshalJSON(data []byte) error {
	type plain SessionMetrics // without this method
	var doc struct {
		plain
		LatenciesMs []int64 `json:"latenciesMs"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return err
	}
	*m = SessionMetrics(doc.plain)
	if m.Latency.Count() == 0 && len(doc.LatenciesMs) > 0 {
		m.Latency = sketchOf(doc.LatenciesMs)
	}
	return nil
}

// dominates reports whether m is at least as recent as o: more turns, or
// as many and a later (or the same) update time.
func (m SessionMetrics) dominates(o SessionMetrics) bool {
	if m.Turns != o.Turns {
		return m.Turns > o.Turns
	}
	return !m.UpdatedAt.Before(o.UpdatedAt)
}

// wins reports whether m replaces o in a join: m is more recent, or, for
// two different documents of the same recency (which only a damaged store
// produces), m comes first in a fixed order, so that every host picks the
// same one.
func (m SessionMetrics) wins(o SessionMetrics) bool {
	if m.dominates(o) != o.dominates(m) {
		return m.dominates(o)
	}
	a, _ := json.Marshal(m)
	b, _ := json.Marshal(o)
	return string(a) < string(b)
}

// State is every enrolled session's latest metrics: experiment name to
// session id to metrics. Join merges two states without counting a session
// twice, whichever hosts saw it, in whatever order the states are joined.
type State map[string]map[string]SessionMetrics

// Join merges o into s: for each session, the metrics with more turns win
// (on a tie, the later update). Join is commutative, associative and
// idempotent, so hosts may merge each other's states any number of times.
// It reports whether s changed.
func (s State) Join(o State) bool {
	changed := false
	for exp, sessions := range o {
		mine := s[exp]
		if mine == nil {
			mine = map[string]SessionMetrics{}
			s[exp] = mine
		}
		for id, m := range sessions {
			if cur, ok := mine[id]; !ok || m.wins(cur) {
				mine[id] = m
				changed = true
			}
		}
	}
	return changed
}

// Includes reports whether s holds every session of o at least as recent.
func (s State) Includes(o State) bool {
	for exp, sessions := range o {
		for id, m := range sessions {
			cur, ok := s[exp][id]
			if !ok || !cur.dominates(m) {
				return false
			}
		}
	}
	return true
}

// Clone returns a deep copy of s (latency sketches are shared: they are
// values, never changed in place).
func (s State) Clone() State {
	out := make(State, len(s))
	for exp, sessions := range s {
		c := make(map[string]SessionMetrics, len(sessions))
		for id, m := range sessions {
			c[id] = m
		}
		out[exp] = c
	}
	return out
}

// Sessions counts the sessions of s over all experiments.
func (s State) Sessions() int {
	n := 0
	for _, sessions := range s {
		n += len(sessions)
	}
	return n
}

// SnapshotVersion is the format version of the snapshot document. Version
// 2 keeps each session's latencies in a LatencySketch ("latency"); version
// 1, which listed them all ("latenciesMs"), is read and rewritten as 2, and
// a build that reads only version 1 refuses a version 2 snapshot instead of
// overwriting it.
const SnapshotVersion = 2

// maxHosts bounds the host marks a snapshot keeps: the most recently
// updated ones.
const maxHosts = 64

// Snapshot is the A/B snapshot document stored through the A/B table: the
// merged state of every host that flushed, when each host last did, and
// the figures computed from the state at the time of the write (for
// readers of the table other than agentkit, such as an analytics job).
type Snapshot struct {
	V         int                 `json:"v"`
	UpdatedAt time.Time           `json:"updatedAt"`
	Hosts     map[string]HostMark `json:"hosts"`
	Sessions  State               `json:"sessions"`
	Figures   []ExperimentFigures `json:"figures,omitempty"`
}

// HostMark records a host's last flush into the snapshot.
type HostMark struct {
	// UpdatedAt is when the host last wrote its state.
	UpdatedAt time.Time `json:"updatedAt"`
	// Sessions is how many enrolled sessions the host had seen then.
	Sessions int `json:"sessions"`
}

// DecodeSnapshot reads a stored snapshot document. Nil or empty data is
// the empty snapshot. A document with a newer format version is refused
// (so that this build never overwrites what it cannot read), as is one
// whose sessions hold impossible metrics.
func DecodeSnapshot(data []byte) (Snapshot, error) {
	s := Snapshot{V: SnapshotVersion, Hosts: map[string]HostMark{}, Sessions: State{}}
	if len(data) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return Snapshot{}, fmt.Errorf("abtest: the stored A/B snapshot is not a snapshot document: %w", err)
	}
	if s.V > SnapshotVersion {
		return Snapshot{}, fmt.Errorf("abtest: the stored A/B snapshot has format version %d and this build reads up to %d; upgrade agentkit on this host", s.V, SnapshotVersion)
	}
	if s.Hosts == nil {
		s.Hosts = map[string]HostMark{}
	}
	if s.Sessions == nil {
		s.Sessions = State{}
	}
	for exp, sessions := range s.Sessions {
		for id, m := range sessions {
			if err := m.check(); err != nil {
				return Snapshot{}, fmt.Errorf("abtest: the stored A/B snapshot's session %q in experiment %q: %v", id, exp, err)
			}
		}
	}
	return s, nil
}

// pruneHosts keeps the maxHosts most recently updated host marks.
func (s *Snapshot) pruneHosts() {
	if len(s.Hosts) <= maxHosts {
		return
	}
	type mark struct {
		id string
		at time.Time
	}
	marks := make([]mark, 0, len(s.Hosts))
	for id, h := range s.Hosts {
		marks = append(marks, mark{id, h.UpdatedAt})
	}
	slices.SortFunc(marks, func(a, b mark) int { return b.at.Compare(a.at) })
	for _, m := range marks[maxHosts:] {
		delete(s.Hosts, m.id)
	}
}
