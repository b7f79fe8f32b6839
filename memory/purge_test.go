package memory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// readAll reads every record of the journal files in dir, in Files order,
// and checks each file's mode and that every line is a record.
func readAll(t *testing.T, dir string) ([]Record, []string) {
	t.Helper()
	files, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	for _, name := range files {
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != filePerm {
			t.Errorf("%s has mode %v; want %v", name, st.Mode(), os.FileMode(filePerm))
		}
		b, _ := os.ReadFile(name)
		for _, line := range bytes.SplitAfter(b, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var r Record
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("%s: line %q: %v", name, line, err)
			}
			recs = append(recs, r)
		}
	}
	return recs, files
}

// TestPurgeRemovesASessionsRecords fills rotated files and the live one
// with two sessions' records and purges one: its records are gone from
// every file, the other's are all there in order, files emptied are gone,
// and appends go on.
func TestPurgeRemovesASessionsRecords(t *testing.T) {
	dir := t.TempDir()
	j, err := NewJournal(dir, &JournalOptions{RotateSize: 2 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	for n := range 40 {
		j.Append(ctx, turnRecord("keep", n))
		j.Append(ctx, turnRecord("gone", n))
	}
	for n := range 30 { // whole rotated files of "gone" alone
		j.Append(ctx, turnRecord("gone", 40+n))
	}
	j.Append(ctx, turnRecord("keep", 40))
	_, before := readAll(t, dir)
	if len(before) < 6 {
		t.Fatalf("only %d journal files; the test needs several rotated ones", len(before))
	}
	removed, err := j.Purge(ctx, "gone")
	if err != nil || removed != 70 {
		t.Fatalf("Purge = %d, %v; want 70 records removed", removed, err)
	}
	recs, after := readAll(t, dir)
	checkSessions(t, recs, map[string]int{"keep": 41})
	if len(after) >= len(before) {
		t.Errorf("%d files after the purge, %d before; files holding only the purged session should be gone", len(after), len(before))
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".purge") {
			t.Errorf("a temporary file was left: %s", e.Name())
		}
	}
	// The live file was replaced: the next append goes to the new one.
	if err := j.Append(ctx, turnRecord("keep", 41)); err != nil {
		t.Fatal(err)
	}
	recs, _ = readAll(t, dir)
	checkSessions(t, recs, map[string]int{"keep": 42})
	if n, err := j.Purge(ctx, "gone"); n != 0 || err != nil {
		t.Errorf("a second Purge = %d, %v; want nothing to do", n, err)
	}
}

// TestPurgeKeepsATornLastLine: a line still being written (no newline,
// not JSON yet) is kept as it is.
func TestPurgeKeepsATornLastLine(t *testing.T) {
	dir := t.TempDir()
	j, _ := NewJournal(dir, nil)
	defer j.Close()
	ctx := context.Background()
	j.Append(ctx, turnRecord("gone", 0))
	j.Append(ctx, turnRecord("keep", 0))
	f, _ := os.OpenFile(filepath.Join(dir, JournalName), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"at":"2026-01-01T00:00:00.000Z","sessionId":"gone","chan`)
	f.Close()
	if n, err := j.Purge(ctx, "gone"); n != 1 || err != nil {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, JournalName))
	if !strings.HasSuffix(string(b), `"chan`) || strings.Count(string(b), "\n") != 1 || !strings.Contains(string(b), `"keep"`) {
		t.Fatalf("journal after the purge: %q", b)
	}
}

func TestPurgeOfAMissingJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "never-created")
	j, _ := NewJournal(dir, nil)
	defer j.Close()
	if n, err := j.Purge(context.Background(), "x"); n != 0 || err != nil {
		t.Fatalf("Purge of a journal never written = %d, %v", n, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("Purge created the folder: %v", err)
	}
}

// TestPurgeBesideWritingProcesses purges while other processes append to
// the same folder and rotate it: none of their records is lost or doubled,
// and none of the purged session's is left.
func TestPurgeBesideWritingProcesses(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("several processes per folder need flock")
	}
	const procs, sessions, turns, size = 2, 3, 120, 8 << 10
	dir := t.TempDir()
	j, err := NewJournal(dir, &JournalOptions{RotateSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	for n := range 100 {
		j.Append(ctx, turnRecord("gone", n))
	}
	want := map[string]int{}
	var cmds []*exec.Cmd
	for p := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestJournalWriterProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%d|%d|%d|%d", writerEnv, dir, p, sessions, turns, size))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("writer %d output:\n%s", p, out.String())
			}
		})
		cmds = append(cmds, cmd)
		for s := range sessions {
			want[fmt.Sprintf("p%d-s%d", p, s)] = turns
		}
	}
	exited := make(chan error, len(cmds))
	for _, cmd := range cmds {
		go func() { exited <- cmd.Wait() }()
	}
	purges, removed := 0, 0
	for running := len(cmds); running > 0; {
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("writer: %v", err)
			}
			running--
		default:
			n, err := j.Purge(ctx, "gone")
			if err != nil {
				t.Fatal(err)
			}
			removed += n
			purges++
			// Records of the purged session appended meanwhile are purged
			// by a later pass.
			j.Append(ctx, turnRecord("gone", 100+purges))
		}
	}
	n, err := j.Purge(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	removed += n
	recs, _ := readAll(t, dir)
	checkSessions(t, recs, want)
	if removed != 100+purges {
		t.Errorf("the purges removed %d records; %d were appended", removed, 100+purges)
	}
	t.Logf("%d purges beside %d writing processes", purges, procs)
}
