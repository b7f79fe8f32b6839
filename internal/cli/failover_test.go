package cli_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestFailoverKeepsEveryAcknowledgedTurn runs agentkit serve as three and
// then four hosts, each with its own state root, over one PostgreSQL
// table, and checks that no acknowledged turn is ever overwritten:
//
//   - A serves a session, B continues it, A continues it again from its
//     older copy: A first takes B's turn from the store, and a host with a
//     fresh state root sees all three turns;
//   - A loses the store, runs a turn from its copy (acknowledged), while C
//     commits a turn: when the store is back, A's retry loses the session
//     head, keeps its turn as a fork (counted in /metrics, backlog back to
//     0), and A's next turn starts from the store's history;
//   - a DELETE on one host leaves a tombstone the others honour.
func TestFailoverKeepsEveryAcknowledgedTurn(t *testing.T) {
	t.Parallel()
	store, pg := postgresURL(t)
	proxy := newSwitchProxy(t, pg.Host)
	viaProxy := *pg
	viaProxy.Host = proxy.Addr()
	dir := writeProject(t, "name: failover\npolicy:\n  restore: off\n")
	rootA, rootB, rootC, rootD := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	serve := func(root, storage string) *proc {
		return startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", storage, "--state-root", root)
	}
	cont := func(p *proc, token, msg string) turnResult {
		t.Helper()
		st, r := continueWith(t, p.url, "", token, msg)
		if st != 200 || r.Turn.Status != "completed" {
			t.Fatalf("continue %q: status %d %+v", msg, st, r)
		}
		return r
	}

	a := serve(rootA, store)
	s := start(t, a.url, "", "one on A")
	a.stop(syscall.SIGTERM)
	b := serve(rootB, store)
	cont(b, s.ContinuationToken, "two on B")
	b.stop(syscall.SIGTERM)
	a = serve(rootA, store)
	if r := cont(a, s.ContinuationToken, "three on A"); r.Turn.Result != "echo: three on A" {
		t.Fatalf("A's third turn %+v", r)
	}
	a.stop(syscall.SIGTERM)
	c := serve(rootC, store)
	if got := messages(t, c, s.SessionID); got != "one on A|two on B|three on A" {
		t.Fatalf("a host with a fresh state root sees %q; want every acknowledged turn", got)
	}

	// A, through a connection the test can cut.
	a = serve(rootA, viaProxy.String())
	proxy.setDown(true)
	cont(a, s.ContinuationToken, "four on A, store down")
	if v := metric(t, a, "agentkit_mirror_backlog_sessions"); v != 1 {
		t.Errorf("A's backlog during the outage: %v; want 1", v)
	}
	cont(c, s.ContinuationToken, "four on C")
	proxy.setDown(false)
	deadline := time.Now().Add(90 * time.Second)
	for metric(t, a, "agentkit_mirror_forks_total") != 1 || metric(t, a, "agentkit_mirror_backlog_sessions") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("A's retry did not settle within 90s: forks %v, backlog %v", metric(t, a, "agentkit_mirror_forks_total"), metric(t, a, "agentkit_mirror_backlog_sessions"))
		}
		time.Sleep(100 * time.Millisecond) // polling a condition, not asserting time
	}
	cont(a, s.ContinuationToken, "five on A")
	if got := messages(t, a, s.SessionID); got != "one on A|two on B|three on A|four on C|five on A" {
		t.Errorf("A after its fork: %q", got)
	}
	d := serve(rootD, store)
	if got := messages(t, d, s.SessionID); got != "one on A|two on B|three on A|four on C|five on A" {
		t.Errorf("the store's session: %q", got)
	}
	if !strings.Contains(a.stderr.String(), "recorded in a turn.forked event") {
		t.Error("A did not log its fork")
	}

	// A delete on D is honoured by A and C, which hold copies.
	if st := call(t, "DELETE", d.url+"/v1/sessions/"+s.SessionID, "", "", nil); st != http.StatusNoContent && st != http.StatusOK {
		t.Fatalf("DELETE: status %d", st)
	}
	for name, p := range map[string]*proc{"A": a, "C": c} {
		var e apiError
		body := fmt.Sprintf(`{"continuationToken":%q,"message":"after the delete"}`, s.ContinuationToken)
		if st := call(t, "POST", p.url+"/v1/sessions/continue", "", body, &e); st != 404 {
			t.Errorf("host %s continued a deleted session: status %d %+v", name, st, e)
		}
		for _, m := range listSessions(t, p.url, "") {
			if m.ID == s.SessionID {
				t.Errorf("host %s still lists the deleted session", name)
			}
		}
	}
	e := serve(t.TempDir(), store)
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"after the delete"}`, s.ContinuationToken)
	if st := call(t, "POST", e.url+"/v1/sessions/continue", "", body, nil); st != 404 {
		t.Errorf("a new host resolved the deleted session's token: status %d", st)
	}
}

// messages returns the user messages of a session as one string.
func messages(t *testing.T, p *proc, id string) string {
	t.Helper()
	var got struct {
		Events []struct{ Type, Message string }
	}
	if st := call(t, "GET", p.url+"/v1/sessions/"+id+"/events?limit=1000", "", "", &got); st != 200 {
		t.Fatalf("GET events: status %d", st)
	}
	var out []string
	for _, e := range got.Events {
		if e.Type == "turn.started" {
			out = append(out, e.Message)
		}
	}
	return strings.Join(out, "|")
}

// metric reads one unlabelled metric from /metrics.
func metric(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// switchProxy forwards connections to a server, and while down refuses
// them and cuts the open ones: a store outage the test switches on and
// off at one address.
type switchProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.setDown(true)
	})
	return p
}

func (p *switchProxy) Addr() string { return p.ln.Addr().String() }

func (p *switchProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

func (p *switchProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go func() { io.Copy(up, c); up.Close() }()
		go func() { io.Copy(c, up); c.Close() }()
	}
}
