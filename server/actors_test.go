package server_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"agentkit/agent"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/server"
	"agentkit/tool"
)

// sendState sends a request with a Content-Type to a session's state and
// returns the status, the body and the headers.
func (f *fixture) sendState(method, id, ctype, body string) (int, string, http.Header) {
	f.t.Helper()
	hdr := http.Header{}
	if ctype != "" {
		hdr.Set("Content-Type", ctype)
	}
	resp := f.send(method, "/v1/sessions/"+id+"/state", body, hdr)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (f *fixture) startSession(msg string) agent.TurnResult {
	f.t.Helper()
	var res agent.TurnResult
	if st := f.do("POST", "/v1/sessions", fmt.Sprintf(`{"message":%q}`, msg), &res); st != http.StatusCreated {
		f.t.Fatalf("start: status %d", st)
	}
	return res
}

const mergePatch = "application/merge-patch+json"

// wantState checks a state answer: the status and the exact JSON.
func wantState(t *testing.T, what string, status int, body string, want string) {
	t.Helper()
	if status != http.StatusOK || body != want+"\n" {
		t.Fatalf("%s: %d %q; want 200 %s", what, status, body, want)
	}
}

func TestSessionStateOverHTTP(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	id := f.startSession("hello").SessionID
	actors := filepath.Join(f.rt.StateRoot(), "actors")

	st, body, hdr := f.sendState("GET", id, "", "")
	wantState(t, "GET of a new session", st, body, `{}`)
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if entries, _ := os.ReadDir(actors); len(entries) != 0 {
		t.Fatalf("a read created %v under actors/", entries)
	}

	st, body, _ = f.sendState("PATCH", id, mergePatch, `{"status":"busy","big":12345678901234567890,"tiny":0.1000000000000000055511151231257827,"nested":{"a":1,"b":[1,null]}}`)
	wantState(t, "first PATCH", st, body, `{"status":"busy","big":12345678901234567890,"tiny":0.1000000000000000055511151231257827,"nested":{"a":1,"b":[1,null]}}`)
	st, body, _ = f.sendState("PATCH", id, mergePatch+"; charset=utf-8", `{"nested":{"a":null,"c":true},"status":"idle"}`)
	wantState(t, "second PATCH", st, body, `{"status":"idle","big":12345678901234567890,"tiny":0.1000000000000000055511151231257827,"nested":{"b":[1,null],"c":true}}`)
	st, body, _ = f.sendState("GET", id, "", "")
	wantState(t, "GET after the patches", st, body, `{"status":"idle","big":12345678901234567890,"tiny":0.1000000000000000055511151231257827,"nested":{"b":[1,null],"c":true}}`)
	if _, err := os.Stat(filepath.Join(actors, "session", id, "system.db")); err != nil {
		t.Fatalf("the first write did not create the actor's database: %v", err)
	}

	st, body, _ = f.sendState("PUT", id, "application/json", ` {"replaced": [3, 2, 1]} `)
	wantState(t, "PUT", st, body, `{"replaced":[3,2,1]}`)
	st, body, _ = f.sendState("GET", id, "", "")
	wantState(t, "GET after PUT", st, body, `{"replaced":[3,2,1]}`)

	// Deleting the session deletes its state.
	if st := f.do("DELETE", "/v1/sessions/"+id, "", nil); st != http.StatusNoContent {
		t.Fatalf("delete: %d", st)
	}
	if _, err := os.Stat(filepath.Join(actors, "session", id)); !os.IsNotExist(err) {
		t.Fatalf("the deleted session's actor folder: %v", err)
	}
	f.wantError("GET", "/v1/sessions/"+id+"/state", "", 404, server.CodeSessionNotFound)
}

func TestSessionStateErrors(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{MaxBodyBytes: 256}})
	id := f.startSession("hello").SessionID
	for _, c := range []struct {
		name, method, id, ctype, body string
		status                        int
		code                          string
		says                          []string
	}{
		{"PATCH without a Content-Type", "PATCH", id, "", `{"a":1}`, 415, server.CodeUnsupportedMediaType, []string{"application/merge-patch+json", "no Content-Type"}},
		{"PATCH as plain JSON", "PATCH", id, "application/json", `{"a":1}`, 415, server.CodeUnsupportedMediaType, []string{"application/merge-patch+json", `"application/json"`}},
		{"PUT as a merge patch", "PUT", id, mergePatch, `{"a":1}`, 415, server.CodeUnsupportedMediaType, []string{"application/json"}},
		{"PUT as a form", "PUT", id, "application/x-www-form-urlencoded", `{"a":1}`, 415, server.CodeUnsupportedMediaType, []string{"application/json"}},
		{"a patch that is not JSON", "PATCH", id, mergePatch, "{\n  \"a\": ix}", 400, server.CodeInvalidJSON, []string{"patch", "line 2, column 8"}},
		{"a patch with a key twice", "PATCH", id, mergePatch, `{"a":1,"a":2}`, 400, server.CodeInvalidJSON, []string{"patch", "line 1"}},
		{"a patch that is not UTF-8", "PATCH", id, mergePatch, "{\"a\":\"\xff\"}", 400, server.CodeInvalidJSON, []string{"patch", "UTF-8"}},
		{"a patch with a lone surrogate", "PATCH", id, mergePatch, `{"a":"\ud800"}`, 400, server.CodeInvalid, []string{"surrogate"}},
		{"a state with a lone surrogate", "PUT", id, "application/json", `{"a":"\udc00x"}`, 400, server.CodeInvalid, []string{"surrogate"}},
		{"a state that is not JSON", "PUT", id, "application/json", `{"a":`, 400, server.CodeInvalidJSON, []string{"state", "line 1"}},
		{"an empty patch", "PATCH", id, mergePatch, ``, 400, server.CodeInvalid, []string{"empty"}},
		{"a state that is not an object", "PUT", id, "application/json", `[1,2]`, 422, server.CodeInvalidState, []string{"JSON object, not an array"}},
		{"a patch making the state a number", "PATCH", id, mergePatch, `5`, 422, server.CodeInvalidState, []string{"JSON object, not a number"}},
		{"a state of null", "PUT", id, "application/json", `null`, 422, server.CodeInvalidState, []string{"JSON object, not null"}},
		{"a patch of null", "PATCH", id, mergePatch, `null`, 422, server.CodeInvalidState, []string{"JSON object, not null"}},
		{"a patch over the body limit", "PATCH", id, mergePatch, `{"a":"` + strings.Repeat("x", 300) + `"}`, 413, server.CodeTooLarge, nil},
		{"GET of an unknown session", "GET", "no-such", "", ``, 404, server.CodeSessionNotFound, nil},
		{"PATCH of an unknown session", "PATCH", "no-such", mergePatch, `{"a":1}`, 404, server.CodeSessionNotFound, nil},
		{"PUT of an unknown session", "PUT", "no-such", "application/json", `{"a":1}`, 404, server.CodeSessionNotFound, nil},
	} {
		st, body, hdr := f.sendState(c.method, c.id, c.ctype, c.body)
		var e apiError
		json.Unmarshal([]byte(body), &e)
		if st != c.status || e.Error.Code != c.code {
			t.Errorf("%s: %d %s; want %d %s", c.name, st, body, c.status, c.code)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(e.Error.Message, s) {
				t.Errorf("%s: message %q does not say %q", c.name, e.Error.Message, s)
			}
		}
		if strings.Contains(e.Error.Message, "SessionState") || strings.Contains(e.Error.Message, "agent.") {
			t.Errorf("%s: message %q names a Go type", c.name, e.Error.Message)
		}
		if st == 415 && c.method == "PATCH" && hdr.Get("Accept-Patch") != mergePatch {
			t.Errorf("%s: Accept-Patch %q", c.name, hdr.Get("Accept-Patch"))
		}
	}
	// None of them stored anything or created the actor's database.
	st, body, _ := f.sendState("GET", id, "", "")
	wantState(t, "GET after the refused requests", st, body, `{}`)
	if _, err := os.Stat(filepath.Join(f.rt.StateRoot(), "actors", "session", id)); !os.IsNotExist(err) {
		t.Fatalf("refused requests created the actor's folder: %v", err)
	}
	f.wantError("GET", "/v1/sessions/no-such/messages", "", 404, server.CodeSessionNotFound)
}

