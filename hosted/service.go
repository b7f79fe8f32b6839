// Package hosted is agentkit's hosted storage service, the program behind
// `agentkit storaged`: an HTTP service in front of one SQL database that
// serves the whole kv contract, compare-and-set included, to many
// deployments, each in a namespace of its own. Engines reach it with the
// agentkit+http(s):// driver (package kv/hostedkv) and a deployment token,
// so they never hold a database URL.
//
// The protocol is docs/hosted-protocol.md; package kv/hostedkv/wire spells
// its names. In short:
//
//   - Every request names a namespace in its path (/v1/ns/{ns}/…) and
//     carries a bearer token. A missing or unknown token is 401; a token
//     used on a namespace it does not own is 403. Tokens are stored as
//     HMAC-SHA256 under a server key (credentials.go says why) and compared
//     in constant time. The credentials file is reloaded when it changes
//     and on Reload (SIGHUP in the command), without a restart.
//   - Keys travel in a query parameter, never in the path, and are checked
//     with the kv contract's rules; every row is stored under its
//     namespace's column, so no key, prefix or path can reach another
//     namespace.
//   - Versions are "epoch.number": the number comes from one counter of the
//     database (a sequence in PostgreSQL, a counter row in SQLite; the
//     key's own counter on the generic backend), so it changes on every
//     write and never repeats for a key, after a delete included;
//     the epoch is a random name made with the tables, so a token from
//     another database or an earlier set of tables never matches.
//   - Every write carries a request id (the Idempotency-Key header). The
//     service records the id and the write's outcome in the same
//     transaction as the write, and answers a repeated id with the recorded
//     outcome instead of applying the write again. A client whose answer
//     was lost therefore resends the write and learns what happened, and
//     never sees a conflict for its own success. Records are kept for the
//     de-duplication window (DefaultDedupWindow) and then removed.
//   - Besides the kv keys, the service keeps native tables for eval runs,
//     A/B samples and snapshots, and the memory journal.
//
// The backends are PostgreSQL (postgres://…, for production: several
// services may share one database), SQLite (sqlite:PATH, one host), and
// any other kv store with the CAS group (redis://…, nats://…, file:PATH,
// s3://…), through the generic backend of kvstore.go: there a key's
// stored value is an envelope holding its version counter and the request
// ids of its recent writes, so a write and its request id go in one
// compare-and-set, and a delete leaves a tombstone keeping the counter.
package hosted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"agentkit/kv"
	"agentkit/kv/hostedkv/wire"
)

// Defaults of Options.
const (
	// DefaultMaxValueBytes bounds a value and any request body: 16 MiB.
	DefaultMaxValueBytes = 16 << 20
	// DefaultMaxPage is the most entries one listing page may ask for.
	DefaultMaxPage = 1000
	// DefaultDedupWindow is how long a write's request id is remembered.
	DefaultDedupWindow = 10 * time.Minute
	// DefaultMaxInFlight is how many requests one namespace may have in
	// flight at once; more get 429.
	DefaultMaxInFlight = 256
	// DefaultCredentialPoll is how often the credentials file is checked
	// for changes.
	DefaultCredentialPoll = time.Second
	// MinDedupWindow is the shortest de-duplication window Open accepts.
	MinDedupWindow = 5 * time.Minute
)

// A copy of a write is applied within maxRequestTime + backendTimeout of
// its first byte: the server's read timeout bounds its arrival and
// backendTimeout its transaction. Clients resend for at most a fifth of
// the window, so every copy of a write is applied or refused while the
// first copy's record is still kept (docs/hosted-protocol.md works it out).
const (
	maxRequestTime = 2 * time.Minute
	backendTimeout = time.Minute
)

// maxNameBytes bounds the agent, run, experiment and session names of the
// native tables.
const maxNameBytes = kv.MaxKeyLength

