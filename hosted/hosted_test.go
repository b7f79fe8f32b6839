package hosted

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/internal/testenv"
	"agentkit/internal/testenv/redistest"
	"agentkit/kv/hostedkv/wire"
	_ "agentkit/kv/memkv" // mem:// for the generic backend
)

// testService is a Service on a fresh SQLite file (or PostgreSQL tables)
// behind a real HTTP server, with one token per namespace it was made
// with.
type testService struct {
	svc    *Service
	srv    *httptest.Server
	creds  string
	tokens map[string]string
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newTestService starts a service with a credential for each namespace.
// opts.Backend empty means a fresh SQLite file.
func newTestService(t testing.TB, opts Options, namespaces ...string) *testService {
	t.Helper()
	dir := t.TempDir()
	ts := &testService{creds: filepath.Join(dir, "creds.json"), tokens: map[string]string{}, logs: &syncBuffer{}}
	for _, ns := range namespaces {
		tok, _, err := AddCredential(ts.creds, KeyPath(ts.creds), ns, false)
		if err != nil {
			t.Fatal(err)
		}
		ts.tokens[ns] = tok
	}
	if opts.Backend == "" {
		opts.Backend = "sqlite:" + filepath.Join(dir, "hosted.db") + "?synchronous=normal"
	}
	opts.Credentials = ts.creds
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewJSONHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	svc, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ts.svc = svc
	ts.srv = httptest.NewServer(svc)
	t.Cleanup(func() {
		ts.srv.Close()
		svc.Close()
	})
	return ts
}

// answer is a decoded answer.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    wire.ErrorDetail
}

// do sends a request with token (none when empty) and reads the answer.
func (ts *testService) do(t testing.TB, method, path, token string, hdr map[string]string, body []byte) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := ts.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, header: resp.Header}
	a.body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		var eb wire.ErrorBody
		if err := json.Unmarshal(a.body, &eb); err != nil {
			t.Fatalf("%s %s: status %d with a body that is not the protocol's error: %q", method, path, resp.StatusCode, a.body)
		}
		a.err = eb.Error
	}
	return a
}

func kvPath(ns, key string) string { return "/v1/ns/" + ns + "/kv?key=" + url.QueryEscape(key) }

func reqID() map[string]string { return map[string]string{wire.HeaderRequestID: newID()} }

func newID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (ts *testService) put(t testing.TB, ns, key, value string) string {
	t.Helper()
	a := ts.do(t, "PUT", kvPath(ns, key), ts.tokens[ns], reqID(), []byte(value))
	if a.status != http.StatusNoContent {
		t.Fatalf("PUT %s in %s: %d %+v", key, ns, a.status, a.err)
	}
	return a.header.Get(wire.HeaderVersion)
}

func TestAuthentication(t *testing.T) {
	ts := newTestService(t, Options{}, "alpha", "beta")
	path := "/v1/ns/alpha/info"
	alpha := ts.tokens["alpha"]
	for _, c := range []struct {
		name   string
		header string
		status int
		code   string
	}{
		{"no header", "", 401, wire.CodeUnauthorized},
		{"basic scheme", "Basic " + alpha, 401, wire.CodeUnauthorized},
		{"empty bearer", "Bearer ", 401, wire.CodeUnauthorized},
		{"garbage", "Bearer nonsense", 401, wire.CodeUnauthorized},
		{"right id, wrong secret", "Bearer " + alpha[:len(alpha)-4] + "aaaa", 401, wire.CodeUnauthorized},
		{"unknown id", "Bearer akst_aaaaaaaa_" + alpha[14:], 401, wire.CodeUnauthorized},
		{"other namespace's token", "Bearer " + ts.tokens["beta"], 403, wire.CodeForbidden},
		{"lower-case scheme", "bearer " + alpha, 200, ""},
		{"the token", "Bearer " + alpha, 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.header != "" {
				hdr["Authorization"] = c.header
			}
			a := ts.do(t, "GET", path, "", hdr, nil)
			if a.status != c.status || a.err.Code != c.code {
				t.Fatalf("status %d code %q, want %d %q (%s)", a.status, a.err.Code, c.status, c.code, a.err.Message)
			}
			if c.status == 401 && !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("a 401 without WWW-Authenticate: Bearer")
			}
			if strings.Contains(string(a.body), alpha) || strings.Contains(string(a.body), ts.tokens["beta"]) {
				t.Errorf("the answer repeats a token: %s", a.body)
			}
		})
	}
	// A 403 is decided before the request is looked at: beta's token on
	// alpha's key never reaches the backend, whatever the key.
	ts.put(t, "alpha", "k", "v")
	if a := ts.do(t, "GET", kvPath("alpha", "k"), ts.tokens["beta"], nil, nil); a.status != 403 {
		t.Fatalf("beta reading alpha's key: %d, want 403", a.status)
	}
	if a := ts.do(t, "GET", kvPath("alpha", ""), ts.tokens["beta"], nil, nil); a.status != 403 {
		t.Fatalf("beta with an invalid key on alpha: %d, want 403 before 400", a.status)
	}
}

