//go:build unix

package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// within runs f and fails the test if it has not returned after a generous
// bound: the tools must refuse a named pipe at once, where a plain open
// blocks until a writer comes (forever, here).
func within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("%s blocked on a named pipe", what)
	}
	var zero T
	return zero
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	mustMkdir(t, filepath.Dir(path))
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
}

// TestNamedPipesAreRefused plants FIFOs in the workspace and the memory
// view: read_file, write_file and search_files refuse them with a tool
// error instead of blocking the turn; list_files shows them.
func TestNamedPipesAreRefused(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"})
	mkfifo(t, filepath.Join(f.dir, "pipe"))
	mkfifo(t, filepath.Join(f.dir, "sub", "pipe"))
	writeFile(t, filepath.Join(f.dir, "sub", "text.txt"), "needle here\n")
	mkfifo(t, filepath.Join(f.memDir, "journal.jsonl"))

	type result struct {
		out string
		err error
	}
	call := func(name string, args any) result {
		out, err := f.call(t, name, args)
		return result{out, err}
	}
	for _, c := range []struct {
		name string
		args any
	}{
		{ReadFile, map[string]any{"path": "pipe"}},
		{ReadFile, map[string]any{"path": "sub/pipe"}},
		{ReadFile, map[string]any{"path": "memory/journal.jsonl"}},
		{WriteFile, map[string]any{"path": "pipe", "content": "x"}},
	} {
		r := within(t, c.name, func() result { return call(c.name, c.args) })
		if r.err == nil || !errors.Is(r.err, ErrNotRegular) || !strings.Contains(r.err.Error(), "named pipe") {
			t.Errorf("%s(%v) = %q, %v; want an error saying it is a named pipe", c.name, c.args, r.out, r.err)
		}
	}
	r := within(t, SearchFiles, func() result { return call(SearchFiles, map[string]any{"pattern": "needle"}) })
	if r.err != nil || !strings.Contains(r.out, "sub/text.txt:1: needle here") {
		t.Errorf("search_files beside pipes = %q, %v; want the match in the text file", r.out, r.err)
	}
	r = within(t, ListFiles, func() result { return call(ListFiles, map[string]any{"recursive": true}) })
	if r.err != nil || !strings.Contains(r.out, "pipe") {
		t.Errorf("list_files = %q, %v", r.out, r.err)
	}
}

// TestSeedRefusesANamedPipe: a per-send workspace file whose path names a
// FIFO already in the workspace is refused, not written into the pipe
// (which blocks until a reader comes).
func TestSeedRefusesANamedPipe(t *testing.T) {
	dir := t.TempDir()
	mkfifo(t, filepath.Join(dir, "in"))
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	err = within(t, "Seed", func() error { return Seed(root, map[string]string{"in": "x"}) })
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != "in" || !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Seed over a FIFO: %v; want a *FileError for \"in\" matching ErrNotRegular", err)
	}
}

// TestToolsHonourCancellation: with the turn's context ended, every tool
// stops with its error instead of doing the work.
func TestToolsHonourCancellation(t *testing.T) {
	f := newFixture(t, Options{MemoryDir: "mount"})
	writeFile(t, filepath.Join(f.dir, "a.txt"), strings.Repeat("line\n", 1000))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, args := range map[string]any{
		ListFiles:   map[string]any{"recursive": true},
		ReadFile:    map[string]any{"path": "a.txt"},
		WriteFile:   map[string]any{"path": "b.txt", "content": "x"},
		SearchFiles: map[string]any{"pattern": "line"},
	} {
		raw, _ := json.Marshal(args)
		out, err := f.tools[name].Run(ctx, f.env, raw)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context = %q, %v; want context.Canceled", name, out, err)
		}
	}
	if _, err := os.Stat(filepath.Join(f.dir, "b.txt")); err == nil {
		t.Error("write_file wrote after its context ended")
	}
}