// Options configure a Service. Backend and Credentials are required; zero
// values of the rest mean their defaults.
type Options struct {
	// Backend is the store: postgres://… (production) or sqlite:PATH,
	// where a table=PREFIX query parameter names the tables (default
	// agentkit_hosted: agentkit_hosted_kv, agentkit_hosted_requests, …);
	// or the URL of another kv store with the CAS group, whose driver the
	// program links (the generic backend).
	Backend string
	// Credentials is the credentials file (see AddCredential).
	Credentials string
	// CredentialsKey is the server key file; empty means
	// KeyPath(Credentials).
	CredentialsKey string
	// MaxValueBytes bounds values and request bodies.
	MaxValueBytes int64
	// MaxPage bounds the entries of one listing page.
	MaxPage int
	// DedupWindow is how long request ids are remembered. Clients must
	// not resend a write later than that after first sending it (the Go
	// driver stops well before).
	DedupWindow time.Duration
	// MaxInFlight bounds the requests one namespace has in flight.
	MaxInFlight int
	// CredentialPoll is how often the credentials and key files are
	// checked for changes.
	CredentialPoll time.Duration
	// Logger receives one line per request (debug for successes, info for
	// client errors, error for backend failures) and the service's
	// notices. Lines carry the operation, namespace, status and duration,
	// never a key, a value or a token. Nil means slog.Default().
	Logger *slog.Logger
}

// Service is the hosted storage service: an http.Handler over one backend.
// Run its background work with Run, and Close it when done.
type Service struct {
	st       store
	opts     Options
	log      *slog.Logger
	m        *metrics
	creds    atomic.Pointer[credentialSet]
	credMu   sync.Mutex // serialises reloads
	stamp    string     // credentials and key file stamps at the last load
	inflight sync.Map   // namespace → *atomic.Int64
	closing  atomic.Bool
}

// Open opens the backend (creating its tables when missing) and loads the
// credentials.
func Open(ctx context.Context, opts Options) (*Service, error) {
	if opts.Credentials == "" {
		return nil, errors.New("hosted: no credentials file given; create one with agentkit storaged credentials add NAMESPACE --credentials FILE")
	}
	if opts.CredentialsKey == "" {
		opts.CredentialsKey = KeyPath(opts.Credentials)
	}
	switch {
	case opts.MaxValueBytes == 0:
		opts.MaxValueBytes = DefaultMaxValueBytes
	case opts.MaxValueBytes < 1<<20:
		return nil, fmt.Errorf("hosted: the value limit %d is under 1 MiB, which the kv contract requires every store to take", opts.MaxValueBytes)
	}
	switch {
	case opts.MaxPage == 0:
		opts.MaxPage = DefaultMaxPage
	case opts.MaxPage < 1:
		return nil, fmt.Errorf("hosted: the page limit %d must be positive", opts.MaxPage)
	}
	switch {
	case opts.DedupWindow == 0:
		opts.DedupWindow = DefaultDedupWindow
	case opts.DedupWindow < MinDedupWindow:
		return nil, fmt.Errorf("hosted: the de-duplication window %v is under the minimum of %v (a request may take up to %v to arrive and be applied, and clients resend writes for a fifth of the window)", opts.DedupWindow, MinDedupWindow, maxRequestTime+backendTimeout)
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.CredentialPoll <= 0 {
		opts.CredentialPoll = DefaultCredentialPoll
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Service{opts: opts, log: opts.Logger, m: newMetrics()}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	st, err := openStore(ctx, opts.Backend, opts.DedupWindow)
	if err != nil {
		return nil, err
	}
	s.st = st
	if l, ok := st.(interface{ valueLimit() int64 }); ok && l.valueLimit() > 0 && l.valueLimit() < s.opts.MaxValueBytes {
		// The backend's store takes less than the service would: say so
		// in info, so clients refuse larger values before sending them.
		s.opts.MaxValueBytes = l.valueLimit()
		s.log.Warn("storaged: the backend store limits values; the service's value limit is lowered to it",
			slog.Int64("maxValueBytes", s.opts.MaxValueBytes), slog.String("backend", st.kind()))
	}
	s.m.backendUp.Set(1)
	return s, nil
}

// Reload reads the credentials and key files again. On an error the
// credentials loaded before stay in force.
func (s *Service) Reload() error {
	s.credMu.Lock()
	defer s.credMu.Unlock()
	stamp := fileStamp(s.opts.Credentials) + " " + fileStamp(s.opts.CredentialsKey)
	set, err := loadCredentialSet(s.opts.Credentials, s.opts.CredentialsKey)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		return err
	}
	s.stamp = stamp
	s.creds.Store(set)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.m.creds.Set(float64(len(set.byID)))
	for _, p := range []string{s.opts.Credentials, s.opts.CredentialsKey} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o077 != 0 {
			// Loading made it owner-only where this process owns it.
			s.log.Warn("storaged: a credentials file is readable by other users, and this process (not its owner) cannot change that; chmod 600 it", slog.String("file", p))
		}
	}
	return nil
}

