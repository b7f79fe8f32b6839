// Package hostedkv is the kv driver for agentkit's hosted storage service
// (`agentkit storaged`, package hosted): the whole kv contract, the CAS
// group included, over HTTP, inside the namespace a deployment token owns.
// Engines that use it hold a token, never a database URL.
//
// It registers the "agentkit+http" and "agentkit+https" URL schemes:
//
//	agentkit+https://TOKEN@storage.internal:8443/acme-prod
//	agentkit+http://127.0.0.1:8470/acme-prod?token_file=/run/secrets/storage-token
//
// The path is the namespace. The token comes from the URL's user name (or
// password), else from token_file=PATH, else from the AGENTKIT_STORAGE_TOKEN
// environment variable. Other query parameters: ca_file=PATH (a PEM bundle
// to trust for https, beside the system's), retry_for=DURATION (how long a
// request is retried, default 30s), page=N (listing page size, default 500).
//
// # Retries and outcomes
//
// Every request is retried on a transport error, a 429 and a 502, 503 or
// 504, with backoff, for up to retry_for or until ctx ends. Every write
// carries a request id (the Idempotency-Key header) that stays the same
// across its retries, and the service applies a request id at most once:
// a retried write whose first answer was lost gets the first outcome, so a
// conditional write never reports a conflict for its own success. When the
// retries run out and a copy of the write may have reached the service,
// the error matches ErrOutcomeUnknown: the write may or may not have
// happened (never kv.ErrConflict); re-read the key to learn which.
//
// # Native tables and memory
//
// A *Store also speaks to the service's native eval-run and A/B tables and
// its memory journal, in the protocol's terms (PutEvalRun, PutABSample,
// AppendMemory, …). Package hosted/client binds them to the runtime:
// client.Tables for storage.Config's Evals and ABs, client.NewMemory for a
// memory backend that keeps the journal in the service, so it survives a
// redeploy. The driver imports nothing of agentkit but kv and the
// protocol's leaf package, kv/hostedkv/wire.
package hostedkv

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"agentkit/kv"
	"agentkit/kv/hostedkv/wire"
)

// Defaults of Options.
const (
	// DefaultRetryFor is how long a request is retried.
	DefaultRetryFor = 30 * time.Second
	// DefaultPageSize is how many entries one listing request asks for.
	DefaultPageSize = 500
	// TokenEnv is the environment variable the URL opener reads the token
	// from when the URL has none.
	TokenEnv = "AGENTKIT_STORAGE_TOKEN"
)

// Errors of the driver, beside the kv sentinels.
var (
	// ErrOutcomeUnknown means a write may or may not have been applied:
	// a copy of it may have reached the service, and no answer came back
	// before the retries ran out or ctx ended. It never accompanies
	// kv.ErrConflict.
	ErrOutcomeUnknown = errors.New("hostedkv: the outcome of the write is unknown")
	// ErrUnauthorized means the service did not accept the token (401).
	ErrUnauthorized = errors.New("hostedkv: the storage service refused the token")
	// ErrForbidden means the token belongs to another namespace (403).
	ErrForbidden = errors.New("hostedkv: the token does not own this namespace")
)

func init() {
	kv.Register("agentkit+http", openURL)
	kv.Register("agentkit+https", openURL)
}

// Options configure Open. A nil *Options means the defaults.
type Options struct {
	// Token is the deployment token. Required.
	Token string
	// HTTPClient sends the requests; nil means a client of the driver's
	// own with keep-alive connections (and RootCAs for https).
	HTTPClient *http.Client
	// RootCAs are the certificates to trust for https when HTTPClient is
	// nil; nil means the system's.
	RootCAs *x509.CertPool
	// RetryFor is how long a request is retried; zero means
	// DefaultRetryFor. It is capped at a fifth of the service's
	// de-duplication window, so every copy of a write reaches the service
	// while the first copy's record is kept.
	RetryFor time.Duration
	// PageSize is how many entries one listing request asks for; zero
	// means DefaultPageSize, capped at the service's page limit.
	PageSize int
}

// Store is the driver's backend for one namespace: the kv core and CAS
// group, the native eval-run and A/B tables and the memory journal (see
// package hosted/client for them as the runtime's tables and memory
// backend). (*kv.DB).Backend returns it. It is safe for concurrent use.
type Store struct {
	base     string // scheme://host[:port]
	ns       string
	nsPath   string // /v1/ns/{ns}/
	auth     string
	hc       *http.Client
	ownHC    bool
	retryFor time.Duration
	page     int
	info     wire.Info
}

