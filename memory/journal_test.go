package memory

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"agentkit/model"
)

// turnRecord is the record of turn n of session sid, with a message long
// enough that a few KiB hold only a handful of records.
func turnRecord(sid string, n int) Record {
	return Record{
		At:          time.Now(),
		SessionID:   sid,
		ChannelID:   "http",
		Status:      StatusCompleted,
		Title:       "session " + sid,
		UserMessage: fmt.Sprintf("turn-%06d of %s: %s", n, sid, strings.Repeat("ü", 40)),
		Result:      "done",
		Usage:       model.Usage{InputTokens: int64(n), OutputTokens: 1},
	}
}

// readJournal reads every journal file in dir in Files order and checks
// the file-level invariants: each file ends with a newline, each line is a
// valid record, and no rotated file was moved aside before reaching
// rotateSize or grew more than one record past it.
func readJournal(t *testing.T, dir string, rotateSize int64) (recs []Record, files []string) {
	t.Helper()
	files, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			t.Errorf("%s does not end with a newline", name)
		}
		rotated := i < len(files)-1 || filepath.Base(name) != JournalName
		maxLine := 0
		for _, line := range bytes.SplitAfter(b, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			maxLine = max(maxLine, len(line))
			if !json.Valid(line) {
				t.Fatalf("%s: invalid JSON line %q", name, line)
			}
			var r Record
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("%s: line %q: %v", name, line, err)
			}
			recs = append(recs, r)
		}
		if rotated && (int64(len(b)) < rotateSize || int64(len(b)) >= rotateSize+int64(maxLine)) {
			t.Errorf("%s: %d bytes, want at least the threshold %d and less than one record more", name, len(b), rotateSize)
		}
	}
	return recs, files
}

// checkSessions checks that every session in want has turns 0..want[s]-1
// exactly once, in the order they were appended, across the files.
func checkSessions(t *testing.T, recs []Record, want map[string]int) {
	t.Helper()
	next := map[string]int{}
	for _, r := range recs {
		n, err := strconv.Atoi(strings.TrimPrefix(strings.Fields(r.UserMessage)[0], "turn-"))
		if err != nil {
			t.Fatalf("unexpected record %+v", r)
		}
		if _, ok := want[r.SessionID]; !ok {
			t.Fatalf("record of unknown session %q", r.SessionID)
		}
		if n != next[r.SessionID] {
			t.Fatalf("session %s: found turn %d where turn %d was due (lost, duplicated or out of order)", r.SessionID, n, next[r.SessionID])
		}
		next[r.SessionID]++
	}
	for s, n := range want {
		if next[s] != n {
			t.Errorf("session %s: %d records, want %d", s, next[s], n)
		}
	}
}

func TestJournalAppendsLines(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "memory")
	j, err := NewJournal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("NewJournal touched the disk: stat %s: %v", dir, err)
	}
	if j.Path() != filepath.Join(dir, JournalName) || j.Dir() != dir {
		t.Errorf("Path() = %s, Dir() = %s", j.Path(), j.Dir())
	}
	ctx := context.Background()
	var want []byte
	for i := range 3 {
		rec := turnRecord("s", i)
		if i == 1 {
			rec.Status, rec.Title = StatusFailed, ""
		}
		if err := j.AppendTurn(ctx, rec, Info{StateRoot: "ignored"}); err != nil {
			t.Fatal(err)
		}
		line, _ := rec.Line()
		want = append(want, line...)
	}
	got, err := os.ReadFile(j.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("journal =\n%s\nwant\n%s", got, want)
	}
	for path, perm := range map[string]os.FileMode{dir: dirPerm, j.Path(): filePerm} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != perm {
			t.Errorf("%s: mode %v (err %v), want %v", path, fi.Mode().Perm(), err, os.FileMode(perm))
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := j.Append(cctx, turnRecord("s", 9)); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled ctx: err = %v, want context.Canceled", err)
	}
	if err := j.Append(ctx, Record{Status: "bogus"}); err == nil {
		t.Error("invalid record appended")
	}
	if got2, _ := os.ReadFile(j.Path()); !bytes.Equal(got2, want) {
		t.Error("a refused append changed the journal")
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(ctx, turnRecord("s", 3)); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: err = %v, want ErrClosed", err)
	}
}

func TestNewJournalOptions(t *testing.T) {
	if _, err := NewJournal("", nil); err == nil {
		t.Error("empty folder accepted")
	}
	if _, err := NewJournal(t.TempDir(), &JournalOptions{RotateSize: -1}); err == nil || !strings.Contains(err.Error(), "RotateSize") {
		t.Errorf("negative RotateSize: err = %v, want one naming RotateSize", err)
	}
	j, err := NewJournal(t.TempDir(), &JournalOptions{})
	if err != nil || j.rotateSize != DefaultRotateSize {
		t.Errorf("zero RotateSize: %v, size %d, want the default %d", err, j.rotateSize, DefaultRotateSize)
	}
}

