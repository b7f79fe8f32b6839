package server

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"agentkit/agent"
)

// Metrics is the Prometheus metrics set of a server. It is the runtime's
// agent.Observer (turns, mirror drops, store operations) and records the
// HTTP requests; Handler exports it. Safe for concurrent use.
//
// The metrics, all prefixed agentkit_:
//
//	turns_total{status}                         turns that ended, by status (completed, failed)
//	turn_duration_seconds{status}               histogram of turn latency
//	mirror_write_failures_total                 session mirror writes the store refused (each kept and retried)
//	mirror_writes_dropped_total                 the same count under its first name, kept for existing dashboards
//	ab_samples_dropped_total                    A/B samples the store refused (each lost)
//	mirror_backlog_sessions                     sessions whose mirror writes wait to be retried
//	mirror_forks_total                          turns that lost the session head to another host (kept locally)
//	store_operation_duration_seconds{op}        histogram of store latency per kv operation
//	store_operations_total{op,result}           store operations by result (ok, not_found, error)
//	http_requests_total{route,code}             requests by route pattern and status
//	http_request_duration_seconds{route}        histogram of request latency (a streamed turn counts whole)
//	event_streams_open                          live event streams (GET .../events as text/event-stream)
//	build_info{version}                         1, labelled with the version
//
// In serving mode ledger, from the ledger's Stats (ledger_*_total count
// since the server started; docs/ledger.md#metrics):
//
//	ledger_leases_held                          sessions this host holds now
//	ledger_inbox_depth                          messages pending in them
//	ledger_deliveries_total                     messages acknowledged
//	ledger_duplicate_deliveries_total           retries of known message ids
//	ledger_leases_acquired_total                leases taken by a delivery
//	ledger_takeovers_total                      sessions taken over by the janitor
//	ledger_commits_total                        turns committed
//	ledger_fenced_commits_total                 commits refused: the lease had moved on
//	ledger_self_fenced_turns_total              turns stopped: lease renewal overdue
//	ledger_dead_letters_total                   messages dead-lettered
//	ledger_ack_duration_seconds                 histogram of acknowledgement latency
//
// plus the Go runtime's and the process's standard collectors (go_*,
// process_*).
type Metrics struct {
	reg           *prometheus.Registry
	turns         *prometheus.CounterVec
	turnSeconds   *prometheus.HistogramVec
	mirrorDropped prometheus.Counter
	mirrorFailed  prometheus.Counter
	mirrorBacklog prometheus.Gauge
	mirrorForks   prometheus.Counter
	storeSeconds  *prometheus.HistogramVec
	storeOps      *prometheus.CounterVec
	httpRequests  *prometheus.CounterVec
	httpSeconds   *prometheus.HistogramVec
	streams       prometheus.Gauge
	buildInfo     *prometheus.GaugeVec
	ackSeconds    prometheus.Histogram // registered in serving mode ledger
}

var _ agent.Observer = (*Metrics)(nil)

// NewMetrics returns a metrics set on a registry of its own.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_turns_total", Help: "Turns that ended, by status (completed or failed).",
		}, []string{"status"}),
		turnSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentkit_turn_duration_seconds",
			Help:    "How long turns ran, from the user message to the final answer, by status.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"status"}),
		mirrorDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentkit_mirror_writes_dropped_total",
			Help: "The same count as agentkit_mirror_write_failures_total under its first name, kept for existing dashboards: no write is dropped, each is kept and retried.",
		}),
		mirrorFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentkit_mirror_write_failures_total",
			Help: "Session mirror writes (event batches, heads, metadata, continuation tokens) the store refused; each is logged, kept and retried.",
		}),
		mirrorBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentkit_mirror_backlog_sessions",
			Help: "Sessions whose mirror writes wait to be retried (the store lacks some of their events or records).",
		}),
		mirrorForks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentkit_mirror_forks_total",
			Help: "Turns of this host that lost the session head to another host; their events are kept locally as forks.",
		}),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentkit_store_operation_duration_seconds",
			Help:    "Latency of store operations, by kv operation (a listing runs until its iteration ends).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"op"}),
		storeOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_store_operations_total",
			Help: "Store operations by kv operation and result: ok, not_found (a Get miss) or error.",
		}, []string{"op", "result"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_http_requests_total", Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		httpSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentkit_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern; a streamed request counts until its stream ends.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentkit_event_streams_open", Help: "Live session event streams being served.",
		}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentkit_build_info", Help: "Always 1; the version label names the running agentkit.",
		}, []string{"version"}),
		ackSeconds: newAckHistogram(),
	}
	m.reg.MustRegister(m.turns, m.turnSeconds, m.mirrorDropped, m.mirrorFailed, m.mirrorBacklog, m.mirrorForks, m.storeSeconds, m.storeOps,
		m.httpRequests, m.httpSeconds, m.streams, m.buildInfo,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, s := range []agent.TurnStatus{agent.StatusCompleted, agent.StatusFailed} {
		m.turns.WithLabelValues(string(s)) // export zeroes before the first turn
	}
	return m
}