func TestCredentialsChangeWithoutRestart(t *testing.T) {
	ts := newTestService(t, Options{CredentialPoll: 10 * time.Millisecond}, "alpha")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ts.svc.Run(ctx)

	waitStatus := func(path, token string, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			a := ts.do(t, "GET", path, token, nil, nil)
			if a.status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s answered %d for 10s, want %d", path, a.status, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// add: picked up by the poll, no Reload call.
	tok, cred, err := AddCredential(ts.creds, KeyPath(ts.creds), "gamma", false)
	if err != nil {
		t.Fatal(err)
	}
	waitStatus("/v1/ns/gamma/info", tok, 200)

	// rotate: a second token works beside the first; removing the first
	// leaves only the second.
	if _, _, err := AddCredential(ts.creds, KeyPath(ts.creds), "gamma", false); !errors.Is(err, ErrNamespaceHasCredential) {
		t.Fatalf("a second credential without rotate: %v, want ErrNamespaceHasCredential", err)
	}
	tok2, _, err := AddCredential(ts.creds, KeyPath(ts.creds), "gamma", true)
	if err != nil {
		t.Fatal(err)
	}
	waitStatus("/v1/ns/gamma/info", tok2, 200)
	waitStatus("/v1/ns/gamma/info", tok, 200)
	if _, err := RemoveCredential(ts.creds, cred.ID); err != nil {
		t.Fatal(err)
	}
	waitStatus("/v1/ns/gamma/info", tok, 401)
	waitStatus("/v1/ns/gamma/info", tok2, 200)

	// A broken file keeps the credentials in force, and Reload says why.
	if err := os.WriteFile(ts.creds, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.svc.Reload(); err == nil || !strings.Contains(err.Error(), "not valid") {
		t.Fatalf("Reload of a broken file: %v, want an error saying it is not valid", err)
	}
	waitStatus("/v1/ns/alpha/info", ts.tokens["alpha"], 200)
	waitStatus("/v1/ns/gamma/info", tok2, 200)
}

func TestCredentialsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "creds.json")
	tok, c, err := AddCredential(path, KeyPath(path), "acme-prod", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, KeyPath(path)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), strings.TrimPrefix(tok, tokenPrefix+c.ID+"_")) {
		t.Fatal("the credentials file holds the token's secret")
	}
	set, err := loadCredentialSet(path, KeyPath(path))
	if err != nil {
		t.Fatal(err)
	}
	if ns, ok := set.authenticate(tok); !ok || ns != "acme-prod" {
		t.Fatalf("the issued token authenticates as %q, %v", ns, ok)
	}
	// The hash is keyed: the same file with another key accepts nothing.
	other := filepath.Join(dir, "other.key")
	if err := os.WriteFile(other, []byte(strings.Repeat("cd", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	set2, err := loadCredentialSet(path, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := set2.authenticate(tok); ok {
		t.Fatal("the token authenticates under another server key")
	}
	if _, _, err := AddCredential(path, KeyPath(path), "Bad_Name", false); err == nil {
		t.Fatal("AddCredential took an invalid namespace")
	}
	if _, err := RemoveCredential(path, "zzzzzzzz"); err == nil || !strings.Contains(err.Error(), c.ID) {
		t.Fatalf("removing an unknown id: %v, want an error listing %s", err, c.ID)
	}
	list, err := ListCredentials(path)
	if err != nil || len(list) != 1 || list[0].Namespace != "acme-prod" {
		t.Fatalf("ListCredentials = %+v, %v", list, err)
	}
	// Concurrent adds do not lose entries.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := AddCredential(path, KeyPath(path), "ns-"+string(rune('a'+i)), false); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if list, _ := ListCredentials(path); len(list) != 9 {
		t.Fatalf("after 8 concurrent adds the file has %d credentials, want 9", len(list))
	}
}

func TestLimits(t *testing.T) {
	ts := newTestService(t, Options{MaxValueBytes: 1 << 20, MaxPage: 50}, "alpha")
	tok := ts.tokens["alpha"]
	// A value over the limit: 413 naming it, by Content-Length and by a
	// chunked body alike.
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	a := ts.do(t, "PUT", kvPath("alpha", "big"), tok, reqID(), big)
	if a.status != 413 || a.err.Code != wire.CodeTooLarge || a.err.Limit != 1<<20 || !strings.Contains(a.err.Message, "1048576") {
		t.Fatalf("a value over the limit: %d %+v", a.status, a.err)
	}
	req, _ := http.NewRequest("PUT", ts.srv.URL+kvPath("alpha", "big"), io.MultiReader(bytes.NewReader(big)))
	req.ContentLength = -1
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set(wire.HeaderRequestID, newID())
	resp, err := ts.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("a chunked body over the limit: %d, want 413", resp.StatusCode)
	}
	// Exactly the limit is fine.
	if a := ts.do(t, "PUT", kvPath("alpha", "big"), tok, reqID(), big[:1<<20]); a.status != 204 {
		t.Fatalf("a value at the limit: %d %+v", a.status, a.err)
	}
	// Keys.
	long := strings.Repeat("k", 1025)
	if a := ts.do(t, "GET", kvPath("alpha", long), tok, nil, nil); a.status != 400 || a.err.Code != wire.CodeKeyTooLong || a.err.Limit != 1024 {
		t.Fatalf("a 1025-byte key: %d %+v", a.status, a.err)
	}
	if a := ts.do(t, "GET", kvPath("alpha", strings.Repeat("k", 1024)), tok, nil, nil); a.status != 404 {
		t.Fatalf("a 1024-byte key: %d %+v, want 404 (a miss)", a.status, a.err)
	}
	// Pages.
	if a := ts.do(t, "GET", "/v1/ns/alpha/list?limit=51", tok, nil, nil); a.status != 400 || a.err.Code != wire.CodePageTooLarge || a.err.Limit != 50 {
		t.Fatalf("a page over the limit: %d %+v", a.status, a.err)
	}
	// Writes need a request id.
	if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, nil, []byte("v")); a.status != 400 || !strings.Contains(a.err.Message, wire.HeaderRequestID) {
		t.Fatalf("a write without a request id: %d %+v", a.status, a.err)
	}
	// Parameters.
	if a := ts.do(t, "GET", "/v1/ns/alpha/kv?key=a&key=b", tok, nil, nil); a.status != 400 {
		t.Fatalf("a key given twice: %d", a.status)
	}
	if a := ts.do(t, "GET", "/v1/ns/alpha/kv?key=a&bogus=1", tok, nil, nil); a.status != 400 || !strings.Contains(a.err.Message, "bogus") {
		t.Fatalf("an unknown parameter: %d %+v", a.status, a.err)
	}
}