func TestJournalSync(t *testing.T) {
	dir := t.TempDir()
	j, err := NewJournal(dir, &JournalOptions{Sync: true, RotateSize: 600})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i := range 10 {
		if err := j.Append(context.Background(), turnRecord("s", i)); err != nil {
			t.Fatal(err)
		}
	}
	recs, files := readJournal(t, dir, 600)
	checkSessions(t, recs, map[string]int{"s": 10})
	if len(files) < 3 {
		t.Errorf("%d files, want rotations", len(files))
	}
}

// TestJournalConcurrentRotation is the headline guarantee: 50 sessions of
// 200 turns in parallel through one Journal with a threshold of a few KiB.
func TestJournalConcurrentRotation(t *testing.T) {
	const sessions, turns, size = 50, 200, 16 << 10
	dir := t.TempDir()
	j, err := NewJournal(dir, &JournalOptions{RotateSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	want := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for s := range sessions {
		sid := fmt.Sprintf("session-%02d", s)
		want[sid] = turns
		wg.Go(func() {
			for n := range turns {
				if err := j.AppendTurn(context.Background(), turnRecord(sid, n), Info{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs, files := readJournal(t, dir, size)
	checkSessions(t, recs, want)
	if len(files) < 20 {
		t.Errorf("%d journal files, want many rotations", len(files))
	}
	checkRotatedNames(t, files)
}

// checkRotatedNames checks that rotated names strictly increase and that
// their timestamps are in order with the files' modification times.
func checkRotatedNames(t *testing.T, files []string) {
	t.Helper()
	prev := ""
	for _, f := range files[:len(files)-1] {
		name := filepath.Base(f)
		if _, _, ok := parseRotated(name); !ok {
			t.Errorf("%s is not a rotated name", name)
		}
		if name <= prev {
			t.Errorf("%s does not sort after %s", name, prev)
		}
		prev = name
	}
}

// TestJournalSeveralValues runs several Journal values on one folder, as
// several agents or a restarted hook in one process might.
func TestJournalSeveralValues(t *testing.T) {
	const journals, perJournal, turns, size = 4, 5, 100, 8 << 10
	dir := t.TempDir()
	want := map[string]int{}
	var wg sync.WaitGroup
	for k := range journals {
		j, err := NewJournal(dir, &JournalOptions{RotateSize: size})
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		for s := range perJournal {
			sid := fmt.Sprintf("j%d-s%d", k, s)
			want[sid] = turns
			wg.Go(func() {
				for n := range turns {
					if err := j.Append(context.Background(), turnRecord(sid, n)); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	recs, files := readJournal(t, dir, size)
	checkSessions(t, recs, want)
	checkRotatedNames(t, files)
}

const writerEnv = "AGENTKIT_MEMORY_TEST_WRITER"

// TestJournalWriterProcess is the child of TestJournalSeveralProcesses; it
// does nothing in a normal run.
func TestJournalWriterProcess(t *testing.T) {
	spec := os.Getenv(writerEnv)
	if spec == "" {
		t.Skip("helper process for TestJournalSeveralProcesses")
	}
	// spec: dir|proc|sessions|turns|size
	p := strings.Split(spec, "|")
	sessions, _ := strconv.Atoi(p[2])
	turns, _ := strconv.Atoi(p[3])
	size, _ := strconv.ParseInt(p[4], 10, 64)
	j, err := NewJournal(p[0], &JournalOptions{RotateSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	var wg sync.WaitGroup
	for s := range sessions {
		sid := fmt.Sprintf("p%s-s%d", p[1], s)
		wg.Go(func() {
			for n := range turns {
				if err := j.Append(context.Background(), turnRecord(sid, n)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestJournalSeveralProcesses(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("several processes per folder need flock")
	}
	const procs, sessions, turns, size = 3, 4, 150, 8 << 10
	dir := t.TempDir()
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
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("writer %d: %v", i, err)
		}
	}
	recs, files := readJournal(t, dir, size)
	checkSessions(t, recs, want)
	checkRotatedNames(t, files)
}

func TestRotatedNames(t *testing.T) {
	dir := t.TempDir()
	j, err := NewJournal(dir, &JournalOptions{RotateSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	clock := time.Date(2026, 10, 1, 16, 42, 9, 118_700_000, time.UTC)
	j.now = func() time.Time { return clock }
	ctx := context.Background()
	appendN := func(from, n int) {
		for i := range n {
			if err := j.Append(ctx, turnRecord("s", from+i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// RotateSize 1: every append after the first moves the previous one
	// aside, all in the same millisecond.
	appendN(0, 4)
	// The clock steps back a minute: names must keep increasing.
	clock = clock.Add(-time.Minute)
	appendN(4, 2)
	// Then forward again.
	clock = time.Date(2026, 10, 1, 16, 50, 0, 0, time.UTC)
	appendN(6, 1)

	files, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{
		"journal-20261001T164209.118Z-0000.jsonl",
		"journal-20261001T164209.118Z-0001.jsonl",
		"journal-20261001T164209.118Z-0002.jsonl",
		"journal-20261001T164209.118Z-0003.jsonl",
		"journal-20261001T164209.118Z-0004.jsonl",
		"journal-20261001T165000.000Z-0000.jsonl",
		"journal.jsonl",
	}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("files:\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	recs, _ := readJournal(t, dir, 1)
	checkSessions(t, recs, map[string]int{"s": 7})

	// A full counter moves on to the next millisecond.
	if err := os.WriteFile(filepath.Join(dir, "journal-20261001T170000.000Z-9999.jsonl"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := j.rotatedName(); err != nil || got != "journal-20261001T170000.001Z-0000.jsonl" {
		t.Errorf("after counter 9999: %q, %v", got, err)
	}
}

func TestParseRotated(t *testing.T) {
	for name, ok := range map[string]bool{
		"journal-20261001T164209.118Z-0000.jsonl":  true,
		"journal-20261001T164209.118Z-0042.jsonl":  true,
		"journal-20261001T164209.118Z.jsonl":       false,
		"journal-20261001T164209.118Z-+042.jsonl":  false,
		"journal-20261301T164209.118Z-0000.jsonl":  false, // month 13
		"journal-20261001T164209.118Z-00000.jsonl": false,
		"journal-20261001T164209.118Z-0000.json":   false,
		"journal.jsonl":                            false,
		"notes-20261001T164209.118Z-0000.jsonl":    false,
	} {
		if _, _, got := parseRotated(name); got != ok {
			t.Errorf("parseRotated(%q) ok = %v, want %v", name, got, ok)
		}
	}
}

func TestFiles(t *testing.T) {
	if files, err := Files(filepath.Join(t.TempDir(), "missing")); err != nil || files != nil {
		t.Errorf("missing folder: %v, %v", files, err)
	}
	dir := t.TempDir()
	for _, name := range []string{
		"journal.jsonl", "journal-20270101T000000.000Z-0000.jsonl", "journal-20261001T164209.118Z-0001.jsonl",
		"journal-20261001T164209.118Z-0000.jsonl", "notes.txt", lockName, "journal-bad.jsonl",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "journal-20281001T164209.118Z-0000.jsonl"), 0o700); err != nil {
		t.Fatal(err)
	}
	files, err := Files(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"journal-20261001T164209.118Z-0000.jsonl", "journal-20261001T164209.118Z-0001.jsonl",
		"journal-20270101T000000.000Z-0000.jsonl", "journal.jsonl",
	}
	for i := range want {
		want[i] = filepath.Join(dir, want[i])
	}
	if strings.Join(files, " ") != strings.Join(want, " ") {
		t.Errorf("Files = %v, want %v", files, want)
	}
}

// TestJournalFolderDeleted clears the journal while a Journal is open, as
// an operator deleting --state-root/memory/ would.
func TestJournalFolderDeleted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "memory")
	j, err := NewJournal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	if err := j.Append(ctx, turnRecord("old", 0)); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := j.Append(ctx, turnRecord("new", 0)); err != nil {
		t.Fatal(err)
	}
	recs, _ := readJournal(t, dir, DefaultRotateSize)
	checkSessions(t, recs, map[string]int{"new": 1})
	// The new lock file is the one held: a second Journal must wait for it.
	st, err := os.Stat(filepath.Join(dir, lockName))
	if err != nil || !os.SameFile(st, j.lockInfo) {
		t.Errorf("the Journal did not switch to the new lock file (%v)", err)
	}
}

func TestJournalTornWriteIsTakenBack(t *testing.T) {
	dir := t.TempDir()
	j, err := NewJournal(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	if err := j.Append(ctx, turnRecord("s", 0)); err != nil {
		t.Fatal(err)
	}
	j.write = func(f *os.File, b []byte) (int, error) {
		n, _ := f.Write(b[:len(b)/2])
		return n, syscall.ENOSPC
	}
	if err := j.Append(ctx, turnRecord("s", 1)); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), j.Path()) {
		t.Errorf("torn write: err = %v, want ENOSPC naming the journal", err)
	}
	j.write = func(f *os.File, b []byte) (int, error) { return f.Write(b) }
	if err := j.Append(ctx, turnRecord("s", 1)); err != nil {
		t.Fatal(err)
	}
	recs, _ := readJournal(t, dir, DefaultRotateSize)
	checkSessions(t, recs, map[string]int{"s": 2})
}

func TestJournalRotationFailureKeepsRecord(t *testing.T) {
	dir := t.TempDir()
	j, err := NewJournal(dir, &JournalOptions{RotateSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	if err := j.Append(ctx, turnRecord("s", 0)); err != nil {
		t.Fatal(err)
	}
	j.rename = func(string, string) error { return syscall.EACCES }
	err = j.Append(ctx, turnRecord("s", 1))
	if !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "record appended") {
		t.Errorf("rotation failure: err = %v, want EACCES saying the record was appended", err)
	}
	j.rename = os.Rename
	if err := j.Append(ctx, turnRecord("s", 2)); err != nil {
		t.Fatal(err)
	}
	files, _ := Files(dir)
	if len(files) != 2 {
		t.Errorf("files %v, want one rotated file and journal.jsonl", files)
	}
	var recs []Record
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var r Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		fh.Close()
	}
	checkSessions(t, recs, map[string]int{"s": 3})
}
