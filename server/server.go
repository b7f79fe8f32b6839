// Package server is agentkit's HTTP API: the session, event, session
// state, reminder and info routes of an agent runtime (package agent),
// health and Prometheus metrics, bearer-token auth and request logging, on
// net/http alone.
//
// A program that defines its agent in Go serves it with Serve:
//
//	err := server.Serve(ctx, agent.Config{Agent: a, StateRoot: ".agentkit"}, server.Config{
//		Addr:    "127.0.0.1:8080",
//		Options: server.Options{AuthToken: os.Getenv("AGENTKIT_AUTH_TOKEN")},
//	})
//
// Serve opens the runtime with the metrics observer, listens, and on ctx's
// end stops accepting requests, lets running turns finish and closes the
// runtime. To mount the API in a server of your own, open the runtime with
// a Metrics as its Observer and call New.
//
// Every error is JSON, {"error": {"code": "...", "message": "..."}}: 400
// bad input (the message names the field), 401 a missing or wrong bearer
// token, 403 a browser page on an origin the server does not allow, 404 an
// unknown route, session, token or reminder, 405 a method a route does not
// take, 409 a session busy past the request's deadline (or a session's
// actor state held by another host, or refused in serving mode ledger),
// 413 a body over the limit, 415 a state write without its media type, 421
// a Host the server does not answer for (Options.AllowedHosts, against DNS
// rebinding), 422 a session state that is not a JSON object, 503 the store
// unavailable or the server shutting down. docs/http-api.md lists the
// routes.
//
// The package imports no store driver: programs blank-import the drivers
// they open by URL.
package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"agentkit/agent"
	"agentkit/evals"
)

// DefaultMaxBodyBytes is the request body limit when Options.MaxBodyBytes
// is zero: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultKeepAlive is how often an idle event stream gets a comment line
// when Options.KeepAlive is zero, so proxies keep the connection open.
const DefaultKeepAlive = 15 * time.Second

// Options configures the handler New returns.
type Options struct {
	// AuthToken, when set, is the bearer token every /v1/ route requires
	// (Authorization: Bearer <token>). /healthz and /metrics stay open.
	AuthToken string
	// MaxBodyBytes limits request bodies; a larger body is answered 413.
	// Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Version is reported by GET /v1/info and the agentkit_build_info
	// metric.
	Version string
	// Logger receives one record per request (never tokens or message
	// bodies) and the errors behind 500 answers; nil means slog.Default().
	Logger *slog.Logger
	// Metrics is the metrics set GET /metrics exports. Pass the one given
	// to the runtime as its Observer so turn and store metrics appear; nil
	// means a new set with the HTTP metrics only.
	Metrics *Metrics
	// KeepAlive is the comment interval of idle event streams; zero means
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// CORSOrigins are the origins of browser pages on other sites allowed
	// to call the /v1/ routes, such as https://chat.example.com (see
	// CheckOrigins). Empty: none; requests from other origins get 403.
	CORSOrigins []string
	// AllowedHosts are the names (and addresses) clients reach the server
	// by, beyond the loopback names localhost, 127.0.0.1 and [::1], such
	// as agent.example.com, 192.0.2.10, or .example.com for a domain and
	// the names under it (see CheckHostNames). Without an AuthToken every
	// request, on every route, whose Host header names none of them (nor
	// the address Serve listens on) is answered 421 host_not_allowed: a
	// page whose name was pointed at this machine (DNS rebinding) would
	// otherwise be the server's own origin for the browser. With an
	// AuthToken the Host is checked only when AllowedHosts is set.
	AllowedHosts []string
	// Evals tunes the eval runs of POST /v1/evals.
	Evals EvalOptions

	// listenHost is the host part of the address Serve listens on, which
	// the Host check accepts too.
	listenHost string
}