// reloadIfChanged reloads the credentials when either file changed.
func (s *Service) reloadIfChanged() {
	s.credMu.Lock()
	changed := fileStamp(s.opts.Credentials)+" "+fileStamp(s.opts.CredentialsKey) != s.stamp
	s.credMu.Unlock()
	if !changed {
		return
	}
	if err := s.Reload(); err != nil {
		s.log.Error("storaged: the credentials file changed but does not load; the previous credentials stay in force", slog.Any("error", err))
		return
	}
	s.log.Info("storaged: credentials reloaded", slog.Int("credentials", len(s.creds.Load().byID)))
}

// Run does the service's background work until ctx ends: it reloads the
// credentials when their files change and removes request ids older than
// the de-duplication window.
func (s *Service) Run(ctx context.Context) {
	poll := time.NewTicker(s.opts.CredentialPoll)
	defer poll.Stop()
	gcEvery := s.opts.DedupWindow / 10
	gc := time.NewTimer(0)
	defer gc.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			s.reloadIfChanged()
		case <-gc.C:
			s.forget(ctx)
			gc.Reset(gcEvery)
		}
	}
}

func (s *Service) forget(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := s.st.forgetRequests(ctx, time.Now().Add(-s.opts.DedupWindow))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("storaged: removing old request ids failed; will retry", slog.Any("error", err))
		}
		return
	}
	s.m.forgotten.Add(float64(n))
}

// Close closes the backend. Call it after the HTTP server has stopped.
func (s *Service) Close() {
	s.closing.Store(true)
	s.st.close()
}

// Backend returns "postgres", "sqlite", or the kv driver's name on the
// generic backend ("redis", …).
func (s *Service) Backend() string { return s.st.kind() }

// recorder keeps the status and error code of an answer.
type recorder struct {
	http.ResponseWriter
	status int
	code   string
	wrote  bool
}

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// call is one request being served.
type call struct {
	s        *Service
	w        *recorder
	r        *http.Request
	q        url.Values
	op       string
	ns       string // the authenticated namespace
	replayed bool
	backErr  error // a backend failure, for the log
}

// ServeHTTP serves the protocol, /healthz and /metrics.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	c := &call{s: s, w: &recorder{ResponseWriter: w}, r: r, op: "unknown"}
	c.w.Header().Set("Cache-Control", "no-store")
	c.serve()
	d := time.Since(start)
	if c.w.status == 0 {
		c.w.status = http.StatusOK
	}
	if c.op == "metrics" {
		return
	}
	s.m.observe(c.op, c.ns, c.w.status, c.w.code, d)
	if c.replayed {
		s.m.replays.WithLabelValues(c.ns).Inc()
	}
	level := slog.LevelDebug
	switch {
	case c.w.status >= 500:
		level = slog.LevelError
	case c.w.status >= 400:
		level = slog.LevelInfo
	}
	if !s.log.Enabled(r.Context(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("op", c.op), slog.String("namespace", c.ns), slog.Int("status", c.w.status),
		slog.Float64("ms", float64(d.Microseconds())/1000),
	}
	if c.w.code != "" {
		attrs = append(attrs, slog.String("code", c.w.code))
	}
	if c.replayed {
		attrs = append(attrs, slog.Bool("replayed", true))
	}
	if c.backErr != nil {
		attrs = append(attrs, slog.String("error", c.backErr.Error()))
	}
	s.log.LogAttrs(r.Context(), level, "storaged: request", attrs...)
}

