package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writerYAML is an agent whose turns write a file named after the message
// with write_file, then answer.
const writerYAML = `name: writer
model:
  provider: echo
  script:
    - tool: write_file
      args: {path: "notes/{{.UserMessage}}.txt", content: "written by the model"}
    - text: "wrote {{.UserMessage}}"
`

// TestStateRootIsOwnerOnly serves a project, runs turns that write
// workspace files (per-send and through write_file), schedules a reminder,
// restarts, runs more, and walks the whole state root: every folder must
// be 0700 and every file 0600, so that continuation tokens, messages and
// the memory journal are the owner's alone. The walk covers whatever a
// later version adds under the root.
func TestStateRootIsOwnerOnly(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, writerYAML)
	root := filepath.Join(t.TempDir(), "state")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	var s turnResult
	if st := call(t, "POST", p.url+"/v1/sessions", "", `{"message":"one","workspaceFiles":{"deep/er/seed.txt":"sent with the request"}}`, &s); st != 201 || s.Turn.Result != "wrote one" {
		t.Fatalf("start: %d %+v", st, s)
	}
	if st := call(t, "POST", p.url+"/v1/reminders", "", fmt.Sprintf(`{"sessionId":%q,"delaySeconds":3600,"message":"later"}`, s.SessionID), nil); st != 201 {
		t.Fatalf("reminder: %d", st)
	}
	if st, _ := continueWith(t, p.url, "", s.ContinuationToken, "two"); st != 200 {
		t.Fatalf("continue: %d", st)
	}
	checkOwnerOnly(t, root) // while serving: the SQLite -wal and -shm files exist
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	p = startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	if st, _ := continueWith(t, p.url, "", s.ContinuationToken, "three"); st != 200 {
		t.Fatalf("continue after the restart: %d", st)
	}
	start(t, p.url, "", "four")
	checkOwnerOnly(t, root)
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	checkOwnerOnly(t, root)
}

// TestExistingStateRootIsTightened opens a state root made world-readable
// (as older versions made them): serve makes the root and its folders
// owner-only.
func TestExistingStateRootIsTightened(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: old\n")
	root := filepath.Join(t.TempDir(), "state")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	start(t, p.url, "", "hello")
	p.stop(syscall.SIGTERM)
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil {
			mode := os.FileMode(0o644)
			if d.IsDir() {
				mode = 0o755
			}
			os.Chmod(path, mode)
		}
		return nil
	})
	p = startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	start(t, p.url, "", "again")
	checkOwnerOnly(t, root)
}

