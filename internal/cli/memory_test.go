package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recallYAML is an agent whose every turn reads the memory journal with the
// ordinary read_file tool and answers with what it found: the model reaches
// memory through its workspace, with no recall tool.
const recallYAML = `name: recall
model:
  provider: echo
  script:
    - tool: read_file
      args: {path: memory/journal.jsonl}
    - text: "from memory: {{.LastToolResult}}"
`

// TestMemoryReachesAnotherSession: session A says something distinctive;
// session B, on the same server, answers with it by reading memory/ with
// its file tools. Then the reserved path is defended over HTTP, and the
// journal keeps one record per turn.
func TestMemoryReachesAnotherSession(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, recallYAML)
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")

	const secret = "the courier's password is PERIWINKLE-4417"
	a := start(t, p.url, "", secret)
	b := start(t, p.url, "", "what did anyone tell you before?")
	if a.SessionID == b.SessionID {
		t.Fatal("the two turns shared a session")
	}
	if !strings.Contains(b.Turn.Result, "PERIWINKLE-4417") || !strings.Contains(b.Turn.Result, a.SessionID) {
		t.Fatalf("session B answered %q; want session A's message (and id) read from memory/journal.jsonl", b.Turn.Result)
	}

	var e apiError
	st := call(t, "POST", p.url+"/v1/sessions", "", `{"message":"x","workspaceFiles":{"memory/journal.jsonl":"forged"}}`, &e)
	if st != 400 || !strings.Contains(e.Error.Message, "memory/journal.jsonl") {
		t.Fatalf("a per-send file under memory/: status %d, error %+v; want 400 naming the path", st, e)
	}

	journal, err := os.ReadFile(filepath.Join(dir, ".agentkit", "memory", "journal.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(journal), "\n"), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"userMessage":"the courier's password is PERIWINKLE-4417"`) || strings.Contains(string(journal), "forged") {
		t.Fatalf("journal holds %d lines:\n%s\nwant one record per completed turn and nothing from the refused request", len(lines), journal)
	}
}

// TestMemoryOffWritesNothing: with memory: false, turns leave no journal.
func TestMemoryOffWritesNothing(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: quiet\nmemory: false\n")
	root := filepath.Join(t.TempDir(), "state")
	if r := run(t, dir, nil, "", "run", "--state-root", root, "hello"); r.code != 0 {
		t.Fatalf("run: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(root, "memory", "journal.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("memory: false still wrote a journal (stat: %v)", err)
	}
}

// TestSeedUnderMemoryRefusedAtStart: a project whose workspace/ seed folder
// has memory/ in it does not start.
func TestSeedUnderMemoryRefusedAtStart(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: seeded\n")
	if err := os.MkdirAll(filepath.Join(dir, "workspace", "memory"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "workspace", "memory", "journal.jsonl"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, dir, nil, "", "serve", "--addr", "127.0.0.1:0")
	if r.code != 2 || !strings.Contains(r.stderr, "memory") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Fatalf("serve with workspace/memory/: exit %d, stderr %q; want exit 2 and one line naming memory", r.code, r.stderr)
	}
}
