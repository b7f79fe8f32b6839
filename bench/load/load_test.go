package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// agentkitBin is the agentkit binary built once for these tests, so the
// tool starts the server as a user's run does.
var agentkitBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentkit-load-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentkitBin = filepath.Join(dir, "agentkit")
	build := exec.Command("go", "build", "-o", agentkitBin, "agentkit/cmd/agentkit")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building agentkit:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// row is one level's line of the report.
type row struct{ clients, turns, errors int }

// rows parses the report's table.
func rows(t *testing.T, out string) []row {
	t.Helper()
	var rs []row
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 9 || !regexp.MustCompile(`^[0-9]+$`).MatchString(f[0]) {
			continue // not a level's line
		}
		var r row
		var err error
		for i, p := range []*int{&r.clients, &r.turns, &r.errors} {
			if *p, err = strconv.Atoi(f[i]); err != nil {
				t.Fatalf("report line %q: %v", line, err)
			}
		}
		rs = append(rs, r)
	}
	return rs
}

// TestSmokeStartsTheServerAndReports runs the tool as CI's smoke test
// does: a tiny duration at 1 and 2 clients against the agentkit serve it
// starts. It checks that every level completed turns without a failure,
// that both ratios are printed, and that the server's folder is gone
// afterwards. It asserts no timing.
func TestSmokeStartsTheServerAndReports(t *testing.T) {
	cfg, err := parseFlags([]string{"-bin", agentkitBin, "-clients", "1,2", "-duration", "300ms", "-warmup", "0", "-turns", "3", "-message-bytes", "50"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var out, info bytes.Buffer
	if err := run(t.Context(), cfg, &out, &info); err != nil {
		t.Fatalf("%v\n%s\n%s", err, info.String(), out.String())
	}
	rs := rows(t, out.String())
	if len(rs) != 2 || rs[0].clients != 1 || rs[1].clients != 2 {
		t.Fatalf("the report has levels %+v; want 1 and 2 clients:\n%s", rs, out.String())
	}
	for _, r := range rs {
		if r.turns == 0 || r.errors != 0 {
			t.Errorf("%d clients: %d turns, %d errors; want turns and no error:\n%s", r.clients, r.turns, r.errors, out.String())
		}
	}
	for _, want := range []string{"p99/p50 at 2 clients: ", "throughput at 2 clients / at 1: ", "echo model, memory journal on, the embedded SQLite store"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
	m := regexp.MustCompile(`its folder: (\S+)`).FindStringSubmatch(info.String())
	if m == nil {
		t.Fatalf("the tool did not say where the server's folder was:\n%s", info.String())
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the server's folder %s is still there after the run (%v)", m[1], err)
	}
}

// TestFailedTurnsAreReported drives a server whose turns fail: the run
// ends with an error naming the failure, and the report counts it.
func TestFailedTurnsAreReported(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			return
		}
		http.Error(w, `{"error":{"code":"internal","message":"disk full"}}`, http.StatusInternalServerError)
	}))
	defer srv.Close()
	cfg, err := parseFlags([]string{"-addr", srv.URL, "-clients", "1", "-duration", "50ms", "-warmup", "0"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var out, info bytes.Buffer
	err = run(t.Context(), cfg, &out, &info)
	if err == nil || !strings.Contains(err.Error(), "disk full") || !strings.Contains(err.Error(), "requests failed at 1 clients") {
		t.Fatalf("run against failing turns returned %v; want an error counting them and quoting the server", err)
	}
	if rs := rows(t, out.String()); len(rs) != 1 || rs[0].errors == 0 || rs[0].turns != 0 {
		t.Errorf("the report shows %+v; want the failures counted and no turns:\n%s", rs, out.String())
	}
}

// TestUnreachableServer fails before any load, naming the address.
func TestUnreachableServer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close()
	cfg, err := parseFlags([]string{"-addr", addr, "-duration", "1s"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = run(t.Context(), cfg, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("run against a closed address returned %v; want an error naming %s", err, addr)
	}
	if time.Since(start) >= time.Second {
		t.Errorf("the tool ran its load before finding the server unreachable")
	}
}

func TestFlagErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-clients", "0"}, "-clients"},
		{[]string{"-clients", "1,x"}, "-clients"},
		{[]string{"-duration", "0s"}, "-duration"},
		{[]string{"-turns", "0"}, "-turns"},
		{[]string{"-rounds", "0"}, "-rounds"},
		{[]string{"-addr", "http://127.0.0.1:1", "-bin", "agentkit"}, "-addr"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		_, err := parseFlags(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseFlags(%q) = %v; want an error naming %s", c.args, err, c.want)
		}
	}
}

// fakeTurns is a server answering every turn: each start with a new
// token, each continue with the token it was sent. It records the paths
// and tokens it got, in order; status is the turns' status.
type fakeTurns struct {
	mu     sync.Mutex
	status string
	calls  []string // "start" or "continue <token>"
	n      int
}

func (f *fakeTurns) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		return
	}
	var body struct {
		Token string `json:"continuationToken"`
	}
	json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	defer f.mu.Unlock()
	code, token := http.StatusOK, body.Token
	if r.URL.Path == "/v1/sessions" {
		f.n++
		code, token = http.StatusCreated, fmt.Sprintf("token-%d", f.n)
		f.calls = append(f.calls, "start")
	} else {
		f.calls = append(f.calls, "continue "+body.Token)
	}
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"sessionId":"s","continuationToken":%q,"turn":{"status":%q,"result":"echo"}}`, token, f.status)
}

// TestClientStartsThenContinues checks one client's requests: a start,
// then -turns - 1 continues carrying the start's token, then a new start.
func TestClientStartsThenContinues(t *testing.T) {
	f := &fakeTurns{status: "completed"}
	srv := httptest.NewServer(f)
	defer srv.Close()
	cfg, err := parseFlags([]string{"-addr", srv.URL, "-clients", "1", "-duration", "2s", "-warmup", "0", "-turns", "3"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context(), cfg, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Four requests show the cycle: a start, two continues, a new start.
	// Two seconds against an instant server leave room for a loaded machine.
	if len(f.calls) < 4 {
		t.Fatalf("the client made %d requests in 2s against an instant server: %v", len(f.calls), f.calls)
	}
	for i, got := range f.calls {
		want := "start"
		if i%3 != 0 {
			want = fmt.Sprintf("continue token-%d", i/3+1)
		}
		if got != want {
			t.Fatalf("request %d was %q; want %q (a start, then two continues with its token)", i, got, want)
		}
	}
}

// TestFailedTurnStatusIsAnError counts a turn the server answers with
// status failed as a failed request, not a latency.
func TestFailedTurnStatusIsAnError(t *testing.T) {
	srv := httptest.NewServer(&fakeTurns{status: "failed"})
	defer srv.Close()
	cfg, err := parseFlags([]string{"-addr", srv.URL, "-clients", "1", "-duration", "20ms", "-warmup", "0"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(t.Context(), cfg, &out, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `ended "failed"`) {
		t.Fatalf("run against turns ending failed returned %v; want an error saying so", err)
	}
	if rs := rows(t, out.String()); len(rs) != 1 || rs[0].turns != 0 {
		t.Errorf("failed turns were counted as turns: %+v", rs)
	}
}