// checkOwnerOnly walks root: folders 0700, files 0600, nothing else (a
// FIFO or socket left behind would be a finding too).
func checkOwnerOnly(t *testing.T, root string) {
	t.Helper()
	files, dirs := 0, 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking (a -shm at close)
			}
			return err
		}
		rel, _ := filepath.Rel(root, path)
		switch mode := info.Mode(); {
		case mode.IsDir():
			dirs++
			if mode.Perm() != 0o700 {
				t.Errorf("folder %s has mode %v; want drwx------", rel, mode)
			}
		case mode.IsRegular():
			files++
			if mode.Perm() != 0o600 {
				t.Errorf("file %s has mode %v; want -rw-------", rel, mode)
			}
		default:
			t.Errorf("%s is neither a file nor a folder: %v", rel, mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw the layout: a broken walk must not pass on nothing.
	if dirs < 8 || files < 5 {
		t.Fatalf("the walk saw %d folders and %d files under %s", dirs, files, root)
	}
}

// readerYAML is an agent whose turns read the file the message names.
const readerYAML = `name: reader
model:
  provider: echo
  script:
    - tool: read_file
      args: {path: "{{.UserMessage}}"}
    - text: "read: {{.LastToolResult}}"
`

// TestNamedPipeInTheWorkspaceNeitherWedgesTurnsNorShutdown plants a FIFO
// in a session's workspace and has the model read it. The turn must not
// hang on it, SIGTERM must end the process, the state root's lock must be
// released and a new server must serve the session.
func TestNamedPipeInTheWorkspaceNeitherWedgesTurnsNorShutdown(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, readerYAML)
	root := filepath.Join(t.TempDir(), "state")
	args := []string{"serve", "--addr", "127.0.0.1:0", "--state-root", root, "--shutdown-timeout", "1s"}
	p := startServe(t, dir, nil, args...)
	var s turnResult
	if st := call(t, "POST", p.url+"/v1/sessions", "", `{"message":"notes.txt","workspaceFiles":{"notes.txt":"hello"}}`, &s); st != 201 || s.Turn.Result != "read: hello" {
		t.Fatalf("start: %d %+v", st, s)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "workspaces", s.SessionID, "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status int
		res    turnResult
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		var a answer
		resp, err := http.Post(p.url+"/v1/sessions/continue", "application/json", strings.NewReader(fmt.Sprintf(`{"continuationToken":%q,"message":"pipe"}`, s.ContinuationToken)))
		if err == nil {
			a.status = resp.StatusCode
			a.err = json.NewDecoder(resp.Body).Decode(&a.res)
			resp.Body.Close()
		}
		if err != nil {
			a.err = err
		}
		answered <- a
	}()
	// Wait until the turn has called read_file on the pipe.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var page struct{ Events []struct{ Type, Tool string } }
		call(t, "GET", p.url+"/v1/sessions/"+s.SessionID+"/events?after=6", "", "", &page)
		if len(page.Events) >= 3 && page.Events[2].Type == "tool.call" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second turn did not call read_file: %+v", page.Events)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM", code)
	}
	var a answer
	select {
	case a = <-answered:
	case <-time.After(60 * time.Second):
		t.Fatal("the turn that read the pipe got no answer, though the server exited")
	}
	if a.err != nil || a.status != 200 || !strings.Contains(a.res.Turn.Result, "named pipe") {
		t.Fatalf("the turn that read the pipe: %d %+v, %v; want it answered with the tool's refusal", a.status, a.res, a.err)
	}
	p = startServe(t, dir, nil, args...)
	if st, r := continueWith(t, p.url, "", s.ContinuationToken, "notes.txt"); st != 200 || r.Turn.Result != "read: hello" {
		t.Fatalf("continue after the restart: %d %+v", st, r)
	}
}