func (c *call) serve() {
	path := c.r.URL.Path
	switch path {
	case "/healthz":
		c.op = "healthz"
		c.healthz()
		return
	case "/metrics":
		c.op = "metrics"
		c.s.m.handler().ServeHTTP(c.w, c.r)
		return
	}
	rest, ok := strings.CutPrefix(path, "/v1/ns/")
	if !ok {
		c.fail(http.StatusNotFound, wire.CodeNoRoute, 0, "no such path; the protocol's paths start with /v1/ns/{namespace}/ (docs/hosted-protocol.md)")
		return
	}
	ns, resource, _ := strings.Cut(rest, "/")
	handler := c.route(resource)
	if handler == nil {
		return
	}
	if !c.authenticate(ns) {
		return
	}
	if c.r.URL.RawPath != "" {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the path has percent-escapes; keys and names go in query parameters, never in the path")
		return
	}
	q, err := url.ParseQuery(c.r.URL.RawQuery)
	if err != nil {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the query string does not parse; escape its values (%s)", err)
		return
	}
	for name, vals := range q {
		if len(vals) > 1 {
			c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the parameter %q is given %d times; give it once", trim(name), len(vals))
			return
		}
	}
	c.q = q
	ctx, cancel := context.WithTimeout(c.r.Context(), backendTimeout)
	defer cancel()
	c.r = c.r.WithContext(ctx)
	counter, _ := c.s.inflight.LoadOrStore(c.ns, new(atomic.Int64))
	n := counter.(*atomic.Int64)
	defer n.Add(-1)
	if n.Add(1) > int64(c.s.opts.MaxInFlight) {
		c.w.Header().Set("Retry-After", "1")
		c.fail(http.StatusTooManyRequests, wire.CodeRateLimited, int64(c.s.opts.MaxInFlight),
			"the namespace has more than %d requests in flight; retry after a pause", c.s.opts.MaxInFlight)
		return
	}
	handler()
}

// route is one route of the protocol: a resource (the path segment after
// /v1/ns/{ns}/), a method, the operation's name in logs and metrics, and
// its handler.
type route struct {
	resource, method, op string
	serve                func(*call)
}

// routes is the protocol's route table, every route the service serves
// under /v1/ns/{ns}/ (docs/hosted-protocol.md). A resource's methods are
// listed together, in the order its Allow header names them. The
// isolation test builds a case for each entry, so a route added here
// without one fails it.
var routes = []route{
	{"info", "GET", "info", (*call).info},
	{"kv", "GET", "get", (*call).get},
	{"kv", "PUT", "put", (*call).put},
	{"kv", "DELETE", "delete", (*call).delete},
	{"list", "GET", "list", (*call).list},
	{"evals", "GET", "evals_list", (*call).listEvals},
	{"evals", "PUT", "evals_put", (*call).putEval},
	{"evals", "DELETE", "evals_delete", (*call).deleteEval},
	{"ab-samples", "POST", "ab_sample", (*call).putSample},
	{"ab-snapshot", "GET", "ab_snapshot_get", (*call).getSnapshot},
	{"ab-snapshot", "PUT", "ab_snapshot_put", (*call).putSnapshot},
	{"memory", "GET", "memory_list", (*call).listMemory},
	{"memory", "POST", "memory_append", (*call).appendMemory},
}

// route returns the handler of a resource and method and names the
// operation, or answers 404 or 405 and returns nil.
func (c *call) route(resource string) func() {
	m := c.r.Method
	var allowed string
	for i := range routes {
		rt := &routes[i]
		if rt.resource != resource {
			continue
		}
		if rt.method != m {
			if allowed != "" {
				allowed += ", "
			}
			allowed += rt.method
			continue
		}
		c.op = rt.op
		if rt.op == "put" {
			if c.r.Header.Get(wire.HeaderIfAbsent) != "" {
				c.op = "put_if_absent"
			} else if c.r.Header.Get(wire.HeaderIfVersion) != "" {
				c.op = "put_if_version"
			}
		}
		return func() { rt.serve(c) }
	}
	if allowed == "" {
		c.fail(http.StatusNotFound, wire.CodeNoRoute, 0, "no such path; the resources are info, kv, list, evals, ab-samples, ab-snapshot and memory")
		return nil
	}
	c.w.Header().Set("Allow", allowed)
	c.fail(http.StatusMethodNotAllowed, wire.CodeMethod, 0, "%s is not allowed on %s", trim(m), resource)
	return nil
}