func TestInFlightLimit(t *testing.T) {
	ts := newTestService(t, Options{MaxInFlight: 1}, "alpha")
	tok := ts.tokens["alpha"]
	// Hold one request in flight: a PUT whose body has not arrived.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", ts.srv.URL+kvPath("alpha", "slow"), pr)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set(wire.HeaderRequestID, newID())
	done := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	pw.Write([]byte("part"))
	// The first request is in flight once the service holds it: wait for
	// the gauge rather than for time.
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := ts.do(t, "GET", "/v1/ns/alpha/info", tok, nil, nil)
		if a.status == 429 {
			if a.err.Code != wire.CodeRateLimited || a.header.Get("Retry-After") == "" || a.err.Limit != 1 {
				t.Fatalf("429 answer: %+v, Retry-After %q", a.err, a.header.Get("Retry-After"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a second request was never refused while the first was in flight")
		}
		time.Sleep(5 * time.Millisecond)
	}
	pw.Close()
	if st := <-done; st != 204 {
		t.Fatalf("the held request ended with %d, want 204", st)
	}
	if a := ts.do(t, "GET", "/v1/ns/alpha/info", tok, nil, nil); a.status != 200 {
		t.Fatalf("after the first request finished: %d, want 200", a.status)
	}
}

func TestConditionalWritesAndReplays(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		tok := ts.tokens["alpha"]
		id := newID()
		hdr := map[string]string{wire.HeaderRequestID: id, wire.HeaderIfAbsent: "1"}
		first := ts.do(t, "PUT", kvPath("alpha", "k"), tok, hdr, []byte("one"))
		if first.status != 204 || first.header.Get(wire.HeaderReplayed) != "" {
			t.Fatalf("PutIfAbsent: %d %+v replayed=%q", first.status, first.err, first.header.Get(wire.HeaderReplayed))
		}
		v1 := first.header.Get(wire.HeaderVersion)
		// The same request again (its answer was lost): the recorded
		// outcome, not a conflict.
		again := ts.do(t, "PUT", kvPath("alpha", "k"), tok, hdr, []byte("one"))
		if again.status != 204 || again.header.Get(wire.HeaderVersion) != v1 || again.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("the resent PutIfAbsent: %d %+v version %q (want %q) replayed=%q", again.status, again.err,
				again.header.Get(wire.HeaderVersion), v1, again.header.Get(wire.HeaderReplayed))
		}
		// A new request id is a new write: a conflict.
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, map[string]string{wire.HeaderRequestID: newID(), wire.HeaderIfAbsent: "1"}, []byte("x")); a.status != 412 || a.err.Code != wire.CodeExists {
			t.Fatalf("a second PutIfAbsent: %d %+v", a.status, a.err)
		}
		// PutIfVersion, then another writer, then the resend: still the
		// first outcome, and the other writer's value stays.
		pivID := newID()
		piv := map[string]string{wire.HeaderRequestID: pivID, wire.HeaderIfVersion: v1}
		a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, piv, []byte("two"))
		if a.status != 204 {
			t.Fatalf("PutIfVersion: %d %+v", a.status, a.err)
		}
		v2 := a.header.Get(wire.HeaderVersion)
		ts.put(t, "alpha", "k", "other")
		a = ts.do(t, "PUT", kvPath("alpha", "k"), tok, piv, []byte("two"))
		if a.status != 204 || a.header.Get(wire.HeaderVersion) != v2 || a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("the resent PutIfVersion after another write: %d %+v version %q, want 204 with %q", a.status, a.err, a.header.Get(wire.HeaderVersion), v2)
		}
		if g := ts.do(t, "GET", kvPath("alpha", "k"), tok, nil, nil); string(g.body) != "other" {
			t.Fatalf("the resend was applied again: the key holds %q, want the other writer's value", g.body)
		}
		// A resent delete after the key was created again leaves the new
		// key alone.
		delID := map[string]string{wire.HeaderRequestID: newID()}
		if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, delID, nil); a.status != 204 {
			t.Fatalf("DELETE: %d", a.status)
		}
		ts.put(t, "alpha", "k", "reborn")
		if a := ts.do(t, "DELETE", kvPath("alpha", "k"), tok, delID, nil); a.status != 204 || a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatalf("the resent DELETE: %d replayed=%q", a.status, a.header.Get(wire.HeaderReplayed))
		}
		if g := ts.do(t, "GET", kvPath("alpha", "k"), tok, nil, nil); string(g.body) != "reborn" {
			t.Fatalf("the resent DELETE was applied again: %d %q", g.status, g.body)
		}
		// A request id reused for another key is refused by the SQL
		// backends. The generic one keeps recent ids in their key's
		// envelope and so decides the write afresh: PutIfVersion on a
		// missing key fails.
		want := 409
		if _, generic := ts.svc.st.(*kvStore); generic {
			want = 412
		}
		if a := ts.do(t, "PUT", kvPath("alpha", "other-key"), tok, piv, []byte("x")); a.status != want {
			t.Fatalf("a request id reused on another key: %d %+v, want %d", a.status, a.err, want)
		}
		// A version of another epoch never matches.
		_, n, _ := wire.ParseVersion(v2)
		foreign := wire.FormatVersion("zzzzzzzz", n)
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, map[string]string{wire.HeaderRequestID: newID(), wire.HeaderIfVersion: foreign}, []byte("x")); a.status != 412 {
			t.Fatalf("a version of another epoch: %d", a.status)
		}
	})
}