// Server is the HTTP API of one agent runtime. It is an http.Handler, safe
// for concurrent use.
type Server struct {
	rt        *agent.Runtime
	opts      Options
	log       *slog.Logger
	metrics   *Metrics
	mux       *router
	tokenHash []byte // sha256 of the token; nil when auth is off
	evals     *evals.Manager
	cors      *cors
	hosts     *hostPolicy

	drainOnce sync.Once
	draining  chan struct{} // closed by Drain

	// turns is the parent of every turn's context: not canceled when a
	// client goes away (a turn that started finishes and is recorded), only
	// by cancelTurns when a shutdown runs out of time, with errShuttingDown
	// as the cause the canceled turns record.
	turns       context.Context
	cancelTurns context.CancelCauseFunc
}

// New returns the HTTP API of rt. The runtime stays the caller's to close,
// after the HTTP server has shut down.
func New(rt *agent.Runtime, opts Options) (*Server, error) {
	if rt == nil {
		return nil, errors.New("server: New needs a runtime; open one with agent.Open")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, errors.New("server: Options.MaxBodyBytes is negative; use 0 for the default or a positive limit")
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.KeepAlive <= 0 {
		opts.KeepAlive = DefaultKeepAlive
	}
	if strings.ContainsAny(opts.AuthToken, " \t\r\n") {
		return nil, errors.New("server: the auth token contains white space; use a token of printable characters without spaces")
	}
	hosts, err := newHostPolicy(opts.AllowedHosts, opts.listenHost, opts.AuthToken)
	if err != nil {
		return nil, err
	}
	s := &Server{
		hosts:    hosts,
		rt:       rt,
		opts:     opts,
		log:      opts.Logger,
		metrics:  opts.Metrics,
		mux:      newRouter(),
		draining: make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	s.metrics.setBuildInfo(opts.Version)
	if _, ok := rt.LedgerStats(); ok {
		s.metrics.registerLedger(rt)
	}
	s.metrics.registerABDrops(rt.Binding().DroppedMirrorWrites)
	if opts.AuthToken != "" {
		h := sha256.Sum256([]byte(opts.AuthToken))
		s.tokenHash = h[:]
	}
	s.turns, s.cancelTurns = context.WithCancelCause(context.Background())
	if err := s.openEvals(); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	s.mux.HandleFunc("POST /v1/sessions", s.startSession)
	s.mux.HandleFunc("POST /v1/sessions/continue", s.continueSession)
	s.mux.HandleFunc("GET /v1/sessions", s.listSessions)
	s.mux.HandleFunc("GET /v1/sessions/{id}", s.getSession)
	s.mux.HandleFunc("GET /v1/sessions/{id}/events", s.sessionEvents)
	s.mux.HandleFunc("DELETE /v1/sessions/{id}", s.deleteSession)
	s.actorRoutes()
	s.mux.HandleFunc("POST /v1/reminders", s.createReminder)
	s.mux.HandleFunc("GET /v1/reminders", s.listReminders)
	s.mux.HandleFunc("DELETE /v1/reminders/{id}", s.deleteReminder)
	s.mux.HandleFunc("POST /v1/evals", s.startEval)
	s.mux.HandleFunc("GET /v1/evals", s.listEvals)
	s.mux.HandleFunc("GET /v1/evals/{runId}", s.getEval)
	s.mux.HandleFunc("GET /v1/abs", s.abs)
	s.deadLetterRoutes()
	s.mux.HandleFunc("GET /v1/info", s.info)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.Handle("GET /metrics", s.metrics.Handler())
	s.mux.HandleFunc("GET /{$}", s.playground)
	s.mux.Handle("GET /playground/", playgroundAssets())
	s.mux.HandleFunc("GET /favicon.ico", favicon)
}

// Drain ends the live event streams and makes /healthz answer 503, while
// requests running turns go on. Serve calls it when shutting down; a
// program with its own http.Server registers it with RegisterOnShutdown so
// that Shutdown does not wait for streams that never end.
func (s *Server) Drain() {
	s.drainOnce.Do(func() { close(s.draining) })
}

func (s *Server) isDraining() bool {
	select {
	case <-s.draining:
		return true
	default:
		return false
	}
}

// errShuttingDown is the cause of the cancellation of turns still running
// when a shutdown runs out of time; a canceled turn's failure message
// names it.
var errShuttingDown = errors.New("the server is shutting down")

// turnContext returns the context a turn runs with: r's values, canceled
// only when the server gives up on running turns, not when the client goes
// away.
func (s *Server) turnContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	stop := context.AfterFunc(s.turns, func() { cancel(context.Cause(s.turns)) })
	return ctx, func() { stop(); cancel(nil) }
}

// ServeHTTP routes a request: the Host check (Options.AllowedHosts) on
// every route, the origin policy and auth for /v1/ routes, the route's handler,
// JSON errors for unknown routes and methods, and the request's log record
// and metrics.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &responseWriter{ResponseWriter: w}
	reqID := r.Header.Get("X-Request-Id")
	if reqID == "" || len(reqID) > 128 {
		reqID = newRequestID()
	}
	rw.Header().Set("X-Request-Id", reqID)
	h, pattern := s.mux.Handler(r)
	route := pattern
	if route == "" {
		route = "unmatched"
	}
	refusedHost := false
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("server: handler panicked", "requestId", reqID, "route", route, "panic", p)
			if !rw.wroteHeader {
				writeError(rw, http.StatusInternalServerError, CodeInternal, "internal error; the server log has the details (request id "+reqID+")")
			}
		}
		status := rw.status
		if status == 0 {
			status = http.StatusOK
		}
		// What the client got: an answer still in the connection's
		// buffer when the connection was closed under it (a shutdown
		// past its timeout, a client gone) reached no one.
		sent, undelivered := status, rw.flush()
		if undelivered != nil {
			sent = 0
		}
		d := time.Since(start)
		s.metrics.httpRequest(route, sent, d)
		level := slog.LevelInfo
		if (pattern == "GET /healthz" || pattern == "GET /metrics") && !refusedHost {
			level = slog.LevelDebug // probes and scrapes would drown the log
		}
		attrs := []slog.Attr{
			slog.String("method", r.Method),
			slog.String("route", route),
			slog.String("path", r.URL.Path),
			slog.Int("status", sent),
			slog.Int64("bytes", rw.bytes),
			slog.Float64("durationMs", float64(d.Microseconds())/1000),
			slog.String("remote", r.RemoteAddr),
			slog.String("requestId", reqID),
		}
		if refusedHost { // the name an operator may mean to allow
			attrs = append(attrs, slog.String("host", clipHost(r.Host)))
		}
		msg := "http request"
		if undelivered != nil {
			// status 0: nothing reached the client; the answer it was due.
			msg = "http request: the answer did not reach the client"
			attrs = append(attrs, slog.Int("answer", status), slog.String("error", undelivered.Error()))
			if r.Method != http.MethodGet { // a reader that hung up is no news
				level = slog.LevelWarn
			}
		}
		s.log.LogAttrs(r.Context(), level, msg, attrs...)
	}()
	if !s.hosts.allows(r) {
		refusedHost = true
		s.hosts.refuse(rw, r)
		return
	}
	if s.handleCORS(rw, r) {
		return
	}
	tokenFromQuery(r)
	if strings.HasPrefix(path.Clean("/"+r.URL.Path)+"/", "/v1/") && !s.authorized(rw, r) {
		return
	}
	if allow := s.mux.shadowed(r, pattern); allow != "" {
		rw.Header().Set("Allow", allow)
		writeError(rw, http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow)
		return
	}
	if pattern == "" {
		s.unmatched(rw, r, h)
		return
	}
	ctx := context.WithValue(r.Context(), requestIDKey{}, reqID)
	s.mux.ServeHTTP(rw, r.WithContext(ctx)) // sets the path values
}