// authenticate checks the bearer token and that it owns ns.
func (c *call) authenticate(ns string) bool {
	c.w.Header().Set("WWW-Authenticate", `Bearer realm="agentkit-storaged"`)
	h := c.r.Header.Get("Authorization")
	scheme, token, _ := strings.Cut(h, " ")
	if h == "" || !strings.EqualFold(scheme, "Bearer") || token == "" {
		c.fail(http.StatusUnauthorized, wire.CodeUnauthorized, 0, "the request has no bearer token; send Authorization: Bearer <deployment token>")
		return false
	}
	owner, ok := c.s.creds.Load().authenticate(strings.TrimSpace(token))
	if !ok {
		c.fail(http.StatusUnauthorized, wire.CodeUnauthorized, 0, "the token is not valid: it was never issued, or it was removed; check the deployment's token")
		return false
	}
	c.w.Header().Del("WWW-Authenticate")
	c.ns = owner
	if owner != ns {
		c.fail(http.StatusForbidden, wire.CodeForbidden, 0, "the token belongs to namespace %q and cannot be used on another one", owner)
		return false
	}
	return true
}

// fail answers with an error body.
func (c *call) fail(status int, code string, limit int64, format string, args ...any) {
	c.w.code = code
	body := wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: fmt.Sprintf(format, args...), Limit: limit}}
	data, _ := json.Marshal(body)
	h := c.w.Header()
	h.Set("Content-Type", wire.ContentJSON)
	h.Del(wire.HeaderVersion)
	c.w.WriteHeader(status)
	c.w.Write(append(data, '\n'))
}

// backendFailed answers a backend error: 503 (the client may retry) unless
// the client went away or the backend's store refused a value as too
// large (413).
func (c *call) backendFailed(err error) {
	c.backErr = err
	if c.r.Context().Err() != nil {
		c.fail(499, wire.CodeBadRequest, 0, "the client went away")
		return
	}
	if errors.Is(err, kv.ErrTooLarge) {
		// The generic backend's store has a smaller value limit than the
		// service's (its envelope adds a few bytes to the value).
		c.fail(http.StatusRequestEntityTooLarge, wire.CodeTooLarge, 0, "the backend store refused the value as too large; nothing was written")
		return
	}
	c.fail(http.StatusServiceUnavailable, wire.CodeUnavailable, 0, "the backend did not answer; retry (a write with the same Idempotency-Key is applied at most once)")
}

// trim shortens attacker-chosen text for error messages.
func trim(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// params answers 400 and returns false when the query has a parameter
// that is not allowed.
func (c *call) params(allowed ...string) bool {
	for name := range c.q {
		ok := false
		for _, a := range allowed {
			if name == a {
				ok = true
			}
		}
		if !ok {
			c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "unknown parameter %q; %s takes %s", trim(name), c.op, orNone(allowed))
			return false
		}
	}
	return true
}

// key returns the key parameter, checked with the kv contract's rules.
func (c *call) key() (string, bool) {
	if !c.q.Has("key") {
		c.fail(http.StatusBadRequest, wire.CodeInvalidKey, 0, "the key parameter is missing; send ?key=<the key, percent-encoded>")
		return "", false
	}
	k := c.q.Get("key")
	return k, c.checkKey(k, "key", false)
}

// checkKey applies kv.ValidateKey's rules to a key or (prefix true, empty
// allowed) a prefix.
func (c *call) checkKey(k, what string, prefix bool) bool {
	switch {
	case k == "" && !prefix:
		c.fail(http.StatusBadRequest, wire.CodeInvalidKey, 0, "the %s is empty", what)
	case len(k) > kv.MaxKeyLength:
		c.fail(http.StatusBadRequest, wire.CodeKeyTooLong, kv.MaxKeyLength, "the %s is %d bytes, over the limit of %d bytes", what, len(k), kv.MaxKeyLength)
	case !utf8.ValidString(k):
		c.fail(http.StatusBadRequest, wire.CodeInvalidKey, 0, "the %s is not valid UTF-8", what)
	case strings.IndexByte(k, 0) >= 0:
		c.fail(http.StatusBadRequest, wire.CodeInvalidKey, 0, "the %s contains a NUL byte", what)
	default:
		return true
	}
	return false
}

// name returns a required name parameter of the native tables.
func (c *call) name(param string) (string, bool) {
	v := c.q.Get(param)
	switch {
	case v == "":
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the %s parameter is missing or empty", param)
	case len(v) > maxNameBytes:
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, maxNameBytes, "the %s is %d bytes, over the limit of %d bytes", param, len(v), maxNameBytes)
	case !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0:
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the %s is not valid UTF-8 or contains a NUL byte", param)
	default:
		return v, true
	}
	return "", false
}

