package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentkit/tool"
)

// fixture is a workspace folder, a memory folder beside it, and the tools.
type fixture struct {
	dir, memDir string
	env         *tool.Env
	tools       map[string]tool.Tool
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	base := t.TempDir()
	f := &fixture{dir: filepath.Join(base, "ws"), memDir: filepath.Join(base, "state", "memory")}
	mustMkdir(t, f.dir)
	root, err := os.OpenRoot(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	f.env = &tool.Env{SessionID: "s1", Workspace: root}
	if opts.MemoryDir == "mount" {
		opts.MemoryDir = f.memDir
	}
	f.tools = map[string]tool.Tool{}
	for _, tl := range Tools(opts) {
		f.tools[tl.Spec.Name] = tl
	}
	return f
}

func (f *fixture) call(t *testing.T, name string, args any) (string, error) {
	t.Helper()
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	tl, ok := f.tools[name]
	if !ok {
		t.Fatalf("no tool %s", name)
	}
	return tl.Run(context.Background(), f.env, raw)
}

func (f *fixture) mustCall(t *testing.T, name string, args any) string {
	t.Helper()
	out, err := f.call(t, name, args)
	if err != nil {
		t.Fatalf("%s(%v): %v", name, args, err)
	}
	return out
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	mustMkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", err, p)
		}
	}
}

func TestToolSpecs(t *testing.T) {
	got := map[string]bool{}
	for _, tl := range Tools(Options{}) {
		var schema map[string]any
		if err := json.Unmarshal(tl.Spec.Parameters, &schema); err != nil || schema["type"] != "object" {
			t.Errorf("%s: parameters %s are not an object schema (%v)", tl.Spec.Name, tl.Spec.Parameters, err)
		}
		if tl.Spec.Description == "" || tl.Run == nil {
			t.Errorf("%s: no description or no Run", tl.Spec.Name)
		}
		got[tl.Spec.Name] = true
	}
	for _, n := range []string{ListFiles, ReadFile, WriteFile, SearchFiles} {
		if !got[n] {
			t.Errorf("tool %s missing", n)
		}
	}
}