// unmatched answers a request no route took, in the JSON error shape:
// 405 with the Allow header when the path exists for other methods, 404
// otherwise (the mux's own answer decides which).
func (s *Server) unmatched(w http.ResponseWriter, r *http.Request, h http.Handler) {
	probe := &statusProbe{header: http.Header{}}
	h.ServeHTTP(probe, r)
	switch probe.status {
	case http.StatusMethodNotAllowed:
		allow := probe.header.Get("Allow")
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow)
	case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		for k, v := range probe.header {
			w.Header()[k] = v
		}
		w.WriteHeader(probe.status)
	default:
		writeError(w, http.StatusNotFound, CodeNotFound, "no route "+r.Method+" "+r.URL.Path+"; docs/http-api.md lists the routes")
	}
}

// authorized checks the bearer token, answering 401 when it is missing or
// wrong. The comparison takes the same time whatever the token sent.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.tokenHash == nil {
		return true
	}
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if h == "" || !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentkit"`)
		writeError(w, http.StatusUnauthorized, CodeUnauthorized, "this route needs a bearer token: send the header Authorization: Bearer <token> with the server's --auth-token")
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	if subtle.ConstantTimeCompare(sum[:], s.tokenHash) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentkit", error="invalid_token"`)
		writeError(w, http.StatusUnauthorized, CodeUnauthorized, "the bearer token is wrong; send the server's --auth-token")
		return false
	}
	return true
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if s.isDraining() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// infoResponse is GET /v1/info: the runtime's Info and the version, and
// in serving mode ledger the ledger's settings.
type infoResponse struct {
	agent.Info
	Version string      `json:"version"`
	Ledger  *ledgerInfo `json:"ledger,omitempty"`
}

