package hostedkv_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentkit/hosted"
	"agentkit/internal/cli"
	"agentkit/internal/proctest"
	"agentkit/internal/testenv"
	"agentkit/internal/testenv/redistest"
	"agentkit/kv"
	"agentkit/kv/hostedkv"
	_ "agentkit/kv/memkv"  // mem:// backends of the generic storaged
	_ "agentkit/kv/natskv" // nats:// backends of the generic storaged
)

// The tests run storaged as a separate process: the test binary starts
// itself again in the "storaged" role, which runs the real command
// (agentkit storaged, through cli.Main) with the arguments in argsEnv.

const argsEnv = "HOSTEDKV_TEST_STORAGED_ARGS"

func TestMain(m *testing.M) {
	proctest.Main(m, map[string]func() error{"storaged": runStoragedChild, "relay": runRelayChild})
}

func runStoragedChild() error {
	if path := os.Getenv("HOSTEDKV_TEST_CPUPROFILE"); path != "" {
		// For profiling the service under a benchmark: the first
		// HOSTEDKV_TEST_CPUPROFILE_SECONDS (default 20) of the process.
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		secs, _ := strconv.Atoi(os.Getenv("HOSTEDKV_TEST_CPUPROFILE_SECONDS"))
		go func() {
			time.Sleep(time.Duration(max(secs, 1)) * time.Second)
			if secs == 0 {
				time.Sleep(19 * time.Second)
			}
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	args := strings.Split(os.Getenv(argsEnv), "\x1f")
	if code := cli.Main(append([]string{"storaged"}, args...), os.Stdin, os.Stdout, os.Stderr); code != 0 {
		return fmt.Errorf("agentkit storaged exited with status %d", code)
	}
	return nil
}

const defaultPostgres = "postgres://root@127.0.0.1:5432/test?sslmode=disable"

var (
	pgOnce sync.Once
	pgErr  error
)

// postgresServer returns the test server's URL, or skips (fails in CI).
func postgresServer(t testing.TB) string {
	t.Helper()
	u := testenv.Getenv("AGENTKIT_TEST_POSTGRES", defaultPostgres)
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var conn *pgx.Conn
		if conn, pgErr = pgx.Connect(ctx, u); pgErr == nil {
			pgErr = conn.Ping(ctx)
			conn.Close(ctx)
		}
	})
	if pgErr != nil {
		testenv.Unavailable(t, "PostgreSQL", "Start one and set AGENTKIT_TEST_POSTGRES to its URL (default "+defaultPostgres+").", pgErr)
	}
	return u
}

