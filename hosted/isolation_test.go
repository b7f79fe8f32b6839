package hosted

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"agentkit/kv/hostedkv/wire"
)

// The attacker owns namespace "vic", a prefix of the victim's name
// "victim"; a third namespace "victim-2" has the victim's name as its
// prefix. Whatever the attacker sends, it must never read, list, change or
// learn of the victim's keys.

const victimMarker = "VICTIM-SECRET"

var victimKeys = []string{"secret", "a/b", "..", "../x", "%2F", "tim/x", "victim/secret", "x/../../y", "\\..\\z"}

func isolationService(t testing.TB) *testService {
	t.Helper()
	ts := newTestService(t, Options{MaxValueBytes: 1 << 20}, "victim", "vic", "victim-2")
	for _, k := range victimKeys {
		ts.put(t, "victim", k, victimMarker+":"+k)
		ts.put(t, "victim-2", k, victimMarker+"-2:"+k)
	}
	ts.put(t, "vic", "mine", "ATTACKER")
	return ts
}

// hostileTargets are request targets the attacker sends, as raw bytes on
// the wire (no client normalises them).
func hostileTargets() []string {
	long := strings.Repeat("k", 10<<10)
	return []string{
		"/v1/ns/victim/kv?key=secret",
		"/v1/ns/victim/list",
		"/v1/ns/victim-2/list?prefix=",
		"/v1/ns/vic/kv?key=../victim/secret",
		"/v1/ns/vic/kv?key=..%2Fvictim%2Fsecret",
		"/v1/ns/vic/kv?key=%2E%2E%2Fvictim%2Fsecret",
		"/v1/ns/vic/kv?key=%252E%252E%252Fvictim%252Fsecret",
		"/v1/ns/vic/kv?key=%2Fvictim%2Fsecret",
		"/v1/ns/vic/kv?key=tim/x",
		"/v1/ns/vic/kv?key=tim%2Fx",
		"/v1/ns/vic/kv?key=secret%00",
		"/v1/ns/vic/kv?key=%00",
		"/v1/ns/vic/kv?key=",
		"/v1/ns/vic/kv",
		"/v1/ns/vic/kv?key=" + long,
		"/v1/ns/vic/kv?key=%ff%fe",
		"/v1/ns/vic/kv?key=secret&key=../victim/secret",
		"/v1/ns/vic/kv?key=%",
		"/v1/ns/vic/list?prefix=tim",
		"/v1/ns/vic/list?prefix=tim/",
		"/v1/ns/vic/list?prefix=/",
		"/v1/ns/vic/list?prefix=..",
		"/v1/ns/vic/list?prefix=%00",
		"/v1/ns/vic/list?prefix=victim",
		"/v1/ns/vic/list?prefix=&after=",
		"/v1/ns/vic/list?after=..%2Fvictim",
		"/v1/ns/vic/list?prefix=" + long,
		"/v1/ns/vic/../victim/kv?key=secret",
		"/v1/ns/vic/%2E%2E/victim/kv?key=secret",
		"/v1/ns/vic%2F..%2Fvictim/kv?key=secret",
		"/v1/ns/vic%252F..%252Fvictim/kv?key=secret",
		"/v1/ns/victim%00/kv?key=secret",
		"/v1/ns/vic%00victim/kv?key=secret",
		"/v1/ns/vic//kv?key=secret",
		"/v1/ns//victim/kv?key=secret",
		"/v1/ns/VICTIM/kv?key=secret",
		"/v1/ns/vic/kv/../../victim/kv?key=secret",
		"/v1/ns/vic/kv/..%2F..%2Fvictim%2Fkv?key=secret",
		"/v1/ns/vic/kv;victim?key=secret",
		"//v1/ns/victim/kv?key=secret",
		"/v1/ns/./victim/kv?key=secret",
		"/v1/ns/tim/kv?key=secret",
		"/v1/ns/vic/evals?agent=..%2Fvictim&run=x",
		"/v1/ns/vic/memory?agent=victim",
		"/v1/ns/vic/ab-snapshot?agent=victim",
		"http://example.com/v1/ns/victim/kv?key=secret",
		"*",
	}
}

