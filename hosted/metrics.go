package hosted

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is the service's Prometheus set. Every name is prefixed
// agentkit_storaged_:
//
//	requests_total{op,namespace,code}          requests by operation, namespace and HTTP status
//	errors_total{op,namespace,code}            answers of 400 and more, by protocol error code
//	request_duration_seconds{op,namespace}     histogram of request latency (a listing page counts whole)
//	replayed_writes_total{namespace}           writes answered from the de-duplication record
//	requests_in_flight                         requests being served
//	credentials                                credentials loaded
//	credential_reloads_total{result}           reloads of the credentials file (ok, error)
//	forgotten_requests_total                   request ids removed after the de-duplication window
//	backend_up                                 1 when the last health check reached the backend
//
// namespace is "-" for requests that did not authenticate, so the label's
// values are bounded by the credentials file.
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	errors    *prometheus.CounterVec
	seconds   *prometheus.HistogramVec
	replays   *prometheus.CounterVec
	inflight  prometheus.Gauge
	creds     prometheus.Gauge
	reloads   *prometheus.CounterVec
	forgotten prometheus.Counter
	backendUp prometheus.Gauge

	// children caches the series of each (op, namespace, status, code),
	// so a request costs no label hashing: the label values are bounded
	// (namespaces by the credentials file).
	children sync.Map // seriesKey → *series
}

type seriesKey struct {
	op, ns string
	status int
	code   string
}

type series struct {
	requests prometheus.Counter
	seconds  prometheus.Observer
	errors   prometheus.Counter // nil without an error code
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_storaged_requests_total", Help: "Requests by operation, namespace and HTTP status.",
		}, []string{"op", "namespace", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_storaged_errors_total", Help: "Answers with a status of 400 or more, by protocol error code.",
		}, []string{"op", "namespace", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentkit_storaged_request_duration_seconds",
			Help:    "Request latency by operation and namespace.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"op", "namespace"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_storaged_replayed_writes_total", Help: "Writes answered from the de-duplication record instead of being applied again.",
		}, []string{"namespace"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentkit_storaged_requests_in_flight", Help: "Requests being served.",
		}),
		creds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentkit_storaged_credentials", Help: "Credentials loaded from the credentials file.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentkit_storaged_credential_reloads_total", Help: "Reloads of the credentials file, by result (ok, error).",
		}, []string{"result"}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentkit_storaged_forgotten_requests_total", Help: "Request ids removed after the de-duplication window.",
		}),
		backendUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentkit_storaged_backend_up", Help: "1 when the last health check reached the backend, else 0.",
		}),
	}
	m.reg.MustRegister(m.requests, m.errors, m.seconds, m.replays, m.inflight, m.creds, m.reloads, m.forgotten, m.backendUp,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(op, ns string, status int, code string, d time.Duration) {
	if ns == "" {
		ns = "-"
	}
	k := seriesKey{op, ns, status, code}
	v, ok := m.children.Load(k)
	if !ok {
		s := &series{requests: m.requests.WithLabelValues(op, ns, strconv.Itoa(status)), seconds: m.seconds.WithLabelValues(op, ns)}
		if code != "" {
			s.errors = m.errors.WithLabelValues(op, ns, code)
		}
		v, _ = m.children.LoadOrStore(k, s)
	}
	s := v.(*series)
	s.requests.Inc()
	s.seconds.Observe(d.Seconds())
	if s.errors != nil {
		s.errors.Inc()
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
