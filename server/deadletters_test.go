package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/ledger"
	"agentkit/server"
)

// ledgerServer is server.Serve in serving mode ledger over store, on a
// real listener.
type ledgerServer struct {
	t     *testing.T
	url   string
	token string
}

func serveLedger(t *testing.T, store *kv.DB, name string) *ledgerServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	rc := agent.Config{
		Agent: agent.Agent{Name: name, Model: echoModel(t), NoWorkspaceTools: true}, StateRoot: t.TempDir(), Store: store,
		Serving: agent.ServingLedger, Logger: discardLogger(),
		Ledger: agent.LedgerOptions{Tuning: ledger.Tuning{Lease: 2 * time.Second, MaxAttempts: 3, MaxPending: 7, JanitorInterval: 100 * time.Millisecond, FollowInterval: 20 * time.Millisecond}, AllowProcessLocal: true},
	}
	const token = "a-long-enough-token"
	go func() {
		done <- server.Serve(ctx, rc, server.Config{
			Addr: "127.0.0.1:0", OnListen: func(a net.Addr) { addr <- a },
			Options: server.Options{AuthToken: token, Logger: discardLogger()},
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	select {
	case a := <-addr:
		return &ledgerServer{t: t, url: "http://" + a.String(), token: token}
	case err := <-done:
		t.Fatalf("Serve in serving mode ledger: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not listen within 30s")
	}
	return nil
}

// do sends a request with the token and decodes a JSON answer into out.
func (s *ledgerServer) do(method, path string, out any) int {
	s.t.Helper()
	req, err := http.NewRequest(method, s.url+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			s.t.Fatalf("%s %s: %q is not JSON: %v", method, path, data, err)
		}
	}
	return resp.StatusCode
}

// metric reads one unlabelled sample (or a histogram's _count) from
// /metrics.
func (s *ledgerServer) metric(name string) float64 {
	s.t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		s.t.Fatalf("/metrics has no %s", name)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// poison dead-letters a first message of session sid under eventID,
// through a host of its own whose turns always fail, then closes that
// host.
func poison(t *testing.T, store *kv.DB, agentName, sid, eventID, message string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := ledger.Open(ledger.Options{Tuning: ledger.Tuning{MaxAttempts: 2, Lease: 2 * time.Second},
		Store: store, Agent: agentName, AllowProcessLocal: true, Logger: discardLogger(),
		Handler: func(context.Context, *ledger.Turn) error { return errors.New("the tool choked on poison") },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	// The payload of a session's first message as the runtime queues it.
	payload := fmt.Sprintf(`{"v":1,"source":"api","message":%q,"start":{"channelId":"http","createdAt":"2030-01-02T15:04:05Z","token":"tok-%s-0123456789abcdef"}}`, message, sid)
	d, err := l.Deliver(ctx, sid, ledger.Event{ID: eventID, Payload: json.RawMessage(payload)})
	if err != nil || !d.Local {
		t.Fatalf("delivering the poison: %+v, %v", d, err)
	}
	if _, err := l.Await(ctx, sid, eventID); !errors.Is(err, ledger.ErrDeadLettered) {
		t.Fatalf("the poison was not dead-lettered: %v", err)
	}
}

type deadLetterList struct {
	DeadLetters []struct {
		SessionID, EventID, LastError string
		Attempts                      int
		At                            time.Time
		Payload                       json.RawMessage
	}
	More bool
}

// TestDeadLettersOverHTTP lists, replays and drops dead letters through a
// server in serving mode ledger; the replayed message's turn is then run
// by the server's host and read through the session routes.
func TestDeadLettersOverHTTP(t *testing.T) {
	store := memkv.New()
	s := serveLedger(t, store, "dl")
	poison(t, store, "dl", "s1", "bad-1", "hello after the fix")
	poison(t, store, "dl", "s2", "bad/2", "never mind")

	var list deadLetterList
	if st := s.do("GET", "/v1/deadletters", &list); st != 200 || len(list.DeadLetters) != 2 || list.More {
		t.Fatalf("GET /v1/deadletters: %d %+v; want both dead letters", st, list)
	}
	d := list.DeadLetters[0]
	if d.SessionID != "s1" || d.EventID != "bad-1" || d.Attempts != 2 || !strings.Contains(d.LastError, "choked on poison") ||
		d.At.IsZero() || !strings.Contains(string(d.Payload), "hello after the fix") {
		t.Errorf("the first dead letter %+v; want s1/bad-1 with 2 attempts, the last error, the time and the payload", d)
	}
	if st := s.do("GET", "/v1/deadletters?limit=1", &list); st != 200 || len(list.DeadLetters) != 1 || !list.More {
		t.Errorf("limit=1: %d %+v; want one and more", st, list)
	}
	if st := s.do("GET", "/v1/deadletters?sessionId=s2", &list); st != 200 || len(list.DeadLetters) != 1 || list.DeadLetters[0].EventID != "bad/2" {
		t.Errorf("sessionId=s2: %d %+v", st, list)
	}
	var e apiError
	if st := s.do("GET", "/v1/deadletters?limit=0", &e); st != 400 || !strings.Contains(e.Error.Message, "limit") {
		t.Errorf("limit=0: %d %+v; want 400 naming limit", st, e)
	}
	if st := s.do("GET", "/v1/deadletters?limit=99999999999999999999", &e); st != 400 || !strings.Contains(e.Error.Message, "out of range; use 1 to 1000") {
		t.Errorf("limit=99999999999999999999: %d %+v; want 400 saying it is out of range and naming the range", st, e)
	}
	if st := s.do("POST", "/v1/deadletters/s1/nope/replay", &e); st != 404 || e.Error.Code != server.CodeDeadLetterNotFound {
		t.Errorf("replay of an unknown dead letter: %d %+v", st, e)
	}

	// Replay: the server's host takes the session and runs the turn.
	var ans struct{ SessionID, EventID, Status string }
	if st := s.do("POST", "/v1/deadletters/s1/bad-1/replay", &ans); st != http.StatusAccepted || ans.Status != "queued" || ans.EventID != "bad-1" {
		t.Fatalf("replay: %d %+v; want 202 queued", st, ans)
	}
	var events struct {
		Events []struct{ Type, Message, EventID string }
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.do("GET", "/v1/sessions/s1/events", &events)
		if st == 200 && len(events.Events) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replayed message's turn did not appear within 20s: %d %+v", st, events)
		}
		time.Sleep(20 * time.Millisecond) // polling for the turn, not asserting time
	}
	if ev := events.Events[0]; ev.Type != "turn.started" || ev.Message != "hello after the fix" || ev.EventID != "bad-1" {
		t.Errorf("the replayed turn starts with %+v", ev)
	}
	var again struct {
		Status    string
		CommitSeq uint64
	}
	if st := s.do("POST", "/v1/deadletters/s1/bad-1/replay", &again); st != 200 || again.Status != "committed" || again.CommitSeq != 1 {
		t.Errorf("a second replay: %d %+v; want 200 committed in turn 1", st, again)
	}

	// Drop, with a slash in the event id.
	if st := s.do("DELETE", "/v1/deadletters/s2/bad%2F2", nil); st != http.StatusNoContent {
		t.Fatalf("DELETE: %d; want 204", st)
	}
	if st := s.do("DELETE", "/v1/deadletters/s2/bad%2F2", &e); st != 404 || e.Error.Code != server.CodeDeadLetterNotFound {
		t.Errorf("a second DELETE: %d %+v; want 404 dead_letter_not_found", st, e)
	}
	if st := s.do("GET", "/v1/deadletters", &list); st != 200 || len(list.DeadLetters) != 0 {
		t.Errorf("after the replay and the drop: %d %+v; want none", st, list)
	}

	// Without the token, 401.
	for _, p := range []string{"GET /v1/deadletters", "POST /v1/deadletters/s1/bad-1/replay", "DELETE /v1/deadletters/s1/bad-1"} {
		method, path, _ := strings.Cut(p, " ")
		req, _ := http.NewRequest(method, s.url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("%s without the token: %d", p, resp.StatusCode)
		}
	}
}

// TestLedgerMetricsAndInfo checks the ledger's metrics and settings over
// HTTP: a turn's delivery, lease and commit are counted and its
// acknowledgement's latency observed.
func TestLedgerMetricsAndInfo(t *testing.T) {
	store := memkv.New()
	s := serveLedger(t, store, "mx")
	for _, name := range []string{"agentkit_ledger_leases_held", "agentkit_ledger_deliveries_total", "agentkit_ledger_commits_total",
		"agentkit_ledger_ack_duration_seconds_count", "agentkit_ledger_takeovers_total", "agentkit_ledger_fenced_commits_total",
		"agentkit_ledger_self_fenced_turns_total", "agentkit_ledger_dead_letters_total", "agentkit_ledger_duplicate_deliveries_total",
		"agentkit_ledger_inbox_depth", "agentkit_ledger_leases_acquired_total"} {
		if v := s.metric(name); v != 0 {
			t.Errorf("%s before any message: %v", name, v)
		}
	}
	req, _ := http.NewRequest("POST", s.url+"/v1/sessions", strings.NewReader(`{"message":"hi"}`))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Idempotency-Key", "m-1")
	for range 2 { // the second is a retry: a duplicate
		req.Body = io.NopCloser(strings.NewReader(`{"message":"hi"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /v1/sessions: %d", resp.StatusCode)
		}
	}
	for name, want := range map[string]float64{
		"agentkit_ledger_deliveries_total": 1, "agentkit_ledger_leases_acquired_total": 1, "agentkit_ledger_commits_total": 1,
	} {
		if v := s.metric(name); v != want {
			t.Errorf("%s after one message: %v; want %v", name, v, want)
		}
	}
	if v := s.metric("agentkit_ledger_ack_duration_seconds_count"); v < 1 {
		t.Errorf("agentkit_ledger_ack_duration_seconds_count: %v; want the acknowledgement observed", v)
	}
	var info struct {
		Serving string
		Ledger  *struct {
			LeaseMs, MarginMs, JanitorIntervalMs, RetryAfterMs  int64
			DriftAllowance                                      float64
			MaxAttempts, MaxPending, MaxEventBytes, DedupWindow int
			MaxPendingBytes                                     int64
			IdempotencyWindowMs, ClockSkewMs                    int64
			MaxKeys                                             int
		}
	}
	if st := s.do("GET", "/v1/info", &info); st != 200 || info.Serving != "ledger" || info.Ledger == nil {
		t.Fatalf("/v1/info: %d %+v; want serving ledger and its settings", st, info)
	}
	l := info.Ledger
	if l.LeaseMs != 2000 || l.MarginMs != 400 || l.DriftAllowance != ledger.DefaultDriftAllowance || l.MaxAttempts != 3 || l.MaxPending != 7 ||
		l.MaxPendingBytes != ledger.DefaultMaxPendingBytes || l.JanitorIntervalMs != 100 || l.DedupWindow != ledger.DefaultDedupWindow ||
		l.RetryAfterMs != ledger.DefaultRetryAfter.Milliseconds() || l.MaxEventBytes != ledger.DefaultMaxEventBytes ||
		l.IdempotencyWindowMs != ledger.DefaultIdempotencyWindow.Milliseconds() || l.ClockSkewMs != ledger.DefaultClockSkew.Milliseconds() || l.MaxKeys != ledger.DefaultMaxKeys {
		t.Errorf("/v1/info ledger settings %+v; want those the server was given, defaults filled in", *l)
	}
}
