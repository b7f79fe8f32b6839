// Package tool defines what a tool is to agentkit's turn loop, and the
// environment every tool and Go handler receives: the session, its
// workspace, host KV, host files, reminders, the session's actor and a
// logger.
//
// It sits below the runtime (package agent) and the built-in tools (package
// workspace) so both can use it without importing each other.
package tool

import (
	"context"
	"encoding/json"
	"iter"
	"log/slog"
	"os"
	"time"

	"agentkit/model"
)

// Tool is one capability the model can call.
type Tool struct {
	// Spec is what the model sees: name, description, JSON Schema of the
	// arguments.
	Spec model.ToolSpec
	// Run executes a call. The string result goes back to the model. An
	// error also goes back to the model, as the tool's result text, so it
	// can correct itself; it does not fail the turn.
	Run func(ctx context.Context, env *Env, args json.RawMessage) (string, error)
}

// Env is what a tool or handler receives besides its context.
type Env struct {
	// SessionID and ChannelID name the session the turn belongs to.
	SessionID string
	ChannelID string
	// Workspace is the session's workspace folder, confined: paths that
	// would leave it fail.
	Workspace *os.Root
	// KV is host KV: the agent's own key-value data in the configured
	// store. Writes are awaited and their errors returned.
	KV HostKV
	// Files is the agent's host-files folder, for larger blobs, confined
	// like Workspace.
	Files *os.Root
	// Reminders schedules follow-up turns in this session.
	Reminders Scheduler
	// Actor is the session's actor: its durable JSON state, messages,
	// events and scheduled tasks.
	Actor Actor
	// Logger is the turn's logger, carrying the session id.
	Logger *slog.Logger
	// IdempotencyKey is this tool call's key, "{sessionId}/{turn}/{n}":
	// n counts the turn's tool calls from 1. In serving mode ledger the
	// turn number is the commit sequence the turn commits as
	// ({commitSeq+1} of the session when the turn started), so every
	// attempt of a turn (after a crash, a takeover, a failed attempt) gives
	// the same call the same key: pass it to the systems a tool changes
	// (payments, e-mail, tickets) so a retried turn does its work once.
	IdempotencyKey string
}

// HostKV is the agent's own key-value data. Keys are the author's own: the
// runtime adds the agentkit/v1/{agent}/kv/ prefix and encodes the key.
type HostKV interface {
	Put(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	// List yields the author keys starting with prefix, with their values,
	// in ascending order of the stored (encoded) keys.
	List(ctx context.Context, prefix string) iter.Seq2[KVEntry, error]
}

// KVEntry is one host KV entry, keyed by the author's own key.
type KVEntry struct {
	Key   string
	Value []byte
}

// Scheduler schedules a reminder: a follow-up turn with message in the
// current session at time at. It returns the reminder's id.
type Scheduler interface {
	Schedule(ctx context.Context, at time.Time, message string) (string, error)
}
