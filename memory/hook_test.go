package memory

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentkit/model"
)

// recordingBackend keeps what it is given. It is a fake, not a mock: it
// behaves like a real (in-memory) backend.
type recordingBackend struct {
	mu       sync.Mutex
	recs     []Record
	infos    []Info
	prepared []Info
	ctxErrs  []error
	err      error // returned by AppendTurn when set
	panicMsg string
}

func (b *recordingBackend) AppendTurn(ctx context.Context, rec Record, info Info) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.panicMsg != "" {
		panic(b.panicMsg)
	}
	b.ctxErrs = append(b.ctxErrs, ctx.Err())
	if b.err != nil {
		return b.err
	}
	b.recs = append(b.recs, rec)
	b.infos = append(b.infos, info)
	return nil
}

func (b *recordingBackend) PrepareSession(ctx context.Context, info Info) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prepared = append(b.prepared, info)
	return b.err
}

func newLogger() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewTextHandler(&buf, nil)), &buf
}

func TestHookDefaultJournal(t *testing.T) {
	root := t.TempDir()
	h, err := NewHook(Info{StateRoot: root, AgentName: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !h.Enabled() {
		t.Fatal("nil options: memory off, want on by default")
	}
	if _, err := os.Stat(Dir(root)); !os.IsNotExist(err) {
		t.Fatalf("NewHook created %s before any session (%v)", Dir(root), err)
	}
	ctx := context.Background()
	h.PrepareSession(ctx, "s1")
	if fi, err := os.Stat(Dir(root)); err != nil || !fi.IsDir() {
		t.Fatalf("PrepareSession did not create the journal folder: %v", err)
	}
	at := time.Date(2026, 10, 1, 16, 42, 9, 118_000_000, time.UTC)
	h.AfterTurn(ctx, TurnInfo{SessionID: "s1", ChannelID: "http", UserMessage: "hi", Result: "hello",
		Usage: model.Usage{InputTokens: 1, OutputTokens: 2}, FinishedAt: at})
	h.AfterTurn(ctx, TurnInfo{SessionID: "s1", ChannelID: "http", UserMessage: "again", Err: errors.New("model unavailable"), FinishedAt: at})
	got, err := os.ReadFile(JournalPath(root))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"at":"2026-10-01T16:42:09.118Z","sessionId":"s1","channelId":"http","status":"completed","userMessage":"hi","result":"hello","usage":{"inputTokens":1,"outputTokens":2,"cacheReadTokens":0,"cacheWriteTokens":0}}` + "\n" +
		`{"at":"2026-10-01T16:42:09.118Z","sessionId":"s1","channelId":"http","status":"failed","userMessage":"again","result":"model unavailable"}` + "\n"
	if string(got) != want {
		t.Errorf("journal =\n%s\nwant\n%s", got, want)
	}
	if s := h.Stats(); s != (Stats{Appended: 2}) {
		t.Errorf("Stats = %+v, want 2 appended", s)
	}
	if h.JournalPath() != filepath.Join(root, "memory", "journal.jsonl") {
		t.Errorf("JournalPath = %s", h.JournalPath())
	}
	if note := h.FirstPromptNote(); !strings.Contains(note, "memory/journal.jsonl") || strings.Contains(note, root) {
		t.Errorf("FirstPromptNote %q does not name memory/journal.jsonl, or names the host path %s", note, root)
	}
	if h.WorkspaceJournalPath() != "memory/journal.jsonl" {
		t.Errorf("WorkspaceJournalPath = %s", h.WorkspaceJournalPath())
	}

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h.AfterTurn(ctx, TurnInfo{SessionID: "s1", UserMessage: "late"})
	if s := h.Stats(); s.Failed != 1 {
		t.Errorf("after Close: Stats = %+v, want 1 failed", s)
	}
}

// TestHookCustomBackend proves records go only where AppendTurn sends them:
// the default journal is not created.
func TestHookCustomBackend(t *testing.T) {
	root := t.TempDir()
	b := &recordingBackend{}
	info := Info{StateRoot: root, AgentName: "support"}
	h, err := NewHook(info, &Options{MaxTextLength: 5, Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.PrepareSession(ctx, "s1")
	h.AfterTurn(ctx, TurnInfo{SessionID: "s1", ChannelID: "slack", Title: "Title!", UserMessage: "hello world", Result: "fine"})
	if len(b.recs) != 1 || len(b.prepared) != 1 {
		t.Fatalf("backend got %d records and %d prepares, want 1 and 1", len(b.recs), len(b.prepared))
	}
	r := b.recs[0]
	if r.SessionID != "s1" || r.ChannelID != "slack" || r.Status != StatusCompleted || r.UserMessage != "hello" || r.Title != "Title!" || r.Result != "fine" {
		t.Errorf("record %+v, want s1/slack completed, the message cut to 5 characters and the title whole", r)
	}
	if b.infos[0] != info || b.prepared[0] != info {
		t.Errorf("infos %+v / %+v, want %+v", b.infos[0], b.prepared[0], info)
	}
	if entries, err := os.ReadDir(root); err != nil || len(entries) != 0 {
		t.Errorf("state root has %v (%v), want nothing: a custom backend must not create the default journal", entries, err)
	}
	// The first-prompt path still names the default journal (the spec).
	if h.JournalPath() != JournalPath(root) {
		t.Errorf("JournalPath = %s, want the default %s", h.JournalPath(), JournalPath(root))
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestHookDisabled(t *testing.T) {
	root := t.TempDir()
	b := &recordingBackend{}
	for name, h := range map[string]*Hook{
		"off with a backend": must(NewHook(Info{StateRoot: root}, &Options{Off: true, Backend: b})),
		"off":                must(NewHook(Info{StateRoot: root}, &Options{Off: true})),
		"nil hook":           nil,
	} {
		t.Run(name, func(t *testing.T) {
			h.PrepareSession(context.Background(), "s")
			h.AfterTurn(context.Background(), TurnInfo{SessionID: "s", UserMessage: "secret"})
			if h.Enabled() || h.JournalPath() != "" || h.FirstPromptNote() != "" || h.Stats() != (Stats{}) {
				t.Errorf("disabled hook: enabled %v, path %q, note %q, stats %+v", h.Enabled(), h.JournalPath(), h.FirstPromptNote(), h.Stats())
			}
			if err := h.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	if len(b.recs)+len(b.prepared)+len(b.ctxErrs) != 0 {
		t.Errorf("disabled hook called the backend: %+v", b)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("disabled hook wrote %v", entries)
	}
}

func must(h *Hook, err error) *Hook {
	if err != nil {
		panic(err)
	}
	return h
}

func TestHookFailuresAreLoggedNotReturned(t *testing.T) {
	logger, logs := newLogger()
	b := &recordingBackend{err: errors.New("disk on fire")}
	h, err := NewHook(Info{}, &Options{Backend: b, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.PrepareSession(ctx, "s9")
	h.AfterTurn(ctx, TurnInfo{SessionID: "s9", UserMessage: "my password is hunter2"})
	if s := h.Stats(); s != (Stats{Failed: 1, PrepareFailed: 1}) {
		t.Errorf("Stats = %+v, want 1 failed append and 1 failed prepare", s)
	}
	out := logs.String()
	for _, want := range []string{"disk on fire", "sessionId=s9", "record not appended", "preparing the session failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter2") {
		t.Errorf("log carries the message text:\n%s", out)
	}

	b.err, b.panicMsg = nil, "backend bug"
	h.AfterTurn(ctx, TurnInfo{SessionID: "s9"})
	if s := h.Stats(); s.Failed != 2 || !strings.Contains(logs.String(), "backend bug") {
		t.Errorf("panic: Stats = %+v, log:\n%s", s, logs.String())
	}
}

// TestHookRecordsCanceledTurn: a turn that failed because its context was
// canceled is still recorded, with a live context.
func TestHookRecordsCanceledTurn(t *testing.T) {
	b := &recordingBackend{}
	h, err := NewHook(Info{}, &Options{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.AfterTurn(ctx, TurnInfo{SessionID: "s", Err: ctx.Err()})
	if len(b.recs) != 1 || b.recs[0].Status != StatusFailed || b.ctxErrs[0] != nil {
		t.Errorf("records %+v, ctx errors %v: want one failed record appended with a live context", b.recs, b.ctxErrs)
	}
}

func TestNewHookErrors(t *testing.T) {
	if _, err := NewHook(Info{}, nil); err == nil || !strings.Contains(err.Error(), "StateRoot") {
		t.Errorf("default journal without a state root: err = %v, want one naming StateRoot", err)
	}
	if _, err := NewHook(Info{StateRoot: t.TempDir()}, &Options{MaxTextLength: -1}); err == nil || !strings.Contains(err.Error(), "MaxTextLength") {
		t.Errorf("negative MaxTextLength: err = %v", err)
	}
	h, err := NewHook(Info{StateRoot: t.TempDir()}, &Options{})
	if err != nil || h.maxText != DefaultMaxTextLength {
		t.Errorf("MaxTextLength 0: %v, cut %d, want the default", err, h.maxText)
	}
}

func TestHookConcurrentSessions(t *testing.T) {
	root := t.TempDir()
	h, err := NewHook(Info{StateRoot: root}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	want := map[string]int{}
	var wg sync.WaitGroup
	for s := range 8 {
		sid := string(rune('a' + s))
		want[sid] = 50
		wg.Go(func() {
			h.PrepareSession(context.Background(), sid)
			for n := range 50 {
				r := turnRecord(sid, n)
				h.AfterTurn(context.Background(), TurnInfo{SessionID: sid, UserMessage: r.UserMessage})
			}
		})
	}
	wg.Wait()
	recs, _ := readJournal(t, Dir(root), DefaultRotateSize)
	checkSessions(t, recs, want)
	if s := h.Stats(); s != (Stats{Appended: 400}) {
		t.Errorf("Stats = %+v", s)
	}
}

func TestZeroOptionsMeanMemoryOn(t *testing.T) {
	h, err := NewHook(Info{StateRoot: t.TempDir()}, &Options{MaxTextLength: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !h.Enabled() {
		t.Fatal("Options with only MaxTextLength set turned memory off; only Off may")
	}
}
