package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"agentkit/internal/testenv"
)

// proc is a long-running process a test started: agentkit serve or dev, or
// a program built from an init --go project. It is killed when the test
// ends, if it still runs.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string // from the "listening on" line
	stderr *syncBuffer
	exited chan struct{}
	code   int // exit code, once exited is closed
}

// syncBuffer is a bytes.Buffer safe for the writer goroutine and the test.
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

// startServing starts bin with args in dir and waits for its
// "listening on http://HOST:PORT" line.
func startServing(t *testing.T, bin, dir string, env []string, args ...string) *proc {
	t.Helper()
	p, err := launch(t, bin, dir, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launch starts bin like startServing, and returns an error when the
// process exits before listening or does not listen within 90s.
func launch(t *testing.T, bin, dir string, env []string, args ...string) (*proc, error) {
	t.Helper()
	cmd := serveCommand(bin, dir, env, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s %v: %v", bin, args, err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		err := cmd.Wait()
		p.code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		}
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s %v stderr:\n%s", filepath.Base(bin), args, tail(p.stderr.String(), 4000))
		}
	})
	timeout := time.After(90 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				<-p.exited
				return nil, fmt.Errorf("%s %v exited with %d before listening; stderr:\n%s", filepath.Base(bin), args, p.code, p.stderr.String())
			}
			if u, found := strings.CutPrefix(line, "listening on "); found {
				p.url = u
				go func() { // keep draining stdout
					for range lines {
					}
				}()
				return p, nil
			}
		case <-timeout:
			return nil, fmt.Errorf("%s %v did not print its address within 90s; stderr:\n%s", filepath.Base(bin), args, p.stderr.String())
		}
	}
}

// serveCommand is the command launch starts: bin with args in dir, in a
// clean environment plus env. On Linux it is killed when the test process
// dies (testenv.DieWithParent), so a test binary killed with SIGKILL, which
// runs no cleanup, leaves no server behind.
func serveCommand(bin, dir string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	testenv.DieWithParent(cmd)
	return cmd
}

// startServe runs agentkit with args (serve or dev and their flags).
func startServe(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	return startServing(t, agentkitBin, dir, env, args...)
}

// stop sends sig and returns the exit code.
func (p *proc) stop(sig syscall.Signal) int {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
	select {
	case <-p.exited:
		return p.code
	case <-time.After(90 * time.Second):
		p.t.Fatalf("the server did not exit within 90s of %v", sig)
	}
	return -1
}

// wait waits for the process to exit on its own and returns the exit code.
func (p *proc) wait() int {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(90 * time.Second):
		p.t.Fatal("the server did not exit within 90s")
	}
	return -1
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// call sends a JSON request and decodes the JSON answer into out, when not
// nil. It returns the status.
func call(t *testing.T, method, u, token, body string, out any) int {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, u, err)
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: the answer %q is not JSON: %v", method, u, data, err)
		}
	}
	return resp.StatusCode
}

// turnResult is the answer of the session POST routes.
type turnResult struct {
	SessionID         string `json:"sessionId"`
	ContinuationToken string `json:"continuationToken"`
	Turn              struct {
		Status string `json:"status"`
		Result string `json:"result"`
	} `json:"turn"`
}

type sessionMeta struct {
	ID         string `json:"id"`
	Turns      int    `json:"turns"`
	LastSeq    int    `json:"lastSeq"`
	LastStatus string `json:"lastStatus"`
}

type sessionPage struct {
	Sessions   []sessionMeta `json:"sessions"`
	NextCursor string        `json:"nextCursor"`
}

type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func start(t *testing.T, base, token, message string) turnResult {
	t.Helper()
	var r turnResult
	if st := call(t, "POST", base+"/v1/sessions", token, fmt.Sprintf(`{"message":%q}`, message), &r); st != http.StatusCreated {
		t.Fatalf("POST /v1/sessions: status %d", st)
	}
	if r.Turn.Status != "completed" || r.ContinuationToken == "" {
		t.Fatalf("POST /v1/sessions answered %+v", r)
	}
	return r
}

func continueWith(t *testing.T, base, token, contToken, message string) (int, turnResult) {
	t.Helper()
	var r turnResult
	st := call(t, "POST", base+"/v1/sessions/continue", token, fmt.Sprintf(`{"continuationToken":%q,"message":%q}`, contToken, message), &r)
	return st, r
}

func listSessions(t *testing.T, base, token string) []sessionMeta {
	t.Helper()
	var p sessionPage
	if st := call(t, "GET", base+"/v1/sessions?limit=1000", token, "", &p); st != 200 {
		t.Fatalf("GET /v1/sessions: status %d", st)
	}
	return p.Sessions
}

// writeProject writes a project folder with agentkit.yaml.
func writeProject(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "agentkit.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// slowYAML is an agent whose turns call a tool, then wait three seconds
// before answering, so a test can watch a turn while it runs.
const slowYAML = `name: slow
model:
  provider: echo
  script:
    - tool: list_files
      args: {path: "."}
    - text: "done: {{.UserMessage}}"
      delay: 3s
`

// sseEvent is one server-sent event.
type sseEvent struct{ id, name, data string }

// openStream sends a request accepting text/event-stream and parses the
// events into the returned channel, closed when the stream ends.
func openStream(t *testing.T, method, u, token, body string) <-chan sseEvent {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("%s %s: %v", method, u, err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("%s %s as a stream: status %d, %s", method, u, resp.StatusCode, data)
	}
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.name = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data += line[6:]
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	return ch
}

func nextEvent(t *testing.T, ch <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the event stream ended early")
		}
		return ev
	case <-time.After(60 * time.Second):
		t.Fatal("no event within 60s")
	}
	return sseEvent{}
}

// postgresURL returns the test PostgreSQL's URL with a fresh table, dropped
// when the test ends, or skips (fails in CI) when it is not reachable.
func postgresURL(t *testing.T) (string, *url.URL) {
	t.Helper()
	const def = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	base := testenv.Getenv("AGENTKIT_TEST_POSTGRES", def)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err == nil {
		err = conn.Ping(ctx)
	}
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", "Start one and set AGENTKIT_TEST_POSTGRES to its URL (default "+def+").", err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	table := "agentkit_cli_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		conn.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("AGENTKIT_TEST_POSTGRES %q: %v", base, err)
	}
	q := u.Query()
	q.Set("table", table)
	u.RawQuery = q.Encode()
	return u.String(), u
}

// tcpProxy forwards connections to a server until Close cuts them all: a
// test-owned way to take a store away from a running agentkit.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		go func() { io.Copy(up, c); up.Close() }()
		go func() { io.Copy(c, up); c.Close() }()
	}
}

func (p *tcpProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// Close stops accepting and cuts every forwarded connection.
func (p *tcpProxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
}
