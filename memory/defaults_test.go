package memory_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentkit/memory"
)

// The defaults as numbers written out, not the package's constants: a
// change of either default fails these tests.
const (
	wantTextLimit  = 2000    // characters
	wantRotateSize = 4 << 20 // 4 MiB = 4,194,304 bytes
)

// readRecords reads the journal of a state root.
func readRecords(t *testing.T, root string) []memory.Record {
	t.Helper()
	data, err := os.ReadFile(memory.JournalPath(root))
	if err != nil {
		t.Fatal(err)
	}
	var out []memory.Record
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if line == "" {
			continue
		}
		var r memory.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("journal line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// TestDefaultTextLimitIs2000Characters: a hook with the default options
// (nil, or zero Options as the runtime passes) keeps a user message and a
// result of 2,000 characters whole and cuts ones of 2,001 to 2,000.
// Characters are runes: 2,000 "é" (4,000 bytes) are kept whole too.
func TestDefaultTextLimitIs2000Characters(t *testing.T) {
	for name, opts := range map[string]*memory.Options{"nil options": nil, "zero options": {}} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			h, err := memory.NewHook(memory.Info{StateRoot: root, AgentName: "a"}, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			ctx := context.Background()
			at := time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)
			kept, keptWide, over := strings.Repeat("k", wantTextLimit), strings.Repeat("é", wantTextLimit), strings.Repeat("o", wantTextLimit+1)
			h.AfterTurn(ctx, memory.TurnInfo{SessionID: "s", ChannelID: "http", UserMessage: kept, Result: keptWide, FinishedAt: at})
			h.AfterTurn(ctx, memory.TurnInfo{SessionID: "s", ChannelID: "http", UserMessage: over, Result: over, FinishedAt: at})
			recs := readRecords(t, root)
			if len(recs) != 2 {
				t.Fatalf("%d records, want 2", len(recs))
			}
			if recs[0].UserMessage != kept || recs[0].Result != keptWide {
				t.Errorf("texts of %d characters were cut to %d and %d characters; want them whole", wantTextLimit, len([]rune(recs[0].UserMessage)), len([]rune(recs[0].Result)))
			}
			if recs[1].UserMessage != over[:wantTextLimit] || recs[1].Result != over[:wantTextLimit] {
				t.Errorf("texts of %d characters became %d and %d characters; want them cut to %d", wantTextLimit+1, len(recs[1].UserMessage), len(recs[1].Result), wantTextLimit)
			}
		})
	}
}

// fill appends records to j until journal.jsonl is exactly size bytes,
// with the last record's length chosen to land on it, and fails if the
// journal rotated on the way.
func fill(t *testing.T, j *memory.Journal, size int64) {
	t.Helper()
	ctx := context.Background()
	rec := func(n int) memory.Record {
		return memory.Record{At: time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC), SessionID: "s", ChannelID: "http",
			Status: memory.StatusCompleted, UserMessage: strings.Repeat("x", n)}
	}
	empty, err := rec(0).Line()
	if err != nil {
		t.Fatal(err)
	}
	base := int64(len(empty)) // a line's length is base + the message's length
	const chunk = 60 << 10
	var cur int64
	for cur < size {
		n := min(int64(chunk), size-cur-base)
		if left := size - cur - (base + n); left > 0 && left < base {
			n -= base // leave room for one more whole line
		}
		if err := j.Append(ctx, rec(int(n))); err != nil {
			t.Fatal(err)
		}
		cur += base + n
	}
	if files := journalFiles(t, j); len(files) != 1 {
		t.Fatalf("the journal rotated before it reached %d bytes: %v", size, files)
	}
	st, err := os.Stat(j.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != size {
		t.Fatalf("set-up: journal.jsonl is %d bytes, want %d", st.Size(), size)
	}
}

func journalFiles(t *testing.T, j *memory.Journal) []string {
	t.Helper()
	files, err := memory.Files(j.Dir())
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDefaultRotationAt4MiB: the default journal (the one a hook with
// default options makes) does not rotate while journal.jsonl is under
// 4 MiB, a record that takes it past 4 MiB included; the first append that
// finds it at 4 MiB moves it aside, whole, and starts a new journal.jsonl.
func TestDefaultRotationAt4MiB(t *testing.T) {
	for name, opts := range map[string]*memory.JournalOptions{"nil options": nil, "zero options": {}} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rec := memory.Record{At: time.Date(2026, 3, 14, 9, 30, 0, 0, time.UTC), SessionID: "s", ChannelID: "http", Status: memory.StatusCompleted, UserMessage: "next"}
			line, _ := rec.Line()

			// One byte short: the next record is appended to the same
			// file, which goes past 4 MiB.
			j, err := memory.NewJournal(filepath.Join(t.TempDir(), "memory"), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer j.Close()
			fill(t, j, wantRotateSize-1)
			if err := j.Append(ctx, rec); err != nil {
				t.Fatal(err)
			}
			if files := journalFiles(t, j); len(files) != 1 {
				t.Errorf("the journal rotated at %d bytes, under 4 MiB: %v", wantRotateSize-1, files)
			}
			if st, _ := os.Stat(j.Path()); st.Size() != wantRotateSize-1+int64(len(line)) {
				t.Errorf("journal.jsonl is %d bytes, want %d: the record went elsewhere", st.Size(), wantRotateSize-1+int64(len(line)))
			}

			// At 4 MiB: the next append moves the file aside first.
			j2, err := memory.NewJournal(filepath.Join(t.TempDir(), "memory"), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer j2.Close()
			fill(t, j2, wantRotateSize)
			if err := j2.Append(ctx, rec); err != nil {
				t.Fatal(err)
			}
			files := journalFiles(t, j2)
			if len(files) != 2 {
				t.Fatalf("files at 4 MiB after one more append: %v; want the rotated file and a new journal.jsonl", files)
			}
			if st, err := os.Stat(files[0]); err != nil || st.Size() != wantRotateSize {
				t.Errorf("the rotated file %s: %v, %v; want the whole 4 MiB", files[0], st.Size(), err)
			}
			if data, err := os.ReadFile(j2.Path()); err != nil || string(data) != string(line) {
				t.Errorf("the new journal.jsonl holds %q (%v); want only the record appended after the rotation", data, err)
			}
		})
	}
}
