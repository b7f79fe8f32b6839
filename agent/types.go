package agent

import (
	"encoding/json"
	"time"

	"agentkit/model"
	"agentkit/storage"
)

// StartRequest starts a session with its first turn.
type StartRequest struct {
	// Message is the user's first message. Required.
	Message string
	// ChannelID names the channel starting the session; empty means
	// "http".
	ChannelID string
	// Title is an optional title for the session.
	Title string
	// WorkspaceFiles are written into the session workspace before the
	// turn, path (slash-separated, relative) to content. Paths under
	// memory/ are refused.
	WorkspaceFiles map[string]string
	// OnEvent, when set, receives the turn's progress events as they are
	// recorded, in order, from the turn's goroutine; it should return
	// quickly, as the turn waits for it. The session id is in every event,
	// so a server can stream a new session's first turn.
	OnEvent func(Event)
	// IdempotencyKey, when set, names the request: a retry with the same
	// key and the same fields gets the first turn's answer (and its events
	// through OnEvent) instead of starting a second session, here or after
	// a restart; with other fields it is ErrKeyReused; while the first
	// runs, ErrKeyInUse. 1 to MaxIdempotencyKeyLen printable ASCII
	// characters, such as a random UUID.
	IdempotencyKey string
}

// ContinueRequest runs a follow-up turn in the session a continuation
// token names.
type ContinueRequest struct {
	// Token is the continuation token of an earlier turn. Required.
	Token string
	// Message is the user's message. Required.
	Message string
	// WorkspaceFiles are written into the session workspace before the
	// turn, as in StartRequest.
	WorkspaceFiles map[string]string
	// OnEvent receives the turn's progress events, as in StartRequest.
	OnEvent func(Event)
	// IdempotencyKey names the request, as in StartRequest: a retry gets
	// the first turn's answer instead of running a second turn. A key first
	// sent for another session is ErrKeyReused.
	IdempotencyKey string
	// NoWait makes a follow-up that finds its session running another turn
	// fail at once with ErrBusy, instead of waiting (until ctx ends) for
	// that turn to finish. The HTTP server sets it: a busy session answers
	// 409 at once.
	NoWait bool
	// IfLastSeq, when not zero, is the sequence number of the last event
	// of the session the client saw (a TurnResult's LastSeq, or the last
	// of Events): the turn runs only if the session still ends there, else
	// the answer is a *PositionError matching ErrPreconditionFailed and
	// nothing runs. In serving mode local, a turn that runs and then loses
	// the session head to a turn another host committed at the same time
	// is recorded as a fork (EventTurnForked) and answered with a
	// *PositionError matching ErrTurnForked; without IfLastSeq it is
	// answered as completed, and the fork is in the session's history all
	// the same. A store that does not answer makes a request with
	// IfLastSeq fail with ErrStoreUnavailable, as its precondition cannot
	// be checked. In serving mode ledger turns never fork, and the
	// precondition is checked against the committed transcript when the
	// message is queued (messages queued before it run first).
	IfLastSeq int64
}

// TurnResult is the answer to StartSession and Continue.
type TurnResult struct {
	SessionID string `json:"sessionId"`
	// ContinuationToken names the session for a follow-up, for the
	// session's life: a start's answer carries the session's first token
	// (a replayed start a new one), a follow-up's the token it was sent
	// with. Only its digest is stored.
	ContinuationToken string `json:"continuationToken"`
	Turn              Turn   `json:"turn"`
	// LastSeq is the sequence number of the turn's last event
	// (turn.finished): what a follow-up sends as IfLastSeq to run only
	// if nothing happened in the session since. Zero when the turn is not
	// part of the answer (Queued).
	LastSeq int64 `json:"lastSeq,omitempty"`
	// Replayed is true when the answer is that of an earlier request with
	// the same IdempotencyKey, not of a turn run now.
	Replayed bool `json:"-"`
	// Queued is true, in serving mode ledger, when the message was
	// accepted into the session's queue but its turn is not part of the
	// answer: another host holds the session, or the wait for the turn
	// ended first (the runtime closing, ctx ending). Turn is then empty;
	// the turn that consumes the message is found by EventID among the
	// session's events (its turn.started event), on any host. The HTTP
	// server answers 202.
	Queued bool `json:"-"`
	// EventID names the message in serving mode ledger: the request's
	// IdempotencyKey, or an id the runtime made. Empty in serving mode
	// local.
	EventID string `json:"-"`
}

