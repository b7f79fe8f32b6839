package memory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"
)

// AppendTimeout bounds one AppendTurn or PrepareSession call made by a Hook.
const AppendTimeout = 10 * time.Second

// Options configures a Hook. The zero Options (and nil) mean the defaults:
// memory on, the default cut, the default journal.
type Options struct {
	// Off turns the hook off: the one switch. The config key
	// `memory: false` in agentkit.yaml sets it. Turning memory off stops
	// new records and leaves existing ones.
	Off bool
	// MaxTextLength cuts userMessage and result to this many characters
	// (runes); the title is kept whole. 0 means DefaultMaxTextLength;
	// negative values are an error.
	MaxTextLength int
	// Backend receives the records. nil means a Journal at
	// Dir(info.StateRoot) with default JournalOptions, which the Hook
	// owns and closes in Close. A Backend given here is the caller's to
	// close.
	Backend MemoryBackend
	// Logger receives append and prepare failures; nil means
	// slog.Default(). Logs carry the session id, status and error, never
	// the message text.
	Logger *slog.Logger
}

// DefaultOptions returns the options of a new project: memory on, cut at
// DefaultMaxTextLength, the default journal.
func DefaultOptions() Options {
	return Options{MaxTextLength: DefaultMaxTextLength}
}

// Stats counts what a Hook has done since it was made.
type Stats struct {
	// Appended is the number of records a backend accepted.
	Appended int64
	// Failed is the number of AppendTurn calls that returned an error or
	// panicked. Such a record may be lost (or, for a Journal whose
	// rotation failed, written to the current file).
	Failed int64
	// PrepareFailed is the number of PrepareSession calls that returned an
	// error or panicked.
	PrepareFailed int64
}

// Hook is the advisory wrapper the runtime calls around turns: PrepareSession
// when a session starts and AfterTurn after every turn that completes or
// fails. Neither returns an error: memory never fails a session or a turn.
// Failures are logged and counted (Stats). A Hook is safe for concurrent
// use. A nil *Hook is a disabled hook.
type Hook struct {
	info    Info
	enabled bool
	maxText int
	backend MemoryBackend
	owned   io.Closer // the default journal, closed by Close
	log     *slog.Logger

	appended, failed, prepareFailed atomic.Int64
}

// NewHook returns the hook for the agent and state root in info. nil opts
// means DefaultOptions(). With memory enabled and no Backend, info.StateRoot
// must be set; the default journal touches the disk only when the first
// session starts or the first record is appended.
func NewHook(info Info, opts *Options) (*Hook, error) {
	if opts == nil {
		d := DefaultOptions()
		opts = &d
	}
	if opts.MaxTextLength < 0 {
		return nil, fmt.Errorf("memory: MaxTextLength is %d; use a positive number of characters, or 0 for the default %d", opts.MaxTextLength, DefaultMaxTextLength)
	}
	h := &Hook{
		info:    info,
		enabled: !opts.Off,
		maxText: opts.MaxTextLength,
		backend: opts.Backend,
		log:     opts.Logger,
	}
	if h.maxText == 0 {
		h.maxText = DefaultMaxTextLength
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.enabled && h.backend == nil {
		if info.StateRoot == "" {
			return nil, errors.New("memory: the default journal needs a state root; set Info.StateRoot, pass a Backend, or disable memory")
		}
		j, err := NewJournal(Dir(info.StateRoot), nil)
		if err != nil {
			return nil, err
		}
		h.backend, h.owned = j, j
	}
	return h, nil
}

// Enabled reports whether the hook records turns.
func (h *Hook) Enabled() bool { return h != nil && h.enabled }

// JournalPath returns the default journal's path under the state root, or
// "" when memory is off. It names the default journal even when a custom
// Backend is in use (the workspace's memory/ view shows that folder too).
func (h *Hook) JournalPath() string {
	if !h.Enabled() {
		return ""
	}
	return JournalPath(h.info.StateRoot)
}

// WorkspaceJournalPath returns the journal's path in a session workspace
// (WorkspaceJournalPath), or "" when memory is off.
func (h *Hook) WorkspaceJournalPath() string {
	if !h.Enabled() {
		return ""
	}
	return WorkspaceJournalPath
}

// FirstPromptNote returns the sentence to add to the first prompt of each
// session (the package-level FirstPromptNote for WorkspaceJournalPath, the
// path the model's file tools read), or "" when memory is off.
func (h *Hook) FirstPromptNote() string {
	if !h.Enabled() {
		return ""
	}
	return FirstPromptNote(WorkspaceJournalPath)
}

// PrepareSession runs the backend's PrepareSession, if it has one, when
// session sessionID starts. An error is logged and counted; the session
// goes on. ctx's cancellation is not passed on (AppendTimeout bounds the
// call).
func (h *Hook) PrepareSession(ctx context.Context, sessionID string) {
	if !h.Enabled() {
		return
	}
	p, ok := h.backend.(SessionPreparer)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AppendTimeout)
	defer cancel()
	if err := guard(func() error { return p.PrepareSession(ctx, h.info) }); err != nil {
		h.prepareFailed.Add(1)
		h.log.LogAttrs(ctx, slog.LevelWarn, "memory: preparing the session failed",
			slog.String("sessionId", sessionID), slog.Any("error", err))
	}
}

// AfterTurn records a finished turn (NewRecord with the hook's
// MaxTextLength) through the backend. An error is logged and counted, never
// returned: the turn's outcome does not depend on memory. ctx's
// cancellation is not passed on, so a turn that failed because its context
// was canceled is still recorded; AppendTimeout bounds the call.
func (h *Hook) AfterTurn(ctx context.Context, t TurnInfo) {
	if !h.Enabled() {
		return
	}
	rec := NewRecord(t, h.maxText)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AppendTimeout)
	defer cancel()
	if err := guard(func() error { return h.backend.AppendTurn(ctx, rec, h.info) }); err != nil {
		h.failed.Add(1)
		h.log.LogAttrs(ctx, slog.LevelWarn, "memory: record not appended",
			slog.String("sessionId", rec.SessionID), slog.String("status", rec.Status), slog.Any("error", err))
		return
	}
	h.appended.Add(1)
}

// Stats returns the hook's counters.
func (h *Hook) Stats() Stats {
	if h == nil {
		return Stats{}
	}
	return Stats{
		Appended:      h.appended.Load(),
		Failed:        h.failed.Load(),
		PrepareFailed: h.prepareFailed.Load(),
	}
}

// Close closes the default journal if the hook made one. Later AfterTurn
// calls fail (and are logged and counted).
func (h *Hook) Close() error {
	if h == nil || h.owned == nil {
		return nil
	}
	return h.owned.Close()
}

// guard runs f, turning a panic into an error: a broken backend must not
// take the turn down with it.
func guard(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("memory: backend panicked: %v", r)
		}
	}()
	return f()
}