func TestForgetRequestsAfterTheWindow(t *testing.T) {
	forEachSQLBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		tok := ts.tokens["alpha"]
		hdr := map[string]string{wire.HeaderRequestID: newID()}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, hdr, []byte("v")); a.status != 204 {
			t.Fatal(a.status)
		}
		// Nothing is older than a cutoff in the past.
		if n, err := ts.svc.st.forgetRequests(context.Background(), time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("forgetRequests(an hour ago) = %d, %v; want 0", n, err)
		}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, hdr, []byte("v")); a.header.Get(wire.HeaderReplayed) != "true" {
			t.Fatal("the record was forgotten before its time")
		}
		if n, err := ts.svc.st.forgetRequests(context.Background(), time.Now().Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("forgetRequests(in an hour) = %d, %v; want 1", n, err)
		}
		if a := ts.do(t, "PUT", kvPath("alpha", "k"), tok, hdr, []byte("v")); a.status != 204 || a.header.Get(wire.HeaderReplayed) != "" {
			t.Fatalf("after forgetting, the id is new again: %d replayed=%q", a.status, a.header.Get(wire.HeaderReplayed))
		}
	})
}

func TestMetricsAndLogs(t *testing.T) {
	ts := newTestService(t, Options{}, "alpha")
	tok := ts.tokens["alpha"]
	const key, value = "k-LOGGED-KEY", "VALUE-NEVER-LOGGED"
	ts.put(t, "alpha", key, value)
	ts.do(t, "GET", kvPath("alpha", key), tok, nil, nil)
	ts.do(t, "GET", kvPath("alpha", "missing"), tok, nil, nil)
	ts.do(t, "GET", "/v1/ns/alpha/info", "akst_aaaaaaaa_"+strings.Repeat("b", 52), nil, nil)
	a := ts.do(t, "GET", "/metrics", "", nil, nil)
	m := string(a.body)
	for _, want := range []string{
		`agentkit_storaged_requests_total{code="204",namespace="alpha",op="put"} 1`,
		`agentkit_storaged_requests_total{code="200",namespace="alpha",op="get"} 1`,
		`agentkit_storaged_requests_total{code="404",namespace="alpha",op="get"} 1`,
		`agentkit_storaged_errors_total{code="not_found",namespace="alpha",op="get"} 1`,
		`agentkit_storaged_errors_total{code="unauthorized",namespace="-",op="info"} 1`,
		`agentkit_storaged_request_duration_seconds_count{namespace="alpha",op="put"} 1`,
		`agentkit_storaged_credentials 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	logs := ts.logs.String()
	for _, secret := range []string{value, key, tok, tok[14:]} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs contain %q", secret)
		}
	}
	if !strings.Contains(logs, `"op":"put","namespace":"alpha","status":204`) {
		t.Errorf("the logs lack the put line:\n%s", logs)
	}
}

func TestHealthz(t *testing.T) {
	ts := newTestService(t, Options{}, "alpha")
	if a := ts.do(t, "GET", "/healthz", "", nil, nil); a.status != 200 {
		t.Fatalf("healthz: %d %s", a.status, a.body)
	}
	ts.svc.st.close() // the backend goes away
	if a := ts.do(t, "GET", "/healthz", "", nil, nil); a.status != 503 || a.err.Code != wire.CodeUnavailable {
		t.Fatalf("healthz without a backend: %d %+v", a.status, a.err)
	}
	if a := ts.do(t, "GET", "/metrics", "", nil, nil); !strings.Contains(string(a.body), "agentkit_storaged_backend_up 0") {
		t.Error("backend_up is not 0 after a failed health check")
	}
	// A backend error on a write is a 503, which clients retry.
	if a := ts.do(t, "PUT", kvPath("alpha", "k"), ts.tokens["alpha"], reqID(), []byte("v")); a.status != 503 || a.err.Code != wire.CodeUnavailable {
		t.Fatalf("a write without a backend: %d %+v", a.status, a.err)
	}
}

// forEachBackend runs fn on SQLite and on PostgreSQL (tables dropped
// afterwards), then on the generic backend over the memory driver and
// over Redis.
func forEachBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	forEachSQLBackend(t, fn)
	t.Run("kv-mem", func(t *testing.T) {
		fn(t, "mem://")
	})
	t.Run("kv-redis", func(t *testing.T) {
		fn(t, redisBackend(t))
	})
}

// forEachSQLBackend runs fn on SQLite and on PostgreSQL.
func forEachSQLBackend(t *testing.T, fn func(t *testing.T, backend string)) {
	t.Run("sqlite", func(t *testing.T) {
		fn(t, "sqlite:"+filepath.Join(t.TempDir(), "hosted.db")+"?synchronous=normal")
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, pgBackend(t))
	})
}

// redisBackend returns a Redis backend URL with a fresh key prefix, whose
// keys are removed when the test ends, or skips (fails in CI).
func redisBackend(t testing.TB) string { return redistest.URL(t, "hst-") }

const defaultPostgres = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

// pgBackend returns a PostgreSQL backend URL with fresh tables.
func pgBackend(t testing.TB) string {
	t.Helper()
	base := testenv.Getenv("AGENTKIT_TEST_POSTGRES", defaultPostgres)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", "Start one and set AGENTKIT_TEST_POSTGRES to its URL (default "+defaultPostgres+").", err)
	}
	conn.Close(ctx)
	b := make([]byte, 5)
	rand.Read(b)
	prefix := "hst_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop %s_*: %v", prefix, err)
			return
		}
		defer conn.Close(ctx)
		for _, tbl := range []string{"kv", "requests", "eval_runs", "ab_samples", "ab_snapshots", "memory_heads", "memory", "meta"} {
			if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+prefix+"_"+tbl); err != nil {
				t.Error(err)
			}
		}
		conn.Exec(ctx, "DROP SEQUENCE IF EXISTS "+prefix+"_version")
	})
	u, _ := url.Parse(base)
	q := u.Query()
	q.Set("table", prefix)
	q.Set("synchronous_commit", "off")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestCopiesOfOneWriteAtOnce sends eight copies of one write at the same
// moment, as a client does when it resends while the first copy is still
// being served: one is applied, and every copy gets its outcome.
func TestCopiesOfOneWriteAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ts := newTestService(t, Options{Backend: backend}, "alpha")
		tok := ts.tokens["alpha"]
		v0 := ts.put(t, "alpha", "k", "zero")
		for _, c := range []struct {
			name   string
			method string
			hdr    map[string]string
			status int
		}{
			{"PutIfVersion", "PUT", map[string]string{wire.HeaderIfVersion: v0}, 204},
			{"Put", "PUT", nil, 204},
			{"PutIfAbsent on another key", "PUT", map[string]string{wire.HeaderIfAbsent: "1"}, 204},
			{"Delete", "DELETE", nil, 204},
		} {
			t.Run(c.name, func(t *testing.T) {
				key := "k"
				if c.name == "PutIfAbsent on another key" {
					key = "k2"
				}
				hdr := map[string]string{wire.HeaderRequestID: newID()}
				for k, v := range c.hdr {
					hdr[k] = v
				}
				const copies = 8
				answers := make([]answer, copies)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range copies {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						var body []byte
						if c.method == "PUT" {
							body = []byte("value of " + c.name)
						}
						answers[i] = ts.do(t, c.method, kvPath("alpha", key), tok, hdr, body)
					}()
				}
				close(start)
				wg.Wait()
				applied := 0
				for i, a := range answers {
					if a.status != c.status || a.header.Get(wire.HeaderVersion) != answers[0].header.Get(wire.HeaderVersion) {
						t.Fatalf("copy %d: %d %+v version %q; copy 0: %d version %q", i, a.status, a.err, a.header.Get(wire.HeaderVersion),
							answers[0].status, answers[0].header.Get(wire.HeaderVersion))
					}
					if a.header.Get(wire.HeaderReplayed) == "" {
						applied++
					}
				}
				if applied != 1 {
					t.Fatalf("%d of %d copies say they applied the write, want 1", applied, copies)
				}
				g := ts.do(t, "GET", kvPath("alpha", key), tok, nil, nil)
				if c.method == "DELETE" {
					if g.status != 404 {
						t.Fatalf("after the deletes: %d", g.status)
					}
					return
				}
				if g.header.Get(wire.HeaderVersion) != answers[0].header.Get(wire.HeaderVersion) {
					t.Fatalf("the key is at %q, the copies answered %q: the write was applied again", g.header.Get(wire.HeaderVersion), answers[0].header.Get(wire.HeaderVersion))
				}
			})
		}
	})
}