// A session whose actor another host migrated out of the key-value store
// is 409 naming that host, on reads and writes; an actor database of a
// newer format is 500 saying to upgrade.
func TestSessionStateOnAnotherHostOrNewer(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	f := newFixture(t, fixtureOpts{store: store})
	migrated := f.startSession("one").SessionID
	db, err := kv.New("mem", store)
	if err != nil {
		t.Fatal(err)
	}
	scope, _ := keys.Agent("test")
	prefix, _ := scope.Actor(migrated)
	marker := fmt.Sprintf(`{"format":1,"state":"migrated","host":"web-9","dir":"/srv/web-9/actors","class":"session","id":%q,"at":"2026-01-01T00:00:00Z"}`, migrated)
	if err := db.Put(ctx, prefix+"migrated", []byte(marker)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, ctype, body string }{{"GET", "", ""}, {"PATCH", mergePatch, `{"a":1}`}, {"PUT", "application/json", `{"a":1}`}} {
		st, body, _ := f.sendState(c.method, migrated, c.ctype, c.body)
		var e apiError
		json.Unmarshal([]byte(body), &e)
		if st != http.StatusConflict || e.Error.Code != server.CodeActorMigrated || !strings.Contains(e.Error.Message, "host web-9") || strings.Contains(e.Error.Message, "/srv/") {
			t.Errorf("%s of a session migrated on web-9: %d %s; want 409 %s naming the host, without paths", c.method, st, body, server.CodeActorMigrated)
		}
	}

	newer := f.startSession("two").SessionID
	dir := filepath.Join(f.rt.StateRoot(), "actors", "session", newer)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sdb, err := sql.Open("sqlite", filepath.Join(dir, "system.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec(`CREATE TABLE meta (id INTEGER); PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	for _, c := range []struct{ method, ctype, body string }{{"GET", "", ""}, {"PATCH", mergePatch, `{"a":1}`}} {
		st, body, _ := f.sendState(c.method, newer, c.ctype, c.body)
		var e apiError
		json.Unmarshal([]byte(body), &e)
		if st != http.StatusInternalServerError || e.Error.Code != server.CodeNewerFormat || !strings.Contains(e.Error.Message, "upgrade agentkit") {
			t.Errorf("%s of an actor of a newer format: %d %s; want 500 %s saying to upgrade", c.method, st, body, server.CodeNewerFormat)
		}
	}
}

func TestSessionMessagesOverHTTP(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	first := f.startSession("one")
	body := fmt.Sprintf(`{"continuationToken":%q,"message":"two"}`, first.ContinuationToken)
	if st := f.do("POST", "/v1/sessions/continue", body, nil); st != http.StatusOK {
		t.Fatalf("continue: %d", st)
	}
	type page struct {
		Messages []tool.Record `json:"messages"`
		Next     int64         `json:"next"`
		More     bool          `json:"more"`
	}
	var all page
	if st := f.do("GET", "/v1/sessions/"+first.SessionID+"/messages", "", &all); st != http.StatusOK {
		t.Fatalf("messages: %d", st)
	}
	var texts []string
	for _, m := range all.Messages {
		var d struct{ Role, Content string }
		json.Unmarshal(m.Data, &d)
		if d.Role != m.Type || m.At.IsZero() {
			t.Fatalf("message %+v", m)
		}
		texts = append(texts, m.Type+":"+d.Content)
	}
	if strings.Join(texts, "|") != "user:one|assistant:echo: one|user:two|assistant:echo: two" || all.More || all.Next != all.Messages[3].Seq {
		t.Fatalf("messages %q, next %d, more %v", texts, all.Next, all.More)
	}
	// The seqs are the session's event seqs: the cursor works on both.
	var evs agent.EventPage
	f.do("GET", "/v1/sessions/"+first.SessionID+"/events", "", &evs)
	for _, m := range all.Messages {
		found := false
		for _, ev := range evs.Events {
			found = found || ev.Seq == m.Seq && (ev.Type == agent.EventTurnStarted || ev.Type == agent.EventModelCall)
		}
		if !found {
			t.Fatalf("message seq %d is not the seq of the event that holds it", m.Seq)
		}
	}
	// Paged two at a time.
	var p page
	f.do("GET", "/v1/sessions/"+first.SessionID+"/messages?limit=2", "", &p)
	if len(p.Messages) != 2 || !p.More || p.Next != all.Messages[1].Seq {
		t.Fatalf("first page of two: %+v", p)
	}
	f.do("GET", fmt.Sprintf("/v1/sessions/%s/messages?limit=2&after=%d", first.SessionID, p.Next), "", &p)
	if len(p.Messages) != 2 || p.More || p.Messages[0].Seq != all.Messages[2].Seq {
		t.Fatalf("second page of two: %+v", p)
	}
	f.do("GET", fmt.Sprintf("/v1/sessions/%s/messages?after=%d", first.SessionID, p.Next), "", &p)
	if len(p.Messages) != 0 || p.More || p.Next != all.Messages[3].Seq {
		t.Fatalf("after the last: %+v", p)
	}
	f.wantError("GET", "/v1/sessions/"+first.SessionID+"/messages?limit=1001", "", 400, server.CodeInvalid, "limit")
	f.wantError("GET", "/v1/sessions/"+first.SessionID+"/messages?after=-1", "", 400, server.CodeInvalid, "after")
	_ = time.Second
}