// TestIdempotencyKeyAcrossAKill sends keyed requests to a server, kills it
// (SIGKILL) in the middle of a keyed turn, and retries both on a new
// server over the same state root: the finished turn's answer comes back
// as it was, the interrupted turn is reported failed, and neither runs
// again.
func TestIdempotencyKeyAcrossAKill(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, slowYAML)
	root := filepath.Join(t.TempDir(), "state")
	args := []string{"serve", "--addr", "127.0.0.1:0", "--state-root", root}
	p := startServe(t, dir, nil, args...)
	post := func(base, path, body, key string) (int, string) {
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
	st1, first := post(p.url, "/v1/sessions", `{"message":"one"}`, "key-one")
	var s turnResult
	if err := json.Unmarshal([]byte(first), &s); err != nil || st1 != 201 {
		t.Fatalf("start: %d %s", st1, first)
	}
	cont := fmt.Sprintf(`{"continuationToken":%q,"message":"two"}`, s.ContinuationToken)
	go func() {
		req, _ := http.NewRequest("POST", p.url+"/v1/sessions/continue", strings.NewReader(cont))
		req.Header.Set("Idempotency-Key", "key-two")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	// Kill the server while the second turn waits in its three-second step.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var page struct{ Events []struct{ Type string } }
		call(t, "GET", p.url+"/v1/sessions/"+s.SessionID+"/events?after=6", "", "", &page)
		if len(page.Events) >= 4 && page.Events[3].Type == "tool.result" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second turn did not reach its slow step: %+v", page.Events)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop(syscall.SIGKILL)

	p = startServe(t, dir, nil, args...)
	// The replayed start is the first answer but for its token: a new
	// token of the same session (only the first token's digest is stored).
	if st, again := post(p.url, "/v1/sessions", `{"message":"one"}`, "key-one"); st != 201 || withoutToken(again) != withoutToken(first) {
		t.Fatalf("the retried start after the kill: %d %s; want %s", st, again, first)
	}
	st, again := post(p.url, "/v1/sessions/continue", cont, "key-two")
	var r turnResult
	json.Unmarshal([]byte(again), &r)
	if st != 200 || r.SessionID != s.SessionID || r.Turn.Status != "failed" || !strings.Contains(r.Turn.Result, "interrupted") {
		t.Fatalf("the retried interrupted turn: %d %s; want 200, failed, saying it was interrupted", st, again)
	}
	var got struct{ Session sessionMeta }
	call(t, "GET", p.url+"/v1/sessions/"+s.SessionID, "", "", &got)
	if got.Session.Turns != 2 {
		t.Fatalf("the session has %d turns; want 2 (no retry ran a turn)", got.Session.Turns)
	}
}

// TestDeleteLeavesNoTrace deletes a session from a running server and
// searches every file under the state root (the memory journal, the
// SQLite databases and their write-ahead logs) for its message, answer
// and continuation token: a deleted session must not stay readable, by
// the other sessions' model through memory/ or by anyone reading the
// files.
func TestDeleteLeavesNoTrace(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: forgetful\n")
	root := filepath.Join(t.TempDir(), "state")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	secret := "secret-" + strings.Repeat("x", 8) + fmt.Sprint(time.Now().UnixNano())
	s := start(t, p.url, "", secret+" first")
	continueWith(t, p.url, "", s.ContinuationToken, secret+" second")
	kept := start(t, p.url, "", "kept-session")
	deleted := false
	traces := func() []string {
		var found []string
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(root, path)
			needles := []string{secret, s.ContinuationToken, s.SessionID}
			if strings.HasPrefix(rel, filepath.Join("sessions", "sessions.db")) && deleted {
				// The session database holds the embedded store, which
				// keeps the session's tombstone head, under a key that
				// names the session (so no host brings it back).
				needles = needles[:2]
			}
			for _, needle := range needles {
				if bytes.Contains(b, []byte(needle)) {
					found = append(found, rel+" holds "+needle[:min(len(needle), 16)]+"…")
				}
			}
			return nil
		})
		return found
	}
	if len(traces()) == 0 {
		t.Fatal("no trace of the session before the delete: the search is broken")
	}
	if st := call(t, "DELETE", p.url+"/v1/sessions/"+s.SessionID, "", "", nil); st != 204 {
		t.Fatalf("DELETE: %d", st)
	}
	deleted = true
	if found := traces(); len(found) > 0 {
		t.Fatalf("after the delete, with the server running: %s", strings.Join(found, "; "))
	}
	journal, _ := os.ReadFile(filepath.Join(root, "memory", "journal.jsonl"))
	if !strings.Contains(string(journal), kept.SessionID) {
		t.Fatalf("the other session's record left the journal: %q", journal)
	}
	p.stop(syscall.SIGTERM)
	if found := traces(); len(found) > 0 {
		t.Fatalf("after the delete and a stop: %s", strings.Join(found, "; "))
	}
}

