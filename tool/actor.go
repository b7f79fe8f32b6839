package tool

import (
	"context"
	"encoding/json"
	"time"
)

// Actor is the durable actor of a session (package actor, docs/actor.md):
// a JSON state changed by RFC 7396 merge patches, the session's messages
// and events as paged logs, and scheduled tasks that run handlers
// registered on the runtime's actor host. A change is durable when its call
// returns. The runtime fills Env.Actor with the actor of the turn's
// session; a session's actor that was never written costs no file.
type Actor interface {
	// State returns the state as JSON: {} until something is stored.
	State(ctx context.Context) (json.RawMessage, error)
	// PatchState applies patch, an RFC 7396 JSON merge patch (objects
	// merge key by key, null deletes a key, anything else replaces), and
	// returns the new state. Concurrent patches of one actor are applied
	// one after the other; none is lost. Invalid JSON is refused with an
	// error naming the line and column, and nothing is stored.
	PatchState(ctx context.Context, patch json.RawMessage) (json.RawMessage, error)
	// ReplaceState replaces the whole state with a JSON value.
	ReplaceState(ctx context.Context, state json.RawMessage) error
	// Messages returns up to limit of the session's messages (the model's
	// conversation: user, assistant and tool messages) with Seq > after,
	// oldest first. limit <= 0 or over 1,000 means 1,000. The last Seq is
	// the cursor of the next page; an empty page is the end.
	Messages(ctx context.Context, after int64, limit int) ([]Record, error)
	// Events returns up to limit of the session's events with Seq > after,
	// oldest first, paged like Messages.
	Events(ctx context.Context, after int64, limit int) ([]Record, error)
	// Schedule stores a task that calls the handler registered under
	// handler with payload (JSON; empty means null) at the time when says,
	// and returns its id. It survives restarts and runs late, once, if no
	// host ran at its time.
	Schedule(ctx context.Context, when When, handler string, payload json.RawMessage) (string, error)
	// CancelSchedule removes the task id; an unknown id is an error.
	CancelSchedule(ctx context.Context, id string) error
}

// Record is one entry of an actor's messages or events.
type Record struct {
	// Seq orders the records of one log; it is the cursor of the next
	// page. A session's messages and events share the numbers of the
	// session's events, so a message's Seq may skip numbers.
	Seq int64     `json:"seq"`
	At  time.Time `json:"at"`
	// Type is a message's role (user, assistant, tool) or an event's type
	// (turn.started, model.call, ...).
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// When says when a scheduled task runs: set one of At (a time), After (a
// delay from now) or Cron (a cron expression: five fields or a descriptor
// such as @hourly, in UTC unless it starts with CRON_TZ=Zone, run again and
// again). The zero When runs the task at once.
type When struct {
	At    time.Time
	After time.Duration
	Cron  string
}