// Turn is how one turn ended.
type Turn struct {
	Status TurnStatus `json:"status"`
	// Result is the final assistant text, or the failure message.
	Result string      `json:"result"`
	Usage  model.Usage `json:"usage"`

	// Retryable is true when the turn failed on a model error that may
	// pass by itself, a rate limit (429) or a server error (5xx): the same
	// message may succeed later.
	Retryable bool `json:"retryable,omitempty"`
}

// Session is a session's metadata.
type Session struct {
	ID        string    `json:"id"`
	ChannelID string    `json:"channelId"`
	Title     string    `json:"title,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// Turns counts the turns run, failed ones included.
	Turns int64 `json:"turns"`
	// LastSeq is the sequence number of the newest event.
	LastSeq int64 `json:"lastSeq"`
	// LastStatus is how the newest turn ended; empty before any.
	LastStatus TurnStatus `json:"lastStatus,omitempty"`
}

// SessionPage is one page of ListSessions.
type SessionPage struct {
	Sessions []Session `json:"sessions"`
	// NextCursor continues the listing; empty on the last page.
	NextCursor string `json:"nextCursor,omitempty"`
}

// Event types, in the order a turn records them.
const (
	// EventTurnStarted: Message, Source, and on a session's first turn Note
	// and Experiments.
	EventTurnStarted = "turn.started"
	// EventModelCall: Step, Text, ToolCalls, Usage of one model call.
	EventModelCall = "model.call"
	// EventToolCall: Step, ToolCallID, Tool, Arguments.
	EventToolCall = "tool.call"
	// EventToolResult: Step, ToolCallID, Tool, Output, IsError.
	EventToolResult = "tool.result"
	// EventTurnFinished: Status, Result, Usage (summed), DurationMS.
	EventTurnFinished = "turn.finished"
	// EventTurnForked, in serving mode local, records turns of this
	// session that ran on one host while another host committed other
	// turns from the same point (two hosts continuing one session at
	// once): ForkedAfter is the seq of the last event both shared, LostTo
	// the host whose turns the session went on with, Forked the forked
	// turns' events as they were recorded (their own seqs), and Message,
	// Status and Result those of the last forked turn. It is a turn of
	// its own in the session's history, so every host lists and streams
	// it, and the model's conversation includes the forked turns' messages
	// and answers at its place.
	EventTurnForked = "turn.forked"
)

// Event is one entry of a session's event log: a step of a turn. Events
// are numbered from 1 per session (Seq) and kept in order. Fields beyond
// the first five are set by the event types that use them.
type Event struct {
	SessionID string    `json:"sessionId"`
	Seq       int64     `json:"seq"`
	Type      string    `json:"type"`
	At        time.Time `json:"at"`
	// Turn is the turn's number in the session, from 1.
	Turn int64 `json:"turn"`

	Source  string `json:"source,omitempty"`
	Message string `json:"message,omitempty"`
	// Note is the first-prompt note (hooks, memory journal path) recorded
	// by a session's first turn.started event.
	Note       string           `json:"note,omitempty"`
	Step       int              `json:"step,omitempty"`
	Text       string           `json:"text,omitempty"`
	ToolCalls  []model.ToolCall `json:"toolCalls,omitempty"`
	ToolCallID string           `json:"toolCallId,omitempty"`
	Tool       string           `json:"tool,omitempty"`
	Arguments  json.RawMessage  `json:"arguments,omitempty"`
	Output     string           `json:"output,omitempty"`
	IsError    bool             `json:"isError,omitempty"`
	Status     TurnStatus       `json:"status,omitempty"`
	Result     string           `json:"result,omitempty"`
	Usage      *model.Usage     `json:"usage,omitempty"`
	DurationMS int64            `json:"durationMs,omitempty"`

	// Experiments maps each A/B experiment the session is enrolled in to
	// its variant, on the session's first turn.started event: the source
	// of truth of the session's enrolment.
	Experiments map[string]string `json:"experiments,omitempty"`

	// Idempotency is the client's Idempotency-Key, on the turn.started
	// event of a turn that a keyed request started.
	Idempotency *Idempotency `json:"idempotency,omitempty"`

	// ForkedAfter, LostTo and Forked are the fields of a turn.forked
	// event (EventTurnForked).
	ForkedAfter int64             `json:"forkedAfter,omitempty"`
	LostTo      string            `json:"lostTo,omitempty"`
	Forked      []json.RawMessage `json:"forked,omitempty"`

	// EventID is, in serving mode ledger, the id of the message the turn
	// consumed (the request's Idempotency-Key, the eventId of a 202
	// answer, or "reminder/{id}"), on its turn.started event: a client
	// holding a 202's eventId finds its turn by it, on any host.
	EventID string `json:"eventId,omitempty"`
}

// EventPage is one page of Events.
type EventPage struct {
	Events []Event `json:"events"`
	// Next is the afterSeq of the next page: the last event's Seq, or the
	// afterSeq asked for when the page is empty.
	Next int64 `json:"next"`
	// More is true when events after this page exist.
	More bool `json:"more"`
}

// Reminder is a follow-up turn scheduled for a time.
type Reminder struct {
	ID        string    `json:"id"`
	SessionID string    `json:"sessionId"`
	At        time.Time `json:"at"`
	Message   string    `json:"message"`
	// State is "pending", "claimed", "fired" or "failed".
	State string `json:"state"`
	// FiredAt is when the reminder reached fired or failed.
	FiredAt time.Time `json:"firedAt,omitzero"`
}

// ReminderRequest creates a reminder.
type ReminderRequest struct {
	SessionID string
	// At is when to fire. The zero time with Delay set means now + Delay.
	At    time.Time
	Delay time.Duration
	// Message is the follow-up turn's user message. Required.
	Message string
}

// Info describes the running agent, for GET /v1/info.
type Info struct {
	Agent   string `json:"agent"`
	Model   string `json:"model"`
	Serving string `json:"serving"`
	// StateRoot is the state root's absolute path. It is not sent to API
	// clients: a host's paths are the operator's business.
	StateRoot string `json:"-"`
	MaxSteps  int    `json:"maxSteps"`
	// Storage is the store's name, capabilities, table modes and the
	// policy in force (defaults filled in).
	Storage storage.Report `json:"storage"`
	// DefaultStore is true for the embedded default store under the state
	// root (in sessions/sessions.db).
	DefaultStore bool `json:"defaultStore"`
	Memory       bool `json:"memory"`
	// JournalPath is the memory journal's path in a session workspace
	// (memory/journal.jsonl, where the model's file tools read it), empty
	// with memory off. Its host path is memory.JournalPath(StateRoot).
	JournalPath string `json:"journalPath,omitempty"`
	// MirrorDropped counts mirror writes the store refused since Open (the
	// name is older than the retries): each was kept and retried.
	MirrorDropped int64 `json:"mirrorDropped"`
	// ABSamplesDropped counts A/B samples the store refused since Open:
	// the one record written at most once, so each was lost (the figures
	// of an experiment then miss that turn).
	ABSamplesDropped uint64 `json:"abSamplesDropped"`
	// MirrorBacklog is the number of sessions whose mirror writes wait to
	// be retried.
	MirrorBacklog int `json:"mirrorBacklog"`
	// MirrorForks counts the turns of this host that lost the session
	// head to another host since Open; their events are kept here as
	// forks.
	MirrorForks int64 `json:"mirrorForks"`
	// HostID names this host in the session heads and reminder claims it
	// writes (the state root's HOST_ID). It is not served over HTTP: it
	// holds the host name.
	HostID string `json:"-"`
}
