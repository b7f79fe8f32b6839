package server

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"agentkit/agent"
)

// ledgerCollector exports the runtime's ledger counters as metrics, read
// at each scrape.
type ledgerCollector struct {
	rt    *agent.Runtime
	descs []ledgerMetric
}

type ledgerMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(agent.LedgerStats) int64
}

func newLedgerCollector(rt *agent.Runtime) *ledgerCollector {
	m := func(name, help string, kind prometheus.ValueType, v func(agent.LedgerStats) int64) ledgerMetric {
		return ledgerMetric{desc: prometheus.NewDesc("agentkit_ledger_"+name, help, nil, nil), kind: kind, value: v}
	}
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	return &ledgerCollector{rt: rt, descs: []ledgerMetric{
		m("leases_held", "Sessions this host holds the lease of (runs the turns of) now.", g, func(s agent.LedgerStats) int64 { return s.LeasesHeld }),
		m("inbox_depth", "Messages pending in the sessions this host holds.", g, func(s agent.LedgerStats) int64 { return s.InboxDepth }),
		m("deliveries_total", "Messages acknowledged (new, not duplicates) by this host.", c, func(s agent.LedgerStats) int64 { return s.Delivered }),
		m("duplicate_deliveries_total", "Deliveries of a message id the session already had (a retry), answered without queueing it again.", c, func(s agent.LedgerStats) int64 { return s.Duplicates }),
		m("leases_acquired_total", "Leases this host took with a delivery to a session no host held.", c, func(s agent.LedgerStats) int64 { return s.Acquired }),
		m("takeovers_total", "Sessions this host's janitor took over from a silent holder, or picked up with messages and no holder.", c, func(s agent.LedgerStats) int64 { return s.Takeovers }),
		m("commits_total", "Turns this host committed.", c, func(s agent.LedgerStats) int64 { return s.Commits }),
		m("fenced_commits_total", "Commits of this host refused because another host had taken the session over; their output was discarded.", c, func(s agent.LedgerStats) int64 { return s.FencedCommits }),
		m("self_fenced_turns_total", "Turns this host stopped because its lease renewal was overdue.", c, func(s agent.LedgerStats) int64 { return s.SelfFenced }),
		m("dead_letters_total", "Messages this host moved to the dead-letter store after their last attempt failed.", c, func(s agent.LedgerStats) int64 { return s.DeadLettered }),
	}}
}

// Describe sends the descriptions of the ledger metrics.
func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d.desc
	}
}

// Collect reads the ledger's Stats once and sends every metric.
func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	st, _ := c.rt.LedgerStats()
	for _, d := range c.descs {
		ch <- prometheus.MustNewConstMetric(d.desc, d.kind, float64(d.value(st)))
	}
}

// newAckHistogram is agentkit_ledger_ack_duration_seconds.
func newAckHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "agentkit_ledger_ack_duration_seconds",
		Help:    "How long acknowledging a message took (a ledger delivery, duplicates included), from the call to its durable append.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
	})
}

// LedgerDelivered observes one ledger delivery: an acknowledged one's
// latency goes to agentkit_ledger_ack_duration_seconds; refusals and
// failures are not acknowledgements and are not observed. It has the
// signature of agent.LedgerOptions.OnDeliver, which Serve sets to it in
// serving mode ledger.
func (m *Metrics) LedgerDelivered(_ agent.LedgerDelivery, took time.Duration, err error) {
	if err == nil {
		m.ackSeconds.Observe(took.Seconds())
	}
}

// registerLedger adds the ledger metrics to the registry. A second call
// for the same Metrics (a second server over it) keeps the first.
func (m *Metrics) registerLedger(rt *agent.Runtime) {
	for _, c := range []prometheus.Collector{newLedgerCollector(rt), m.ackSeconds} {
		if err := m.reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				panic(err) // a name clash in this package: a bug
			}
		}
	}
}