// Registry returns the registry the metrics are on, to add a program's own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// TurnFinished counts a turn and observes its latency.
func (m *Metrics) TurnFinished(status agent.TurnStatus, d time.Duration) {
	m.turns.WithLabelValues(string(status)).Inc()
	m.turnSeconds.WithLabelValues(string(status)).Observe(d.Seconds())
}

// MirrorDropped counts a mirror write the store refused.
func (m *Metrics) MirrorDropped(string, error) {
	m.mirrorFailed.Inc()
	m.mirrorDropped.Inc()
}

// MirrorBacklog sets the number of sessions waiting for mirror retries.
func (m *Metrics) MirrorBacklog(sessions int) { m.mirrorBacklog.Set(float64(sessions)) }

// MirrorForked counts a turn that lost the session head to another host.
func (m *Metrics) MirrorForked(string, int) { m.mirrorForks.Inc() }

// StoreOp observes a store operation's latency and counts its result.
func (m *Metrics) StoreOp(op string, d time.Duration, err error) {
	m.storeSeconds.WithLabelValues(op).Observe(d.Seconds())
	result := "ok"
	switch {
	case errors.Is(err, agent.ErrKeyNotFound):
		result = "not_found"
	case err != nil:
		result = "error"
	}
	m.storeOps.WithLabelValues(op, result).Inc()
}

func (m *Metrics) httpRequest(route string, status int, d time.Duration) {
	m.httpRequests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.httpSeconds.WithLabelValues(route).Observe(d.Seconds())
}

func (m *Metrics) streamOpened() { m.streams.Inc() }
func (m *Metrics) streamClosed() { m.streams.Dec() }

func (m *Metrics) setBuildInfo(version string) {
	if version == "" {
		version = "unknown"
	}
	m.buildInfo.Reset()
	m.buildInfo.WithLabelValues(version).Set(1)
}

// observers fans the runtime's callbacks out to several observers.
type observers []agent.Observer

func (o observers) TurnFinished(s agent.TurnStatus, d time.Duration) {
	for _, x := range o {
		x.TurnFinished(s, d)
	}
}

func (o observers) MirrorDropped(key string, err error) {
	for _, x := range o {
		x.MirrorDropped(key, err)
	}
}

func (o observers) MirrorBacklog(n int) {
	for _, x := range o {
		x.MirrorBacklog(n)
	}
}

func (o observers) MirrorForked(id string, events int) {
	for _, x := range o {
		x.MirrorForked(id, events)
	}
}

func (o observers) StoreOp(op string, d time.Duration, err error) {
	for _, x := range o {
		x.StoreOp(op, d, err)
	}
}

// registerABDrops exports the count of A/B samples the store refused,
// read from dropped at each scrape. A second call for the same Metrics (a
// second server over it) keeps the first.
func (m *Metrics) registerABDrops(dropped func() uint64) {
	c := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "agentkit_ab_samples_dropped_total",
		Help: "A/B samples the store refused since the runtime opened; each is lost (logged with its key).",
	}, func() float64 { return float64(dropped()) })
	if err := m.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err) // a name clash in this package: a bug
		}
	}
}
