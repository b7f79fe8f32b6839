package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// sessionEvents returns the user messages of a session as a server lists
// them: its turns', and, marked "forked:", those of its forked turns.
func sessionEvents(t *testing.T, base, id string) []string {
	t.Helper()
	var page struct {
		Events []struct {
			Type    string            `json:"type"`
			Message string            `json:"message"`
			Forked  []json.RawMessage `json:"forked"`
		} `json:"events"`
	}
	if st := call(t, "GET", base+"/v1/sessions/"+id+"/events?limit=1000", "", "", &page); st != 200 {
		t.Fatalf("GET events: %d", st)
	}
	var msgs []string
	for _, ev := range page.Events {
		switch ev.Type {
		case "turn.started":
			msgs = append(msgs, ev.Message)
		case "turn.forked":
			for _, raw := range ev.Forked {
				var f struct{ Type, Message string }
				if json.Unmarshal(raw, &f) == nil && f.Type == "turn.started" {
					msgs = append(msgs, "forked:"+f.Message)
				}
			}
		}
	}
	return msgs
}

// TestTwoServersKeepEveryAnsweredTurn: two agentkit serve processes in
// the default mode on one PostgreSQL table continue one session at the
// same time; every turn either answered 200 completed is in the session's
// events afterwards on both servers, once (a turn that lost the session
// head to the other server's is there as a fork). A follow-up with
// ifLastSeq after the session moved on is 412, and nothing runs.
func TestTwoServersKeepEveryAnsweredTurn(t *testing.T) {
	t.Parallel()
	store, _ := postgresURL(t)
	dir := writeProject(t, "name: forks\n")
	hosts := map[string]*proc{
		"A": startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir()),
		"B": startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir()),
	}
	s := start(t, hosts["A"].url, "", "one")
	var mu sync.Mutex
	var completed []string
	for round := range 6 {
		var wg sync.WaitGroup
		for name, p := range hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := fmt.Sprintf("%s%d", name, round)
				st, r := continueWith(t, p.url, "", s.ContinuationToken, msg)
				if st == 200 && r.Turn.Status == "completed" {
					mu.Lock()
					completed = append(completed, msg)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	if len(completed) < 6 {
		t.Fatalf("only %d of 12 turns answered completed: %q", len(completed), completed)
	}
	for name, p := range hosts {
		msgs := sessionEvents(t, p.url, s.SessionID)
		for _, m := range completed {
			n := 0
			for _, got := range msgs {
				if strings.TrimPrefix(got, "forked:") == m {
					n++
				}
			}
			if n != 1 {
				t.Errorf("server %s lists the answered turn %q %d times; want once (%q)", name, m, n, msgs)
			}
		}
	}

	var e apiError
	stale := fmt.Sprintf(`{"continuationToken":%q,"message":"stale","ifLastSeq":3}`, s.ContinuationToken)
	if st := call(t, "POST", hosts["B"].url+"/v1/sessions/continue", "", stale, &e); st != http.StatusPreconditionFailed || e.Error.Code != "precondition_failed" || !strings.Contains(e.Error.Message, "not 3") {
		t.Fatalf("a follow-up after event 3: %d %+v; want 412 precondition_failed naming where the session is", st, e)
	}
	for _, m := range sessionEvents(t, hosts["B"].url, s.SessionID) {
		if m == "stale" {
			t.Fatal("the refused follow-up ran")
		}
	}
}

// TestNoTokenReachesTheStoreOrTheStateRoot: through the built binary over
// HTTP, sessions are started, continued, retried with their
// Idempotency-Keys and served again after a restart; no file of the state
// root or of the SQLite store holds any token a client was given.
func TestNoTokenReachesTheStoreOrTheStateRoot(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: tokens\n")
	root, storeDir := t.TempDir(), t.TempDir()
	args := []string{"serve", "--addr", "127.0.0.1:0", "--state-root", root, "--storage", "sqlite:" + filepath.Join(storeDir, "store.db")}
	p := startServe(t, dir, nil, args...)
	post := func(base, path, body, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var tokens []string
	keep := func(body string) turnResult {
		var r turnResult
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.ContinuationToken == "" {
			t.Fatalf("an answer without a token: %s", body)
		}
		tokens = append(tokens, r.ContinuationToken)
		return r
	}
	_, first := post(p.url, "/v1/sessions", `{"message":"one"}`, "start-key")
	s := keep(first)
	_, again := post(p.url, "/v1/sessions", `{"message":"one"}`, "start-key")
	keep(again)
	cont := fmt.Sprintf(`{"continuationToken":%q,"message":"two"}`, s.ContinuationToken)
	post(p.url, "/v1/sessions/continue", cont, "cont-key")
	post(p.url, "/v1/sessions/continue", cont, "cont-key")
	p.stop(syscall.SIGTERM)
	p = startServe(t, dir, nil, args...)
	for _, tok := range tokens {
		if st, r := continueWith(t, p.url, "", tok, "after the restart"); st != 200 || r.SessionID != s.SessionID {
			t.Fatalf("a token after the restart: %d %+v", st, r)
		}
	}
	scan := func() {
		files := 0
		for _, folder := range []string{root, storeDir} {
			filepath.WalkDir(folder, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				files++
				for _, tok := range tokens {
					if bytes.Contains(b, []byte(tok)) {
						t.Errorf("%s holds a continuation token", path)
					}
				}
				return nil
			})
		}
		if files < 2 {
			t.Fatalf("scanned %d files", files)
		}
	}
	scan() // while the server runs
	p.stop(syscall.SIGTERM)
	scan()
}

// TestMovingToServingModeLedger is the switch as an operator makes it,
// through the built binary: a host of serving mode local owes the store a
// turn (the store was cut when it ran); agentkit flush refuses (exit 1)
// while the store is away and writes it once it is back; a server of
// serving mode ledger on the same store then continues the session with
// its token, with its whole history; and the host of serving mode local
// answers 409 session_moved for it from then on.
func TestMovingToServingModeLedger(t *testing.T) {
	t.Parallel()
	_, pg := postgresURL(t)
	proxy := newProxy(t, pg.Host)
	viaProxy := *pg
	viaProxy.Host = proxy.Addr()
	store := viaProxy.String()
	dir := writeProject(t, "name: moving\npolicy:\n  restore: off\n")
	root := t.TempDir()
	local := []string{"serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", root}
	a := startServe(t, dir, nil, local...)
	s := start(t, a.url, "", "one")
	proxy.Close() // the store goes away
	if st, r := continueWith(t, a.url, "", s.ContinuationToken, "while cut"); st != 200 || r.Turn.Status != "completed" {
		t.Fatalf("a turn with the store cut: %d %+v; want it answered (it is owed)", st, r)
	}
	a.stop(syscall.SIGTERM)

	if r := run(t, dir, nil, "", "flush", "--storage", store, "--state-root", root); r.code != 1 || !strings.Contains(r.stderr, "still owe") {
		t.Fatalf("flush with the store away: exit %d\n%s%s; want 1, saying sessions still owe writes", r.code, r.stdout, r.stderr)
	}
	proxy = newProxy(t, pg.Host) // the store is back, at a new address
	viaProxy.Host = proxy.Addr()
	store = viaProxy.String()
	local[4] = store
	if r := run(t, dir, nil, "", "flush", "--storage", store, "--state-root", root); r.code != 0 || !strings.Contains(r.stdout, "owes no writes") {
		t.Fatalf("flush with the store back: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	led := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--storage", store, "--state-root", t.TempDir(), "--serving", "ledger")
	st, r := continueWith(t, led.url, "", s.ContinuationToken, "on the ledger")
	if st != 200 || r.SessionID != s.SessionID {
		t.Fatalf("the ledger host continuing the local session: %d %+v", st, r)
	}
	if msgs := sessionEvents(t, led.url, s.SessionID); strings.Join(msgs, "|") != "one|while cut|on the ledger" {
		t.Fatalf("the ledger host lists %q; want the whole history", msgs)
	}
	b := startServe(t, dir, nil, local...)
	var e apiError
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"back on local"}`, s.ContinuationToken)
	if st := call(t, "POST", b.url+"/v1/sessions/continue", "", body, &e); st != 409 || e.Error.Code != "session_moved" {
		t.Fatalf("the host of serving mode local after the move: %d %+v; want 409 session_moved", st, e)
	}
}
