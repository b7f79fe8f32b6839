package ledger

import (
	"sync/atomic"
)

// counters are the Ledger's running totals.
type counters struct {
	held, acquired, takeovers, fencedCommits, selfFenced, deadLettered,
	delivered, duplicates, commits atomic.Int64
}

// Stats are counters of one Ledger since Open, for metrics.
type Stats struct {
	// LeasesHeld is the number of sessions this host runs now.
	LeasesHeld int64
	// InboxDepth is the number of events pending in the sessions this
	// host runs, as of its latest view of each.
	InboxDepth int64
	// Delivered counts acknowledged new events; Duplicates deliveries of
	// known ones.
	Delivered, Duplicates int64
	// Acquired counts leases taken by deliveries; Takeovers those taken by
	// the janitor from a silent or absent holder.
	Acquired, Takeovers int64
	// Commits counts committed turns; FencedCommits commits refused because
	// the lease had moved on.
	Commits, FencedCommits int64
	// SelfFenced counts turns canceled because renewal was overdue.
	SelfFenced int64
	// DeadLettered counts events moved to the dead-letter store.
	DeadLettered int64
}

// Stats returns the counters.
func (l *Ledger) Stats() Stats {
	st := Stats{
		LeasesHeld: l.stats.held.Load(), Delivered: l.stats.delivered.Load(), Duplicates: l.stats.duplicates.Load(),
		Acquired: l.stats.acquired.Load(), Takeovers: l.stats.takeovers.Load(), Commits: l.stats.commits.Load(),
		FencedCommits: l.stats.fencedCommits.Load(), SelfFenced: l.stats.selfFenced.Load(), DeadLettered: l.stats.deadLettered.Load(),
	}
	l.mu.Lock()
	sessions := make([]*session, 0, len(l.sessions))
	for _, s := range l.sessions {
		sessions = append(sessions, s)
	}
	l.mu.Unlock()
	for _, s := range sessions {
		s.mu.Lock()
		if s.run != nil && s.ctl != nil {
			st.InboxDepth += int64(len(s.ctl.Pending))
		}
		s.mu.Unlock()
	}
	return st
}

// Settings are the settings a Ledger runs with, defaults filled in, for
// an operator to read (GET /v1/info).
type Settings struct {
	HostID string
	Tuning
	Passive bool
}

// Settings returns the settings in force.
func (l *Ledger) Settings() Settings {
	return Settings{HostID: l.opts.HostID, Tuning: l.opts.Tuning, Passive: l.opts.Passive}
}