// rawRequest sends one request exactly as given and returns the status
// and body (status 0 when the server closed the connection).
func rawRequest(t testing.TB, addr, method, target, token string, body []byte) (int, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: storaged\r\nAuthorization: Bearer %s\r\n%s: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		method, target, token, wire.HeaderRequestID, newID(), len(body))
	conn.Write(body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestIsolationHostileKeys(t *testing.T) {
	ts := isolationService(t)
	addr := ts.srv.Listener.Addr().String()
	tok := ts.tokens["vic"]
	for _, target := range hostileTargets() {
		for _, method := range []string{"GET", "DELETE", "PUT", "POST"} {
			status, body := rawRequest(t, addr, method, target, tok, []byte("ATTACKER-WRITE"))
			name := method + " " + trim(target)
			if bytes.Contains(body, []byte(victimMarker)) {
				t.Errorf("%s: the answer holds the victim's data: %s", name, trim(string(body)))
			}
			if status >= 500 {
				t.Errorf("%s: status %d: %s", name, status, trim(string(body)))
			}
			if status == 200 && method == "GET" && strings.Contains(target, "/list") {
				// Every key listed is one of the attacker's, holding
				// what the attacker wrote.
				for _, l := range strings.Split(strings.TrimSpace(string(body)), "\n") {
					var e wire.Entry
					if json.Unmarshal([]byte(l), &e) != nil || e.Key == "" {
						continue
					}
					v, _, err := ts.svc.st.get(context.Background(), "vic", e.Key)
					if err != nil || (string(v) != "ATTACKER" && string(v) != "ATTACKER-WRITE") {
						t.Errorf("%s: the listing has %q, which is not the attacker's (%q, %v)", name, e.Key, trim(string(v)), err)
					}
				}
			}
		}
	}
	checkVictim(t, ts)
	// What the attacker wrote stayed in its own namespace, and nothing of
	// the victims' reached it.
	rows, _, err := ts.svc.st.list(context.Background(), "vic", "", "", 1000, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if v := string(r.value); v != "ATTACKER" && v != "ATTACKER-WRITE" {
			t.Errorf("the attacker's namespace holds %q = %q, which it never wrote", r.key, trim(v))
		}
	}
	if len(rows) < 2 {
		t.Errorf("the attacker's own writes did not land in its namespace (%d keys)", len(rows))
	}
}

// checkVictim fails unless both victims hold exactly what they wrote.
func checkVictim(t testing.TB, ts *testService) {
	t.Helper()
	for ns, marker := range map[string]string{"victim": victimMarker + ":", "victim-2": victimMarker + "-2:"} {
		rows, _, err := ts.svc.st.list(context.Background(), ns, "", "", 1000, true)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, r := range rows {
			got[r.key] = string(r.value)
		}
		if len(got) != len(victimKeys) {
			t.Fatalf("namespace %s has %d keys after the attack, want %d: %v", ns, len(got), len(victimKeys), got)
		}
		for _, k := range victimKeys {
			if got[k] != marker+k {
				t.Fatalf("namespace %s: key %q holds %q after the attack, want %q", ns, k, got[k], marker+k)
			}
		}
	}
}

// FuzzHostileRequest sends the attacker's token with any method, target
// and body, parsed the way net/http's server parses a request, and checks
// that no answer carries another namespace's data, nothing panics or
// answers 500, and the victims' keys stay as they were.
func FuzzHostileRequest(f *testing.F) {
	for _, target := range hostileTargets() {
		f.Add("GET", target, []byte(nil))
		f.Add("PUT", target, []byte("x"))
	}
	f.Add("DELETE", "/v1/ns/vic/kv?key=secret", []byte(nil))
	f.Add("POST", "/v1/ns/vic/ab-samples", []byte(`{"agent":"victim","experiment":"e","sessionId":"s","at":"2026-01-01T00:00:00Z","metrics":{}}`))
	f.Add("PUT", "/v1/ns/vic/evals?agent=victim&run=..", []byte(`{}`))
	ts := isolationService(f)
	tok := ts.tokens["vic"]
	f.Fuzz(func(t *testing.T, method, target string, body []byte) {
		if len(method) == 0 || len(method) > 10 || strings.ContainsAny(method, " \r\n") || strings.ContainsAny(target, " \r\n") || len(target) > 32<<10 {
			return
		}
		raw := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: storaged\r\nAuthorization: Bearer %s\r\n%s: %s\r\nContent-Length: %d\r\n\r\n",
			method, target, tok, wire.HeaderRequestID, newID(), len(body))
		req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(strings.NewReader(raw), bytes.NewReader(body))))
		if err != nil {
			return // net/http's server would refuse it too
		}
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if r := recover(); r != nil && r != http.ErrAbortHandler {
					t.Fatalf("%s %q panicked: %v", method, target, r)
				}
			}()
			ts.svc.ServeHTTP(rec, req)
		}()
		if rec.Code == http.StatusInternalServerError {
			t.Fatalf("%s %q: 500: %s", method, target, rec.Body.String())
		}
		if strings.Contains(rec.Body.String(), victimMarker) {
			t.Fatalf("%s %q: the answer holds another namespace's data: %s", method, target, trim(rec.Body.String()))
		}
		checkVictim(t, ts)
	})
}