var (
	_ kv.Store       = (*Store)(nil)
	_ kv.CAS         = (*Store)(nil)
	_ kv.AfterLister = (*Store)(nil)
)

// Open connects to the service at serverURL (http://HOST:PORT or
// https://HOST:PORT) for namespace and returns the store. It asks the
// service who the token is, so a wrong token (ErrUnauthorized), a token of
// another namespace (ErrForbidden) or an unreachable service fails here,
// not at the first write.
func Open(ctx context.Context, serverURL, namespace string, opts *Options) (*kv.DB, error) {
	s, err := open(ctx, serverURL, namespace, opts)
	if err != nil {
		return nil, err
	}
	return kv.New("hosted", s)
}

func open(ctx context.Context, serverURL, namespace string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("hostedkv: the service address must be http://HOST:PORT or https://HOST:PORT")
	}
	if !wire.ValidNamespace(namespace) {
		return nil, fmt.Errorf("hostedkv: the namespace %q is not usable: use %s", namespace, wire.NamespaceRule)
	}
	if o.Token == "" {
		return nil, fmt.Errorf("hostedkv: no token; put it in the URL (agentkit+https://TOKEN@host/%s), in token_file=PATH, or in %s", namespace, TokenEnv)
	}
	if strings.ContainsAny(o.Token, " \t\r\n") {
		return nil, errors.New("hostedkv: the token contains white space; check how it was copied")
	}
	if o.RetryFor <= 0 {
		o.RetryFor = DefaultRetryFor
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	s := &Store{
		base: u.Scheme + "://" + u.Host, ns: namespace, nsPath: "/v1/ns/" + namespace + "/",
		auth: "Bearer " + o.Token, hc: o.HTTPClient, retryFor: o.RetryFor, page: o.PageSize,
	}
	if s.hc == nil {
		s.hc, s.ownHC = newHTTPClient(o.RootCAs), true
	}
	// Opening waits less than an operation: a wrong address should fail
	// a command quickly.
	openCtx, cancel := context.WithTimeout(ctx, min(o.RetryFor, 10*time.Second))
	defer cancel()
	resp, err := s.do(openCtx, call{method: http.MethodGet, resource: "info"})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("hostedkv: reach the storage service at %s: %w", s.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.Close()
		return nil, fmt.Errorf("hostedkv: %s, namespace %s: %w", s.base, namespace, s.errorFrom(resp))
	}
	if err := decodeJSON(resp.Body, &s.info); err != nil {
		s.Close()
		return nil, fmt.Errorf("hostedkv: %s answered info with something else than the protocol's JSON: %w", s.base, err)
	}
	if s.info.Protocol != wire.Protocol {
		s.Close()
		return nil, fmt.Errorf("hostedkv: %s speaks protocol %d; this build speaks %d", s.base, s.info.Protocol, wire.Protocol)
	}
	if w := time.Duration(s.info.Limits.DedupWindowSeconds) * time.Second; w > 0 && s.retryFor > w/5 {
		s.retryFor = w / 5
	}
	if m := s.info.Limits.MaxPage; m > 0 && s.page > m {
		s.page = m
	}
	return s, nil
}

// newHTTPClient returns a client with enough idle connections for many
// concurrent callers.
func newHTTPClient(roots *x509.CertPool) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	t.ResponseHeaderTimeout = 30 * time.Second
	t.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if roots != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: t}
}