// body reads the request body, up to the value limit.
func (c *call) body() ([]byte, bool) {
	limit := c.s.opts.MaxValueBytes
	if c.r.ContentLength > limit {
		c.fail(http.StatusRequestEntityTooLarge, wire.CodeTooLarge, limit, "the body is %d bytes, over the limit of %d bytes (storaged --max-value-bytes)", c.r.ContentLength, limit)
		return nil, false
	}
	size := 512
	if c.r.ContentLength > 0 {
		size = int(c.r.ContentLength)
	}
	buf := make([]byte, 0, size)
	rd := http.MaxBytesReader(c.w, c.r.Body, limit)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, true
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				c.fail(http.StatusRequestEntityTooLarge, wire.CodeTooLarge, limit, "the body is over the limit of %d bytes (storaged --max-value-bytes)", limit)
			} else {
				c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "reading the body: %v", err)
			}
			return nil, false
		}
	}
}

// jsonBody reads a body that must be one JSON document.
func (c *call) jsonBody() ([]byte, bool) {
	b, ok := c.body()
	if !ok {
		return nil, false
	}
	if !json.Valid(b) {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the body is not a JSON document")
		return nil, false
	}
	return b, true
}

// limit returns the page size a listing asks for.
func (c *call) limit() (int, bool) {
	max := c.s.opts.MaxPage
	v := c.q.Get("limit")
	if v == "" {
		return max, true
	}
	n := 0
	for _, d := range v {
		if d < '0' || d > '9' || n > 1e9 {
			c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "limit=%q is not a positive whole number", trim(v))
			return 0, false
		}
		n = n*10 + int(d-'0')
	}
	switch {
	case n < 1:
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "limit must be at least 1")
	case n > max:
		c.fail(http.StatusBadRequest, wire.CodePageTooLarge, int64(max), "limit=%d is over the page limit of %d entries", n, max)
	default:
		return n, true
	}
	return 0, false
}

func (c *call) requestID() (string, bool) {
	id := c.r.Header.Get(wire.HeaderRequestID)
	if !wire.ValidRequestID(id) {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "writes need an %s header of 8 to 64 characters of A-Z, a-z, 0-9, '_' and '-', new for each write and the same when the write is resent", wire.HeaderRequestID)
		return "", false
	}
	return id, true
}

func (c *call) writeJSON(status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		c.fail(http.StatusInternalServerError, wire.CodeInternal, 0, "encoding the answer failed")
		return
	}
	c.w.Header().Set("Content-Type", wire.ContentJSON)
	c.w.WriteHeader(status)
	c.w.Write(append(data, '\n'))
}

func (c *call) healthz() {
	if c.r.Method != http.MethodGet && c.r.Method != http.MethodHead {
		c.fail(http.StatusMethodNotAllowed, wire.CodeMethod, 0, "use GET")
		return
	}
	if c.s.closing.Load() {
		c.fail(http.StatusServiceUnavailable, wire.CodeShuttingDown, 0, "the service is shutting down")
		return
	}
	ctx, cancel := context.WithTimeout(c.r.Context(), 2*time.Second)
	defer cancel()
	if err := c.s.st.ping(ctx); err != nil {
		c.s.m.backendUp.Set(0)
		c.backErr = err
		c.fail(http.StatusServiceUnavailable, wire.CodeUnavailable, 0, "the backend (%s) does not answer", c.s.st.kind())
		return
	}
	c.s.m.backendUp.Set(1)
	c.writeJSON(http.StatusOK, map[string]string{"status": "ok", "backend": c.s.st.kind()})
}

func (c *call) info() {
	if !c.params() {
		return
	}
	c.writeJSON(http.StatusOK, wire.Info{
		Protocol:  wire.Protocol,
		Namespace: c.ns,
		Backend:   c.s.st.kind(),
		Limits: wire.Limits{
			MaxKeyBytes:        kv.MaxKeyLength,
			MaxValueBytes:      c.s.opts.MaxValueBytes,
			MaxPage:            c.s.opts.MaxPage,
			DedupWindowSeconds: int64(c.s.opts.DedupWindow / time.Second),
		},
	})
}
