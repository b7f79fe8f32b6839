package cli_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestStoragedCredentialsCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	add := run(t, dir, nil, "", "storaged", "credentials", "add", "acme-prod", "--credentials", creds)
	token := strings.TrimSpace(add.stdout)
	if add.code != 0 || !strings.HasPrefix(token, "akst_") || strings.Count(add.stdout, "\n") != 1 || strings.Contains(add.stderr, token) {
		t.Fatalf("credentials add: exit %d, stdout %q, stderr %q; want the token alone on stdout", add.code, add.stdout, add.stderr)
	}
	again := run(t, dir, nil, "", "storaged", "credentials", "add", "acme-prod", "--credentials", creds)
	if again.code != 2 || !strings.Contains(again.stderr, "--rotate") {
		t.Fatalf("a second add without --rotate: exit %d, stderr %q", again.code, again.stderr)
	}
	rot := run(t, dir, nil, "", "storaged", "credentials", "add", "acme-prod", "--rotate", "--credentials", creds)
	if rot.code != 0 || strings.TrimSpace(rot.stdout) == token {
		t.Fatalf("add --rotate: exit %d, %q", rot.code, rot.stdout)
	}
	ls := run(t, dir, nil, "", "storaged", "credentials", "ls", "--credentials", creds)
	lines := strings.Split(strings.TrimSpace(ls.stdout), "\n")
	if ls.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || strings.Contains(ls.stdout, "akst_") {
		t.Fatalf("credentials ls: exit %d\n%s", ls.code, ls.stdout)
	}
	id := strings.Fields(lines[1])[0]
	rm := run(t, dir, nil, "", "storaged", "credentials", "rm", id, "--credentials", creds)
	if rm.code != 0 || !strings.Contains(rm.stdout, id) {
		t.Fatalf("credentials rm: exit %d, %q %q", rm.code, rm.stdout, rm.stderr)
	}
	if r := run(t, dir, nil, "", "storaged", "credentials", "rm", id, "--credentials", creds); r.code != 1 || !strings.Contains(r.stderr, "no credential") {
		t.Fatalf("removing it again: exit %d, %q", r.code, r.stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"storaged", "credentials", "add", "Not_Valid", "--credentials", creds}, "lower-case"},
		{[]string{"storaged", "credentials", "add", "x"}, "--credentials"},
		{[]string{"storaged", "--credentials", creds}, "--backend"},
		{[]string{"storaged", "--backend", "nosuch://127.0.0.1:6379", "--credentials", creds}, "nosuch"},
		{[]string{"storaged", "--backend", "agentkit+http://127.0.0.1:1/x", "--credentials", creds}, "another storaged"},
		{[]string{"storaged", "--backend", "sqlite:" + filepath.Join(dir, "x.db"), "--credentials", filepath.Join(dir, "none.json")}, "credentials add"},
	} {
		if r := run(t, dir, nil, "", c.args...); r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agentkit %v: exit %d, stderr %q; want exit 2 naming %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// TestServeThroughStoraged runs the getting-started path with built
// binaries: storaged on SQLite, a credential, agentkit serve with
// --storage agentkit+http://…; a session started on one host continues on
// a fresh host (an empty state root) after both storaged and the first
// server restarted.
func TestServeThroughStoraged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	add := run(t, dir, nil, "", "storaged", "credentials", "add", "support-prod", "--credentials", creds)
	if add.code != 0 {
		t.Fatalf("credentials add: %d %s", add.code, add.stderr)
	}
	token := strings.TrimSpace(add.stdout)
	storagedArgs := []string{"storaged", "--backend", "sqlite:" + filepath.Join(dir, "hosted.db"), "--credentials", creds, "--addr", "127.0.0.1:0", "--log-level", "debug"}
	sd := startServing(t, agentkitBin, dir, nil, storagedArgs...)
	storage := "agentkit+http://" + token + "@" + strings.TrimPrefix(sd.url, "http://") + "/support-prod"

	project := writeProject(t, "name: support\n")
	a := startServe(t, project, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", t.TempDir(), "--storage", storage)
	s := start(t, a.url, "", "hello through storaged")
	if s.Turn.Result != "echo: hello through storaged" {
		t.Fatalf("the turn answered %q", s.Turn.Result)
	}
	// The hosted store brings its native eval and A/B tables.
	var info struct {
		Storage struct {
			Evals, ABs, ABSnapshot string
		}
	}
	call(t, "GET", a.url+"/v1/info", "", "", &info)
	if info.Storage.Evals != "native" || info.Storage.ABs != "native" || info.Storage.ABSnapshot != "native" {
		t.Fatalf("through storaged, /v1/info reports evals %q, abs %q, abSnapshot %q; want native tables", info.Storage.Evals, info.Storage.ABs, info.Storage.ABSnapshot)
	}
	if code := a.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	if code := sd.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("storaged exited %d after SIGTERM", code)
	}
	if strings.Contains(sd.stderr.String(), token) || strings.Contains(sd.stderr.String(), "hello through storaged") {
		t.Fatal("storaged's logs hold the token or a message")
	}
	if !strings.Contains(sd.stderr.String(), `"namespace":"support-prod"`) {
		t.Fatalf("storaged's debug logs have no request lines:\n%s", tail(sd.stderr.String(), 2000))
	}

	// storaged comes back on another port; a new host with an empty state
	// root continues the session from what storaged keeps.
	sd2 := startServing(t, agentkitBin, dir, nil, storagedArgs...)
	storage2 := "agentkit+http://" + token + "@" + strings.TrimPrefix(sd2.url, "http://") + "/support-prod"
	rootB := t.TempDir()
	b := startServe(t, project, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", rootB, "--storage", storage2)
	st, c := continueWith(t, b.url, "", s.ContinuationToken, "and on a new host")
	if st != http.StatusOK || c.SessionID != s.SessionID || c.Turn.Result != "echo: and on a new host" {
		t.Fatalf("continue on the new host: %d %+v", st, c)
	}
	if list := listSessions(t, b.url, ""); len(list) != 1 || list[0].Turns != 2 {
		t.Fatalf("the new host lists %+v", list)
	}
	// The memory journal followed the deployment: the new host's journal
	// holds the first host's turn, which its own disk never saw.
	journal, err := os.ReadFile(filepath.Join(rootB, "memory", "journal.jsonl"))
	if err != nil || !strings.Contains(string(journal), "hello through storaged") {
		t.Fatalf("the new host's memory journal lacks the first host's turn (err %v):\n%s", err, journal)
	}
	// A wrong token fails at start, naming what to fix.
	bad := run(t, project, nil, "", "serve", "--addr", "127.0.0.1:0", "--state-root", t.TempDir(),
		"--storage", "agentkit+http://akst_aaaaaaaa_"+strings.Repeat("b", 52)+"@"+strings.TrimPrefix(sd2.url, "http://")+"/support-prod")
	if bad.code == 0 || !strings.Contains(bad.stderr, "401") || strings.Contains(bad.stderr, "akst_aaaaaaaa") {
		t.Fatalf("serve with a wrong token: exit %d, stderr %q", bad.code, bad.stderr)
	}
}