// openURL opens agentkit+http(s)://[TOKEN@]HOST[:PORT]/NAMESPACE[?…].
func openURL(ctx context.Context, u *url.URL) (*kv.DB, error) {
	scheme := strings.TrimPrefix(strings.ToLower(u.Scheme), "agentkit+")
	ns := strings.Trim(u.Path, "/")
	if ns == "" || strings.Contains(ns, "/") {
		return nil, fmt.Errorf("hostedkv: the URL's path must be the namespace alone, as in %s://TOKEN@HOST:PORT/my-deployment", u.Scheme)
	}
	var o Options
	if u.User != nil {
		o.Token = u.User.Username()
		if p, ok := u.User.Password(); ok && p != "" {
			o.Token = p
		}
	}
	q := u.Query()
	for name := range q {
		switch name {
		case "token_file", "ca_file", "retry_for", "page":
		default:
			return nil, fmt.Errorf("hostedkv: unknown URL parameter %q; the parameters are token_file, ca_file, retry_for and page", name)
		}
	}
	if f := q.Get("token_file"); f != "" && o.Token == "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("hostedkv: read the token file: %w", err)
		}
		o.Token = strings.TrimSpace(string(b))
	}
	if o.Token == "" {
		o.Token = os.Getenv(TokenEnv)
	}
	if f := q.Get("ca_file"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("hostedkv: read the CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("hostedkv: the CA file %s holds no PEM certificate", f)
		}
		o.RootCAs = pool
	}
	if v := q.Get("retry_for"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("hostedkv: retry_for=%q is not a positive duration such as 30s", v)
		}
		o.RetryFor = d
	}
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("hostedkv: page=%q is not a positive number", v)
		}
		o.PageSize = n
	}
	return Open(ctx, scheme+"://"+u.Host, ns, &o)
}

// Namespace returns the namespace the store serves.
func (s *Store) Namespace() string { return s.ns }

// Info returns what the service said about itself when the store opened.
func (s *Store) Info() wire.Info { return s.info }

// MaxValueSize is the largest value the service takes (its info's
// limit); a larger one fails with kv.ErrTooLarge before it is sent.
func (s *Store) MaxValueSize() int { return int(s.info.Limits.MaxValueBytes) }

// Close releases the store's idle connections.
func (s *Store) Close() error {
	if s.ownHC {
		s.hc.CloseIdleConnections()
	}
	return nil
}

// newRequestID returns a fresh request id: 16 random bytes, base64url.
func newRequestID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *Store) checkSize(value []byte) error {
	if max := s.info.Limits.MaxValueBytes; max > 0 && int64(len(value)) > max {
		return fmt.Errorf("%w: %d bytes is over the storage service's limit of %d bytes", kv.ErrTooLarge, len(value), max)
	}
	return nil
}

// Put creates or overwrites key with a new version.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	_, err := s.put(ctx, key, value, nil)
	return err
}

// put sends one PUT with the extra headers and returns the new version.
func (s *Store) put(ctx context.Context, key string, value []byte, hdr map[string]string) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	resp, err := s.do(ctx, call{method: http.MethodPut, resource: "kv", query: url.Values{"key": {key}}, headers: hdr, body: value, write: true})
	if err != nil {
		return "", err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return "", s.errorFrom(resp)
	}
	ver := resp.Header.Get(wire.HeaderVersion)
	if ver == "" {
		return "", fmt.Errorf("hostedkv: the service answered a write without a version (status %d)", resp.StatusCode)
	}
	return kv.Version(ver), nil
}

// Get returns the value of key, or an error matching kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := s.GetWithVersion(ctx, key)
	return v, err
}

// GetWithVersion returns the value of key and its version, or an error
// matching kv.ErrNotFound.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	resp, err := s.do(ctx, call{method: http.MethodGet, resource: "kv", query: url.Values{"key": {key}}})
	if err != nil {
		return nil, "", err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return nil, "", s.errorFrom(resp)
	}
	ver := resp.Header.Get(wire.HeaderVersion)
	if ver == "" {
		return nil, "", errors.New("hostedkv: the service answered a read without a version")
	}
	v, _ := readBody(resp) // buffered by do
	return v, kv.Version(ver), nil
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	resp, err := s.do(ctx, call{method: http.MethodDelete, resource: "kv", query: url.Values{"key": {key}}, write: true})
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return s.errorFrom(resp)
	}
	return nil
}

// PutIfAbsent writes key only if it does not exist; otherwise the error
// matches kv.ErrConflict and kv.ErrExists.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	return s.put(ctx, key, value, map[string]string{wire.HeaderIfAbsent: "1"})
}

// PutIfVersion writes key only if it exists with version expected;
// otherwise the error matches kv.ErrConflict. A token the service cannot
// have issued is a conflict without a request.
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if _, _, ok := wire.ParseVersion(string(expected)); !ok {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		return "", fmt.Errorf("%w: the version is not one the storage service issued", kv.ErrConflict)
	}
	return s.put(ctx, key, value, map[string]string{wire.HeaderIfVersion: string(expected)})
}

// readBody reads a whole answer body, sized by Content-Length when given.
func readBody(resp *http.Response) ([]byte, error) {
	if n := resp.ContentLength; n >= 0 && n < 1<<31 {
		b := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(resp.Body)
}
