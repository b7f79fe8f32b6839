package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// evalRun is the part of a run snapshot the tests read.
type evalRun struct {
	RunID  string `json:"runId"`
	Status string `json:"status"`
	Name   string `json:"name"`
	Error  string `json:"error"`
	Host   struct {
		ID        string `json:"id"`
		StateRoot string `json:"stateRoot"`
		PID       int    `json:"pid"`
	} `json:"host"`
	Counts struct {
		Total, Done, Passed, Failed, Errored int
	} `json:"counts"`
	Cases []struct {
		Name, Status, SessionID, Answer, Error string
	} `json:"cases"`
}

// initProject runs agentkit init NAME in a new folder and returns the
// project folder.
func initProject(t *testing.T, name string) string {
	t.Helper()
	parent := t.TempDir()
	if r := run(t, parent, nil, "", "init", name); r.code != 0 {
		t.Fatalf("init: exit %d %s", r.code, r.stderr)
	}
	return filepath.Join(parent, name)
}

func TestEvalOfTheInitProjectPasses(t *testing.T) {
	t.Parallel()
	dir := initProject(t, "evaldemo")
	tmp := t.TempDir()
	r := run(t, dir, []string{"TMPDIR=" + tmp}, "", "eval", "cases.jsonl")
	if r.code != 0 {
		t.Fatalf("eval cases.jsonl: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	// Not a terminal: one plain line per case, then the table.
	for _, name := range []string{"echoes-the-message", "keeps-non-ascii-text", "answers-with-the-echo-prefix"} {
		if !regexp.MustCompile(`(?m)^\[\d/3\] passed +` + name + ` \(\d+ ms\)$`).MatchString(r.stdout) {
			t.Errorf("no progress line for %s in:\n%s", name, r.stdout)
		}
		if !regexp.MustCompile(`(?m)^` + name + ` +passed +\d+ ms +\d+\+\d+`).MatchString(r.stdout) {
			t.Errorf("no summary row for %s in:\n%s", name, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, "3 cases: 3 passed, 0 failed, 0 errored (pass rate 100.0%)") || strings.Contains(r.stdout, "\x1b[") {
		t.Errorf("summary:\n%q", r.stdout)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("the temporary state root was left behind: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(dir, ".agentkit")); !os.IsNotExist(err) {
		t.Errorf("eval wrote into the project's state root (%v); without --state-root it uses a fresh one", err)
	}

	r = run(t, dir, nil, "", "eval", "--json", "cases.jsonl")
	var got evalRun
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil {
		t.Fatalf("eval --json: exit %d stdout %q", r.code, r.stdout)
	}
	if got.Status != "finished" || got.Counts.Passed != 3 || got.Name != "cases.jsonl" || len(got.Cases) != 3 || got.Cases[0].SessionID == "" {
		t.Errorf("eval --json = %+v", got)
	}
}

func TestEvalExitsOneWhenACaseDoesNotPass(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: failing\nmodel: echo\n")
	cases := `{"name": "ok", "input": "hi", "expect": {"exact": "echo: hi"}}
{"name": "wrong", "input": "hi", "expect": {"contains": "goodbye"}}
`
	os.WriteFile(filepath.Join(dir, "cases.jsonl"), []byte(cases), 0o644)
	r := run(t, dir, nil, "", "eval", "cases.jsonl")
	if r.code != 1 || !strings.Contains(r.stderr, "1 of 2 cases did not pass (1 failed, 0 errored)") {
		t.Fatalf("eval with a failing case: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	if !regexp.MustCompile(`(?m)^wrong +failed .*contains: the answer "echo: hi" does not contain "goodbye"`).MatchString(r.stdout) {
		t.Errorf("the table does not say why the case failed:\n%s", r.stdout)
	}
}

func TestEvalRefusesABadCasesFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cases.jsonl"), []byte(`{"name": "a", "input": "x"}`+"\n"+`{"name": "b", "input": "y", "expect": {"regex": "y"}}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "empty.jsonl"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "typed.jsonl"), []byte(`{"name": "a", "input": "x", "expect": "x"}`+"\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"eval", "cases.jsonl"}, `cases.jsonl:2: not a case: unknown field "regex"`},
		{[]string{"eval"}, "eval needs a cases file"},
		{[]string{"eval", "missing.jsonl"}, "missing.jsonl does not exist"},
		{[]string{"eval", "--concurrency", "0", "cases.jsonl"}, "--concurrency 0: use 1 to 64"},
		{[]string{"eval", "empty.jsonl"}, "agentkit: empty.jsonl: no cases: it is empty; write one JSON object per line, such as {"},
		{[]string{"eval", "typed.jsonl"}, "agentkit: typed.jsonl:1: not a case: expect: expected an object, found a JSON string\n"},
	} {
		r := run(t, dir, nil, "", c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agentkit %v: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

func TestEvalIgnoresTheProjectsStoreUnlessTold(t *testing.T) {
	t.Parallel()
	prod := filepath.Join(t.TempDir(), "production.db")
	dir := writeProject(t, "name: careful\nstorage: sqlite:"+prod+"\n")
	os.WriteFile(filepath.Join(dir, "cases.jsonl"), []byte(`{"name": "a", "input": "x"}`+"\n"), 0o644)
	if r := run(t, dir, nil, "", "eval", "cases.jsonl"); r.code != 0 {
		t.Fatalf("eval: %d %s", r.code, r.stderr)
	}
	if _, err := os.Stat(prod); !os.IsNotExist(err) {
		t.Errorf("eval touched the project's store %s (%v); it must use a fresh embedded store unless --storage names one", prod, err)
	}
}

func TestEvalWithAStateRootIsListedByServe(t *testing.T) {
	t.Parallel()
	dir := initProject(t, "kept")
	root := filepath.Join(dir, ".agentkit")
	r := run(t, dir, nil, "", "eval", "--state-root", root, "cases.jsonl")
	if r.code != 0 {
		t.Fatalf("eval --state-root: %d %s", r.code, r.stderr)
	}
	p := startServe(t, dir, nil, "dev", "--addr", "127.0.0.1:0")
	var list struct{ Runs []evalRun }
	if st := call(t, "GET", p.url+"/v1/evals", "", "", &list); st != 200 || len(list.Runs) != 1 || list.Runs[0].Counts.Passed != 3 || list.Runs[0].Status != "finished" {
		t.Fatalf("GET /v1/evals after agentkit eval --state-root: %d %+v", st, list)
	}
	// The eval's sessions are there too, on channel eval.
	var page struct{ Sessions []struct{ ChannelID string } }
	call(t, "GET", p.url+"/v1/sessions", "", "", &page)
	if len(page.Sessions) != 3 || page.Sessions[0].ChannelID != "eval" {
		t.Errorf("sessions %+v", page.Sessions)
	}
}

func TestEvalShowsAProgressBarOnATerminal(t *testing.T) {
	t.Parallel()
	dir := initProject(t, "tty")
	cmd := exec.Command(agentkitBin, "eval", "--concurrency", "1", "cases.jsonl")
	cmd.Dir = dir
	cmd.Env = cleanEnv()
	f, err := pty.Start(cmd)
	if err != nil {
		t.Fatalf("starting agentkit on a pseudo-terminal: %v", err)
	}
	defer f.Close()
	var out bytes.Buffer
	io.Copy(&out, f) // until the process exits and the pty closes (EIO)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("eval on a terminal: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"\r\x1b[2K[----------", // drawn in place
		"] 1/3  passed 1  failed 0  errored 0",
		"\r\x1b[2K[##############################] 3/3  passed 3  failed 0  errored 0",
		"3 cases: 3 passed",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the terminal output lacks %q:\n%q", want, s)
		}
	}
	if strings.Contains(s, "[1/3] passed") {
		t.Errorf("plain progress lines on a terminal:\n%q", s)
	}
}

// slowEvalYAML is an agent whose every turn takes two seconds.
const slowEvalYAML = `name: slowevals
model:
  provider: echo
  script:
    - text: "done: {{.UserMessage}}"
      delay: 2s
evals:
  heartbeat: 1s
`

func TestARunWhoseServerWasKilledIsInterruptedAtTheNextStart(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, slowEvalYAML)
	root := filepath.Join(t.TempDir(), "state")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	var cases []string
	for i := range 6 {
		cases = append(cases, fmt.Sprintf(`{"name": "c%d", "input": "m%d"}`, i, i))
	}
	var run evalRun
	if st := call(t, "POST", p.url+"/v1/evals", "", `{"concurrency": 1, "cases": [`+strings.Join(cases, ",")+`]}`, &run); st != 202 {
		t.Fatalf("POST /v1/evals: %d", st)
	}
	// Wait until a case is done and stored, then kill the server.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var got evalRun
		call(t, "GET", p.url+"/v1/evals/"+run.RunID, "", "", &got)
		if got.Counts.Done >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no case finished within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := p.cmd.Process.Pid
	if code := p.stop(syscall.SIGKILL); code != -1 && code != 137 {
		t.Logf("exit code after SIGKILL: %d", code)
	}

	p2 := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	var got evalRun
	if st := call(t, "GET", p2.url+"/v1/evals/"+run.RunID, "", "", &got); st != 200 {
		t.Fatalf("GET the run after the restart: %d", st)
	}
	if got.Status != "interrupted" || !strings.Contains(got.Error, fmt.Sprintf("its process (pid %d) stopped while it ran", pid)) || got.Counts.Done < 1 || got.Counts.Done == 6 {
		t.Errorf("after a SIGKILL and a restart the run is %s (%q) with %d done; want interrupted at once, naming the dead process", got.Status, got.Error, got.Counts.Done)
	}
	if !strings.Contains(p2.stderr.String(), `"interrupted":1`) {
		t.Errorf("the start-up log does not report the interrupted run:\n%s", tail(p2.stderr.String(), 2000))
	}
	var list struct{ Runs []evalRun }
	call(t, "GET", p2.url+"/v1/evals", "", "", &list)
	if len(list.Runs) != 1 || list.Runs[0].Status != "interrupted" {
		t.Errorf("GET /v1/evals after the restart: %+v", list.Runs)
	}
}

// abYAML is a project with one experiment: variant "loud" answers through
// its own echo reply.
const abYAML = `name: abdemo
model: echo
experiments:
  - name: tone
    variants:
      - {name: plain, weight: 1}
      - name: loud
        weight: 1
        model: {provider: echo, reply: "LOUD: {{.UserMessage}}"}
`

type abReport struct {
	Experiments []struct {
		Name     string
		Variants []struct {
			Name                   string
			Sessions, Turns, P50Ms int64
			FailureRate            float64
			MeanTokensPerTurn      float64
		}
		Comparisons []struct {
			Variant, Method string
			Defined         bool
		}
	}
	Hosts []struct {
		ID       string
		Sessions int
		Self     bool
	}
	SnapshotError string
}

func TestAReplacementHostServesEveryHostsABFigures(t *testing.T) {
	t.Parallel()
	store, _ := postgresURL(t)
	dir := writeProject(t, abYAML)
	env := []string{"AGENTKIT_STORAGE=" + store}
	a := startServe(t, dir, env, "serve", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "a"))
	b := startServe(t, dir, env, "serve", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "b"))
	want := map[string]int64{}
	for i, p := range []*proc{a, b, a, b, a, b, a} {
		r := start(t, p.url, "", fmt.Sprintf("message %d", i))
		variant := "plain"
		if strings.HasPrefix(r.Turn.Result, "LOUD: ") {
			variant = "loud"
		}
		want[variant]++
		// A second turn on some sessions.
		if i%2 == 0 {
			if st, _ := continueWith(t, p.url, "", r.ContinuationToken, "again"); st != 200 {
				t.Fatalf("continue: %d", st)
			}
			want[variant+"-turns"]++
		}
	}
	// Both hosts stop (each writes its state into the shared snapshot).
	for _, p := range []*proc{a, b} {
		if code := p.stop(syscall.SIGTERM); code != 0 {
			t.Fatalf("serve exited %d", code)
		}
	}
	// A replacement host with an empty state root on the same store, which
	// restores no session: its figures come from the snapshot alone.
	cdir := writeProject(t, abYAML+"policy:\n  restore: off\n")
	c := startServe(t, cdir, env, "serve", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "c"))
	if got := listSessions(t, c.url, ""); len(got) != 0 {
		t.Fatalf("the replacement holds %d sessions; it must start with none", len(got))
	}
	var rep abReport
	if st := call(t, "GET", c.url+"/v1/abs", "", "", &rep); st != http.StatusOK || len(rep.Experiments) != 1 || rep.SnapshotError != "" {
		t.Fatalf("GET /v1/abs on the replacement: %d %+v", st, rep)
	}
	total := int64(0)
	for _, v := range rep.Experiments[0].Variants {
		total += v.Sessions
		if v.Sessions != want[v.Name] || v.Turns != want[v.Name]+want[v.Name+"-turns"] {
			t.Errorf("variant %s: %d sessions, %d turns; the hosts ran %d and %d", v.Name, v.Sessions, v.Turns, want[v.Name], want[v.Name]+want[v.Name+"-turns"])
		}
	}
	if total != 7 {
		t.Errorf("the replacement reports %d sessions, want the 7 both hosts ran", total)
	}
	hosts := 0
	for _, h := range rep.Hosts {
		if !h.Self {
			hosts++
		}
	}
	if hosts != 2 {
		t.Errorf("hosts %+v: want both stopped hosts in the snapshot", rep.Hosts)
	}
}