// ledgerInfo is the "ledger" object of GET /v1/info: the lease and inbox
// settings in force (agent.LedgerSettings), durations in milliseconds.
type ledgerInfo struct {
	LeaseMs           int64   `json:"leaseMs"`
	MarginMs          int64   `json:"marginMs"`
	DriftAllowance    float64 `json:"driftAllowance"`
	JanitorIntervalMs int64   `json:"janitorIntervalMs"`
	MaxAttempts       int     `json:"maxAttempts"`
	MaxPending        int     `json:"maxPending"`
	MaxPendingBytes   int64   `json:"maxPendingBytes"`
	MaxEventBytes     int     `json:"maxEventBytes"`
	DedupWindow       int     `json:"dedupWindow"`
	RetryAfterMs      int64   `json:"retryAfterMs"`
	// The keys of keyed messages past the window: how long they are kept,
	// the clock skew allowed for, and the most a session keeps.
	IdempotencyWindowMs int64 `json:"idempotencyWindowMs"`
	ClockSkewMs         int64 `json:"clockSkewMs"`
	MaxKeys             int   `json:"maxKeys"`
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	resp := infoResponse{Info: s.rt.Info(), Version: s.opts.Version}
	if st, ok := s.rt.LedgerSettings(); ok {
		resp.Ledger = &ledgerInfo{
			LeaseMs: st.Lease.Milliseconds(), MarginMs: st.Margin.Milliseconds(), DriftAllowance: st.DriftAllowance,
			JanitorIntervalMs: st.JanitorInterval.Milliseconds(), MaxAttempts: st.MaxAttempts, MaxPending: st.MaxPending,
			MaxPendingBytes: st.MaxPendingBytes, MaxEventBytes: st.MaxEventBytes, DedupWindow: st.DedupWindow,
			RetryAfterMs:        st.RetryAfter.Milliseconds(),
			IdempotencyWindowMs: st.IdempotencyWindow.Milliseconds(), ClockSkewMs: st.ClockSkew.Milliseconds(), MaxKeys: st.MaxKeys,
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

type requestIDKey struct{}

func newRequestID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// responseWriter records the status and size of an answer.
type responseWriter struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
	writeErr    error // the first write that failed
}

func (w *responseWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = http.StatusOK, true
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	if err != nil && w.writeErr == nil {
		w.writeErr = err
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection (Flush, write
// deadlines).
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// flush sends what the answer left buffered and reports whether the
// client's connection took it (nil), or the error of the write that
// failed: an earlier one, or the flush's.
func (w *responseWriter) flush() error {
	if w.writeErr != nil {
		return w.writeErr
	}
	if !w.wroteHeader {
		return nil
	}
	if err := http.NewResponseController(w.ResponseWriter).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// statusProbe captures the status and headers the mux's fallback handler
// would send, and drops its plain-text body.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header { return p.header }

func (p *statusProbe) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}

func (p *statusProbe) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}