// pgBackend returns a backend URL with a fresh table prefix, whose tables
// are dropped when the test ends. fast sets synchronous_commit=off (the
// tests kill storaged, never PostgreSQL, so commits survive either way).
func pgBackend(t testing.TB, fast bool) string {
	t.Helper()
	base := postgresServer(t)
	b := make([]byte, 5)
	rand.Read(b)
	prefix := "hkt_" + hex.EncodeToString(b)
	t.Cleanup(func() { dropTables(t, base, prefix) })
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("table", prefix)
	if fast {
		q.Set("synchronous_commit", "off")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// dropTables drops what the service made under prefix.
func dropTables(t testing.TB, base, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Errorf("drop %s_*: %v", prefix, err)
		return
	}
	defer conn.Close(ctx)
	var stmts []string
	for _, tbl := range []string{"kv", "requests", "eval_runs", "ab_samples", "ab_snapshots", "memory_heads", "memory", "meta"} {
		stmts = append(stmts, "DROP TABLE IF EXISTS "+prefix+"_"+tbl)
	}
	stmts = append(stmts, "DROP SEQUENCE IF EXISTS "+prefix+"_version")
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
}

// redisBackend returns a Redis backend URL with a fresh key prefix, whose
// keys are removed when the test ends, or skips (fails in CI).
func redisBackend(t testing.TB) string { return redistest.URL(t, "hkt-") }

const defaultNATS = "nats://127.0.0.1:4222"

// natsBackend returns a NATS backend URL with a fresh in-memory bucket,
// deleted when the test ends, or skips (fails in CI).
func natsBackend(t testing.TB) string {
	t.Helper()
	raw := testenv.Getenv("AGENTKIT_TEST_NATS", defaultNATS)
	nc, err := nats.Connect(raw, nats.Timeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS JetStream", "Start nats-server -js and set AGENTKIT_TEST_NATS to its URL (default "+defaultNATS+").", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	bucket := "hkt" + randomHex(5)
	t.Cleanup(func() {
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteKeyValue(ctx, bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Errorf("delete bucket %s: %v", bucket, err)
		}
	})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return "nats://" + u.Host + "/?bucket=" + bucket + "&storage=memory&replicas=1"
}

// service is a storaged process started by a test.
type service struct {
	t       testing.TB
	backend string
	creds   string
	extra   []string
	addr    string // host:port, kept across restarts
	child   *proctest.Child
	url     string
}

// startService starts storaged on backend with a fresh credentials file.
func startService(t testing.TB, backend string, extra ...string) *service {
	t.Helper()
	s := &service{t: t, backend: backend, creds: filepath.Join(t.TempDir(), "creds.json"), extra: extra, addr: "127.0.0.1:0"}
	// An empty credentials file to start with; namespaces add theirs.
	if err := os.WriteFile(s.creds, []byte(`{"format":1,"credentials":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hosted.KeyPath(s.creds), []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.start()
	return s
}

func (s *service) start() {
	s.t.Helper()
	args := append([]string{"--backend", s.backend, "--credentials", s.creds, "--addr", s.addr, "--log-level", "warn"}, s.extra...)
	s.child = proctest.Start(s.t, "storaged", argsEnv+"="+strings.Join(args, "\x1f"))
	line := s.child.Expect("listening on ", 60*time.Second)
	s.url = strings.TrimPrefix(line, "listening on ")
	s.addr = strings.TrimPrefix(strings.TrimPrefix(s.url, "http://"), "https://")
}

// kill ends the process with SIGKILL and waits for it.
func (s *service) kill() {
	s.child.Kill()
	s.child.Wait()
}

// restart starts the service again on the same address.
func (s *service) restart() { s.start() }

// namespace adds a credential for a fresh namespace, makes the running
// service reload, and returns the namespace and its token.
func (s *service) namespace(t testing.TB) (string, string) {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	ns := "t-" + hex.EncodeToString(b)
	return ns, s.addNamespace(t, ns)
}

// addNamespace adds a credential for ns and waits until the service takes
// it.
func (s *service) addNamespace(t testing.TB, ns string) string {
	t.Helper()
	token, _, err := hosted.AddCredential(s.creds, hosted.KeyPath(s.creds), ns, true)
	if err != nil {
		t.Fatal(err)
	}
	s.reload(t)
	s.waitStatus(t, ns, token, http.StatusOK)
	return token
}

// reload sends SIGHUP.
func (s *service) reload(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(s.child.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// waitStatus polls GET …/info with token until it answers want.
func (s *service) waitStatus(t testing.TB, ns, token string, want int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := s.infoStatus(t, ns, token)
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /v1/ns/%s/info answered %d for 15s, want %d; stderr:\n%s", ns, st, want, s.child.Stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *service) infoStatus(t testing.TB, ns, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+"/v1/ns/"+ns+"/info", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// open opens a client of its own to ns.
func (s *service) open(t testing.TB, ns, token string, opts *hostedkv.Options) *kv.DB {
	t.Helper()
	o := hostedkv.Options{}
	if opts != nil {
		o = *opts
	}
	o.Token = token
	db, err := hostedkv.Open(context.Background(), s.url, ns, &o)
	if err != nil {
		t.Fatalf("hostedkv.Open(%s, %s): %v", s.url, ns, err)
	}
	return db
}