func TestListFiles(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"})
	writeFile(t, filepath.Join(f.dir, "a.txt"), "12345")
	writeFile(t, filepath.Join(f.dir, "dir", "b.txt"), "b")
	writeFile(t, filepath.Join(f.dir, "dir", "sub", "c.txt"), "cc")
	writeFile(t, filepath.Join(f.dir, "dir.txt"), "")
	writeFile(t, filepath.Join(f.dir, "memory", "shadowed.txt"), "hidden by the mount")
	writeFile(t, filepath.Join(f.memDir, "journal.jsonl"), "{}\n")

	if got, want := f.mustCall(t, ListFiles, map[string]any{}), "a.txt (5 bytes)\ndir/\ndir.txt (0 bytes)\nmemory/\n"; got != want {
		t.Errorf("list . =\n%s\nwant\n%s", got, want)
	}
	want := "a.txt (5 bytes)\ndir/\ndir/b.txt (1 bytes)\ndir/sub/\ndir/sub/c.txt (2 bytes)\ndir.txt (0 bytes)\nmemory/\nmemory/journal.jsonl (3 bytes)\n"
	if got := f.mustCall(t, ListFiles, map[string]any{"path": ".", "recursive": true}); got != want {
		t.Errorf("list -r . =\n%s\nwant\n%s", got, want)
	}
	if got, want := f.mustCall(t, ListFiles, map[string]any{"path": "dir"}), "dir/b.txt (1 bytes)\ndir/sub/\n"; got != want {
		t.Errorf("list dir = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, ListFiles, map[string]any{"path": "memory"}), "memory/journal.jsonl (3 bytes)\n"; got != want {
		t.Errorf("list memory = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, ListFiles, map[string]any{"path": "./dir/sub/c.txt"}), "dir/sub/c.txt (2 bytes)\n"; got != want {
		t.Errorf("list of a file = %q, want %q", got, want)
	}
	_, err := f.call(t, ListFiles, map[string]any{"path": "nope"})
	wantErr(t, err, "nope does not exist")
	_, err = f.call(t, ListFiles, map[string]any{"path": "memory/shadowed.txt"})
	wantErr(t, err, "does not exist")
}

func TestListFilesBounded(t *testing.T) {
	f := newFixture(t, Options{MaxEntries: 5})
	for i := range 12 {
		writeFile(t, filepath.Join(f.dir, fmt.Sprintf("f%02d", i)), "x")
	}
	got := f.mustCall(t, ListFiles, map[string]any{"recursive": true})
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[5], "[list cut after 5 entries") || lines[0] != "f00 (1 bytes)" {
		t.Errorf("bounded list =\n%s", got)
	}
	f = newFixture(t, Options{MaxOutputBytes: 40})
	for i := range 12 {
		writeFile(t, filepath.Join(f.dir, fmt.Sprintf("f%02d", i)), "x")
	}
	got = f.mustCall(t, ListFiles, map[string]any{})
	if !strings.Contains(got, "[list cut after 2 entries") {
		t.Errorf("list bounded by bytes =\n%s", got)
	}
}

func TestListEmptyAndMissingMemory(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"}) // memDir not created
	if got, want := f.mustCall(t, ListFiles, map[string]any{"recursive": true}), "memory/\n"; got != want {
		t.Errorf("list of an empty workspace = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, ListFiles, map[string]any{"path": "memory"}), "memory is an empty folder"; got != want {
		t.Errorf("list memory = %q, want %q", got, want)
	}
	_, err := f.call(t, ReadFile, map[string]any{"path": "memory/journal.jsonl"})
	wantErr(t, err, "memory/journal.jsonl does not exist")
}

func TestReadFile(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"})
	content := "line1\nline2\nline3\nline4\nlast without newline"
	writeFile(t, filepath.Join(f.dir, "notes", "n.txt"), content)
	writeFile(t, filepath.Join(f.memDir, "journal.jsonl"), `{"sessionId":"s0"}`+"\n")

	if got := f.mustCall(t, ReadFile, map[string]any{"path": "notes/n.txt"}); got != content {
		t.Errorf("read = %q, want the file exactly", got)
	}
	if got := f.mustCall(t, ReadFile, map[string]any{"path": "memory/journal.jsonl"}); got != `{"sessionId":"s0"}`+"\n" {
		t.Errorf("read memory = %q", got)
	}
	if got, want := f.mustCall(t, ReadFile, map[string]any{"path": "notes/n.txt", "offset": 2, "limit": 2}), "line2\nline3\n[showed lines 2-3 of 5; continue with offset=4]"; got != want {
		t.Errorf("read offset 2 limit 2 = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, ReadFile, map[string]any{"path": "notes/n.txt", "offset": 4}), "line4\nlast without newline\n[showed lines 4-5 of 5]"; got != want {
		t.Errorf("read offset 4 = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, ReadFile, map[string]any{"path": "notes/n.txt", "offset": 9}), "[notes/n.txt has 5 lines; offset 9 is past the end]"; got != want {
		t.Errorf("read past the end = %q, want %q", got, want)
	}
	writeFile(t, filepath.Join(f.dir, "empty"), "")
	if got := f.mustCall(t, ReadFile, map[string]any{"path": "empty"}); got != "" {
		t.Errorf("read empty = %q", got)
	}

	_, err := f.call(t, ReadFile, map[string]any{"path": "notes"})
	wantErr(t, err, "notes is a folder")
	_, err = f.call(t, ReadFile, map[string]any{"path": "missing.txt"})
	wantErr(t, err, "missing.txt does not exist")
	_, err = f.call(t, ReadFile, map[string]any{})
	wantErr(t, err, "empty")
	_, err = f.call(t, ReadFile, map[string]any{"path": "notes/n.txt", "offset": -1})
	wantErr(t, err, "negative")
	_, err = f.call(t, ReadFile, map[string]any{"path": "notes/n.txt", "lines": 3})
	wantErr(t, err, "unknown field")
	writeFile(t, filepath.Join(f.dir, "bin"), "ab\x00cd")
	_, err = f.call(t, ReadFile, map[string]any{"path": "bin"})
	wantErr(t, err, "binary file (5 bytes)")
}

func TestReadFileBounded(t *testing.T) {
	f := newFixture(t, Options{MaxReadBytes: 20})
	var b strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&b, "line %02d\n", i) // 8 bytes a line
	}
	writeFile(t, filepath.Join(f.dir, "long.txt"), b.String())
	if got, want := f.mustCall(t, ReadFile, map[string]any{"path": "long.txt"}), "line 01\nline 02\n[cut at 20 bytes: showed lines 1-2 of 10; continue with offset=3]"; got != want {
		t.Errorf("read = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, ReadFile, map[string]any{"path": "long.txt", "offset": 9}), "line 09\nline 10\n[showed lines 9-10 of 10]"; got != want {
		t.Errorf("read offset 9 = %q, want %q", got, want)
	}
	// One line longer than the bound is cut on a rune boundary.
	writeFile(t, filepath.Join(f.dir, "wide.txt"), strings.Repeat("é", 15)+"\nnext\n")
	got := f.mustCall(t, ReadFile, map[string]any{"path": "wide.txt"})
	if want := strings.Repeat("é", 10) + "\n[cut: line 1 is longer than 20 bytes; showed lines 1-1 of 2; continue with offset=2]"; got != want {
		t.Errorf("read wide = %q, want %q", got, want)
	}
}

func TestWriteFile(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount", MaxWriteBytes: 100})
	if got, want := f.mustCall(t, WriteFile, map[string]any{"path": "a/b/c.md", "content": "hello"}), "wrote 5 bytes to a/b/c.md"; got != want {
		t.Errorf("write = %q, want %q", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(f.dir, "a", "b", "c.md")); err != nil || string(b) != "hello" {
		t.Errorf("file = %q, %v", b, err)
	}
	f.mustCall(t, WriteFile, map[string]any{"path": "a/b/c.md", "content": ""})
	if got := f.mustCall(t, ReadFile, map[string]any{"path": "a/b/c.md"}); got != "" {
		t.Errorf("after overwrite with empty content: %q", got)
	}
	for _, p := range []string{"memory/journal.jsonl", "memory/new.txt", "Memory/x", "./memory/../memory/x", "memory"} {
		_, err := f.call(t, WriteFile, map[string]any{"path": p, "content": "forged record"})
		wantErr(t, err, "read-only")
	}
	if _, err := os.Stat(f.memDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the memory folder was created by a refused write: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "memory")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a memory folder appeared in the workspace: %v", err)
	}
	_, err := f.call(t, WriteFile, map[string]any{"path": "big", "content": strings.Repeat("x", 101)})
	wantErr(t, err, "101 bytes", "100-byte limit")
	_, err = f.call(t, WriteFile, map[string]any{"path": "a/b", "content": "x"})
	wantErr(t, err, "a/b is a folder")
	_, err = f.call(t, WriteFile, map[string]any{"path": "x"})
	wantErr(t, err, "both path and content")
	_, err = f.call(t, WriteFile, map[string]any{"path": ".", "content": "x"})
	wantErr(t, err, "not the workspace itself")
}

func TestSearchFiles(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"})
	writeFile(t, filepath.Join(f.dir, "a.txt"), "alpha\nBeta\ngamma beta\n")
	writeFile(t, filepath.Join(f.dir, "sub", "b.txt"), "nothing\nbeta again")
	writeFile(t, filepath.Join(f.dir, "bin.dat"), "beta\x00")
	writeFile(t, filepath.Join(f.memDir, "journal.jsonl"), `{"userMessage":"remember beta"}`+"\n")

	want := "a.txt:3: gamma beta\nsub/b.txt:2: beta again\nmemory/journal.jsonl:1: {\"userMessage\":\"remember beta\"}\n"
	if got := f.mustCall(t, SearchFiles, map[string]any{"pattern": "beta"}); got != want {
		t.Errorf("search beta =\n%s\nwant\n%s", got, want)
	}
	if got, want := f.mustCall(t, SearchFiles, map[string]any{"pattern": "beta", "ignore_case": true, "path": "a.txt"}), "a.txt:2: Beta\na.txt:3: gamma beta\n"; got != want {
		t.Errorf("search -i in a.txt = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, SearchFiles, map[string]any{"pattern": `^(alpha|nothing)$`, "regexp": true}), "a.txt:1: alpha\nsub/b.txt:1: nothing\n"; got != want {
		t.Errorf("search regexp = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, SearchFiles, map[string]any{"pattern": "beta", "path": "memory"}), "memory/journal.jsonl:1: {\"userMessage\":\"remember beta\"}\n"; got != want {
		t.Errorf("search memory = %q, want %q", got, want)
	}
	if got, want := f.mustCall(t, SearchFiles, map[string]any{"pattern": "(a"}), "no matches for \"(a\" under ."; got != want {
		t.Errorf("literal search = %q, want %q", got, want)
	}
	_, err := f.call(t, SearchFiles, map[string]any{"pattern": "(a", "regexp": true})
	wantErr(t, err, "not a valid regular expression")
	_, err = f.call(t, SearchFiles, map[string]any{"pattern": ""})
	wantErr(t, err, "pattern is empty")
}

func TestSearchFilesBounded(t *testing.T) {
	f := newFixture(t, Options{MaxMatches: 3})
	writeFile(t, filepath.Join(f.dir, "many.txt"), strings.Repeat("hit\n", 10))
	writeFile(t, filepath.Join(f.dir, "wide.txt"), strings.Repeat("x", 1000)+"hit\n")
	got := f.mustCall(t, SearchFiles, map[string]any{"pattern": "hit"})
	if want := "many.txt:1: hit\nmany.txt:2: hit\nmany.txt:3: hit\n[stopped after 3 matches; narrow the pattern or the path]\n"; got != want {
		t.Errorf("bounded search =\n%s\nwant\n%s", got, want)
	}
	got = f.mustCall(t, SearchFiles, map[string]any{"pattern": "hit", "path": "wide.txt"})
	if want := "wide.txt:1: " + strings.Repeat("x", 300) + "…\n"; got != want {
		t.Errorf("wide line shown as %q", got)
	}
}

func TestEscapesRefused(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"})
	outside := filepath.Join(filepath.Dir(f.dir), "outside")
	writeFile(t, filepath.Join(outside, "secret.txt"), "secret")
	writeFile(t, filepath.Join(f.dir, "ok.txt"), "ok")
	if err := os.Symlink(outside, filepath.Join(f.dir, "link-dir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(f.dir, "link-file")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../outside/secret.txt", filepath.Join(f.dir, "rel-link")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(f.memDir, "journal.jsonl"), "{}\n")
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(f.memDir, "leak")); err != nil {
		t.Fatal(err)
	}

	for _, p := range []string{"../outside/secret.txt", "a/../../outside/secret.txt", "..", "/etc/passwd", filepath.Join(outside, "secret.txt")} {
		for _, c := range []struct {
			tool string
			args map[string]any
		}{
			{ReadFile, map[string]any{"path": p}},
			{ListFiles, map[string]any{"path": p}},
			{SearchFiles, map[string]any{"path": p, "pattern": "secret"}},
			{WriteFile, map[string]any{"path": p, "content": "x"}},
		} {
			out, err := f.call(t, c.tool, c.args)
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("%s(%q) = %q, %v; want ErrUnsafePath", c.tool, p, out, err)
			}
		}
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{ReadFile, map[string]any{"path": "link-file"}},
		{ReadFile, map[string]any{"path": "rel-link"}},
		{ReadFile, map[string]any{"path": "link-dir/secret.txt"}},
		{ListFiles, map[string]any{"path": "link-dir"}},
		{SearchFiles, map[string]any{"path": "link-dir", "pattern": "secret"}},
		{WriteFile, map[string]any{"path": "link-dir/new.txt", "content": "x"}},
		{WriteFile, map[string]any{"path": "link-file", "content": "overwritten"}},
		{ReadFile, map[string]any{"path": "memory/leak"}},
	} {
		out, err := f.call(t, c.tool, c.args)
		if !errors.Is(err, ErrUnsafePath) || !strings.Contains(err.Error(), "outside the workspace") {
			t.Errorf("%s(%v) = %q, %v; want an error saying it leads outside", c.tool, c.args, out, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "secret" {
		t.Errorf("the file outside was changed to %q", b)
	}
	if _, err := os.Stat(filepath.Join(outside, "new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was created outside: %v", err)
	}
	// A whole-workspace search does not follow the links out.
	if got := f.mustCall(t, SearchFiles, map[string]any{"pattern": "secret"}); got != `no matches for "secret" under .` {
		t.Errorf("search . = %q", got)
	}
	got := f.mustCall(t, ListFiles, map[string]any{"recursive": true})
	if !strings.Contains(got, "link-dir (symlink)") || strings.Contains(got, "secret.txt") {
		t.Errorf("list -r . =\n%s", got)
	}
}

func TestMemoryInWorkspaceWithoutMount(t *testing.T) {
	f := newFixture(t, Options{})
	writeFile(t, filepath.Join(f.dir, "memory", "journal.jsonl"), "rec\n")
	if got := f.mustCall(t, ReadFile, map[string]any{"path": "memory/journal.jsonl"}); got != "rec\n" {
		t.Errorf("read = %q", got)
	}
	_, err := f.call(t, WriteFile, map[string]any{"path": "memory/journal.jsonl", "content": "forged"})
	wantErr(t, err, "read-only")
	if b, _ := os.ReadFile(filepath.Join(f.dir, "memory", "journal.jsonl")); string(b) != "rec\n" {
		t.Errorf("journal changed to %q", b)
	}
}

func TestNoWorkspace(t *testing.T) {
	argsOf := map[string]string{
		ListFiles: `{"path":"x"}`, ReadFile: `{"path":"x"}`,
		WriteFile: `{"path":"x","content":"y"}`, SearchFiles: `{"pattern":"z"}`,
	}
	for _, tl := range Tools(Options{}) {
		args := json.RawMessage(argsOf[tl.Spec.Name])
		if _, err := tl.Run(context.Background(), &tool.Env{}, args); err == nil || !strings.Contains(err.Error(), "no workspace") {
			t.Errorf("%s without a workspace: %v", tl.Spec.Name, err)
		}
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		".": ".", "./a": "a", "a//b/": "a/b", "a/../b": "b", "a/./b": "a/b",
	} {
		if got, err := CleanPath(in); err != nil || got != want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "..", "../a", "a/../../b", "/a", "/", "a\x00b"} {
		if got, err := CleanPath(in); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("CleanPath(%q) = %q, %v; want ErrUnsafePath", in, got, err)
		}
	}
	for in, want := range map[string]bool{"memory": true, "memory/x": true, "MEMORY/x": true, "memoryx": false, "a/memory": false} {
		if got := IsReserved(in); got != want {
			t.Errorf("IsReserved(%q) = %v", in, got)
		}
	}
}