// TestSmallerCLIRefusals: version -h has no empty Flags section; the
// refusal of ledger mode over the embedded store names no internal document; a short auth token is
// refused off loopback.
func TestSmallerCLIRefusals(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: small\n")
	r := run(t, dir, nil, "", "version", "-h")
	if r.code != 0 || strings.Contains(r.stdout, "Flags") || !strings.Contains(r.stdout, "Usage: agentkit version") {
		t.Errorf("version -h: exit %d, stdout %q; want the usage without an empty Flags section", r.code, r.stdout)
	}
	if r := run(t, dir, nil, "", "serve", "-h"); r.code != 0 || !strings.Contains(r.stdout, "Flags") || !strings.Contains(r.stdout, "-turn-timeout") {
		t.Errorf("serve -h: exit %d, stdout %q; want its flags, --turn-timeout among them", r.code, r.stdout)
	}
	// Over the memory driver ledger mode is refused at start-up, saying why.
	if r := run(t, dir, nil, "", "serve", "--addr", "127.0.0.1:0", "--serving", "ledger", "--storage", "mem:"); r.code == 0 || !strings.Contains(r.stderr, "memory driver") || !strings.Contains(r.stderr, "shared durable store") {
		t.Errorf("serve --serving ledger --storage mem:: exit %d, stderr %q; want a refusal naming the memory driver", r.code, r.stderr)
	}
	ledger := writeProject(t, "name: small\nserving: ledger\n")
	for _, c := range []struct {
		dir  string
		args []string
	}{
		{dir, []string{"serve", "--addr", "127.0.0.1:0", "--serving", "ledger"}},
		{ledger, []string{"serve", "--addr", "127.0.0.1:0"}},
	} {
		r := run(t, c.dir, nil, "", c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, "shared store") || !strings.Contains(r.stderr, "storage:") {
			t.Errorf("agentkit %v: exit %d, stderr %q; want exit 2 saying ledger mode needs a shared store and to set storage:", c.args, r.code, r.stderr)
		}
		for _, internal := range []string{".md", "spec", "issue"} {
			if strings.Contains(r.stderr, internal) {
				t.Errorf("agentkit %v: the refusal %q names an internal document (%q)", c.args, r.stderr, internal)
			}
		}
	}
	r = runWithin(t, 30*time.Second, dir, "serve", "--addr", "0.0.0.0:0", "--auth-token", "short-token", "--state-root", t.TempDir())
	if r.code != 2 || !strings.Contains(r.stderr, "--auth-token") || !strings.Contains(r.stderr, "16") {
		t.Errorf("serve with a short token on 0.0.0.0: exit %d, stderr %q; want exit 2 naming --auth-token and the 16-byte minimum", r.code, r.stderr)
	}
	for _, flag := range []string{"--turn-timeout", "--tool-timeout"} {
		if r := run(t, dir, nil, "", "serve", flag, "-1s"); r.code != 2 || !strings.Contains(r.stderr, flag) {
			t.Errorf("serve %s -1s: exit %d, stderr %q", flag, r.code, r.stderr)
		}
	}
}

// TestInitGoOutsideTheSourceTree runs init --go with the built binary
// (which lives outside the checkout) in a folder outside the checkout:
// the project must build offline, from the module cache.
func TestInitGoOutsideTheSourceTree(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	if r := run(t, parent, nil, "", "init", "--go", "outside"); r.code != 0 {
		t.Fatalf("init --go: exit %d, stderr %q", r.code, r.stderr)
	}
	dir := filepath.Join(parent, "outside")
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "outside"), ".")
	build.Dir = dir
	build.Env = append(cleanEnv(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
		t.Fatalf("go build of an init --go project made outside the checkout: %v\n%s\ngo.mod:\n%s", err, out, gomod)
	}
	// --source names the checkout explicitly; a folder that is not one is
	// refused before anything is written.
	repo, _ := filepath.Abs("../..")
	if r := run(t, parent, nil, "", "init", "--go", "--source", repo, "explicit"); r.code != 0 {
		t.Fatalf("init --go --source: exit %d, stderr %q", r.code, r.stderr)
	}
	r := run(t, parent, nil, "", "init", "--go", "--source", parent, "wrong")
	if r.code != 2 || !strings.Contains(r.stderr, "--source") {
		t.Fatalf("init --go --source with a folder that is not agentkit: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(parent, "wrong")); err == nil {
		t.Fatal("the refused init wrote the project folder")
	}
}

// runWithin runs the built binary like run, killing it after d: for
// commands that must refuse at once and would otherwise serve forever.
func runWithin(t *testing.T, d time.Duration, dir string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentkitBin, args...)
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("agentkit %v was still running after %v; want it to refuse at once", args, d)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running agentkit %v: %v", args, err)
	}
	return result{out.String(), errb.String(), code}
}

// withoutToken is an answer's body with its continuation token blanked.
func withoutToken(body string) string {
	return regexp.MustCompile(`"continuationToken":"[^"]*"`).ReplaceAllString(body, `"continuationToken":""`)
}
