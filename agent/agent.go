package agent

import (
	"context"
	"time"

	"agentkit/abtest"
	"agentkit/actor"
	"agentkit/model"
	"agentkit/tool"
)

// DefaultMaxSteps is the step limit of an Agent whose MaxSteps is zero: the
// most model calls one turn may make.
const DefaultMaxSteps = 16

// Agent is an agent defined in Go: what the runtime runs for every turn.
type Agent struct {
	// Name identifies the agent; it scopes every key the runtime writes
	// (agentkit/v1/{name}/...). Required.
	Name string
	// Instructions is the system prompt (the content of instructions.md).
	Instructions string
	// Model answers the turns. Required; model.NewEcho needs no network.
	Model model.Model
	// Tools are the agent's own tools, offered to the model beside the
	// workspace file tools. Names must be unique.
	Tools []tool.Tool
	// Hooks run at points of a session's life.
	Hooks Hooks
	// DefineActors, when set, defines the agent's own actor classes and
	// registers its scheduled-task handlers on the runtime's actor host
	// (Runtime.Actors) during Open, before any task runs, so a task that
	// came due while the agent was down finds its handler.
	DefineActors func(h *actor.Host) error
	// MaxSteps caps the model calls of one turn; a turn that reaches it
	// without a final answer fails. Zero means DefaultMaxSteps.
	MaxSteps int
	// NoWorkspaceTools leaves out the built-in file tools (list, read,
	// write, search over the session workspace).
	NoWorkspaceTools bool
	// WorkspaceSeed maps workspace paths to contents copied into every new
	// session's workspace before its first turn (a project's workspace/
	// folder; see workspace.LoadDir). memory/ is reserved for the journal:
	// Open refuses a seed with a path under it.
	WorkspaceSeed map[string]string
	// Experiments are live A/B experiments (package abtest): every new
	// session but eval sessions is enrolled in each when it starts, and its
	// variant may change the instructions, the model or handler options.
	// docs/ab.md walks through one.
	Experiments []abtest.Experiment
}

// Hooks are functions the runtime calls at points of a session's life. Any
// of them may be nil. A hook's error is logged and never fails the turn.
type Hooks struct {
	// OnSessionStart runs once when a session is created, before its first
	// turn.
	OnSessionStart func(ctx context.Context, s SessionInfo) error
	// FirstPrompt returns a note added to the system prompt of the first
	// turn of each session, such as where the memory journal is. An empty
	// string adds nothing.
	FirstPrompt func(ctx context.Context, s SessionInfo) (string, error)
	// AfterTurn runs after every turn that completed or failed, once its
	// events are on local disk. The memory journal appends its record here.
	AfterTurn func(ctx context.Context, t TurnInfo) error
}

// SessionInfo describes a session to the hooks.
type SessionInfo struct {
	AgentName string
	SessionID string
	ChannelID string
	Title     string
	CreatedAt time.Time
	// StateRoot is the runtime's state root folder.
	StateRoot string
	// Workspace is the session's workspace folder.
	Workspace string
	// JournalPath is the memory journal's path, or "" with memory off.
	JournalPath string
}

// TurnStatus is how a turn ended.
type TurnStatus string

// The two ends of a turn.
const (
	StatusCompleted TurnStatus = "completed"
	StatusFailed    TurnStatus = "failed"
)

// Sources of a turn, as TurnInfo.Source and the turn.started event name
// them.
const (
	SourceAPI      = "api"      // a StartSession or Continue call
	SourceReminder = "reminder" // a reminder firing
)

// TurnInfo describes a finished turn to the AfterTurn hook.
type TurnInfo struct {
	AgentName string
	StateRoot string
	SessionID string
	ChannelID string
	Title     string
	// Turn is the turn's number in its session, from 1.
	Turn int64
	// Source is SourceAPI or SourceReminder.
	Source string
	// UserMessage is the message that started the turn.
	UserMessage string
	Status      TurnStatus
	// Result is the final assistant text, or the failure message.
	Result string
	// Usage is summed over the turn's model calls.
	Usage      model.Usage
	StartedAt  time.Time
	FinishedAt time.Time
}
