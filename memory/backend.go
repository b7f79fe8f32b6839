// Package memory is agentkit's per-turn memory journal.
//
// After every turn that completes or fails, the runtime calls
// Hook.AfterTurn, which builds a Record and hands it to a MemoryBackend. The
// default backend, Journal, appends the record as one JSON line to
// --state-root/memory/journal.jsonl and moves the file aside to
// journal-<timestamp>.jsonl when it grows past a size threshold. The model
// has no recall tool: the instructions (InstructionsSection) send it to the
// read-only memory/ folder in its workspace, and the first prompt of each
// session names the journal's path (FirstPromptNote).
//
// Memory is advisory. A record may be dropped (an append error is logged and
// counted, never returned to the turn), and a record written by one session
// may show up only in a later one. State that code depends on belongs in host
// KV. Every user who can message the agent can put text into the journal,
// and one user's messages can surface in another user's session, which is
// why the model is told to treat records as untrusted history and why memory
// can be switched off (Options.Off).
package memory

import "context"

// Info says which agent and state root a backend call is for.
type Info struct {
	// StateRoot is the host's --state-root folder.
	StateRoot string
	// AgentName is the agent's name.
	AgentName string
}

// MemoryBackend receives the record of every finished turn. Records go only
// where AppendTurn sends them.
//
// AppendTurn may be called from many goroutines at once and must be safe
// for that. It should honour ctx's deadline. An error it returns is logged
// and counted by the Hook; it never fails the turn, so a backend need not
// retry. The workspace's memory/ view and FirstPromptNote keep naming the
// default journal, so a custom backend must give the model its own tool or
// file, and instructions that send it there.
type MemoryBackend interface {
	AppendTurn(ctx context.Context, rec Record, info Info) error
}

// SessionPreparer is an optional interface of a MemoryBackend. The Hook
// calls PrepareSession when a session starts, before its first turn; an
// error is logged and the session goes on.
type SessionPreparer interface {
	PrepareSession(ctx context.Context, info Info) error
}
