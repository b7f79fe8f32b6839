// Package model is the one small interface agentkit's turn loop talks to a
// language model through, and its providers: Echo (deterministic, no
// network, the default; scriptable from tests to call tools) and OpenAI (any
// OpenAI-compatible Chat Completions endpoint).
package model

import (
	"context"
	"encoding/json"
)

// Roles of a Message.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one entry of the conversation sent to a model.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content,omitempty"`
	// ToolCalls are the calls an assistant message asks for.
	ToolCalls []ToolCall `json:"toolCalls,omitempty"`
	// ToolCallID links a tool message to the call it answers.
	ToolCallID string `json:"toolCallId,omitempty"`
	// Name is the tool's name on a tool message.
	Name string `json:"name,omitempty"`
}

// ToolCall is a model's request to run one tool.
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is the JSON object of arguments the model produced. It may
	// be malformed; the turn loop reports that back to the model as the
	// tool's result.
	Arguments json.RawMessage `json:"arguments"`
}

// ToolSpec describes a tool to the model.
type ToolSpec struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Parameters is the JSON Schema of the arguments object.
	Parameters json.RawMessage `json:"parameters"`
}

// Usage counts the tokens of one model call, or summed over a turn.
type Usage struct {
	InputTokens      int64 `json:"inputTokens"`
	OutputTokens     int64 `json:"outputTokens"`
	CacheReadTokens  int64 `json:"cacheReadTokens"`
	CacheWriteTokens int64 `json:"cacheWriteTokens"`
}

// Add returns the sum of u and v.
func (u Usage) Add(v Usage) Usage {
	return Usage{
		InputTokens:      u.InputTokens + v.InputTokens,
		OutputTokens:     u.OutputTokens + v.OutputTokens,
		CacheReadTokens:  u.CacheReadTokens + v.CacheReadTokens,
		CacheWriteTokens: u.CacheWriteTokens + v.CacheWriteTokens,
	}
}

// Request is one call to a model: the conversation so far and the tools it
// may call. A model reads it and must not change it: Messages may share
// memory with the caller's kept conversation (the runtime's does).
type Request struct {
	Messages []Message
	Tools    []ToolSpec
}

// Response is the model's answer: an assistant message with text, tool
// calls, or both, and the call's token usage.
type Response struct {
	Message Message
	Usage   Usage
}

// Model generates the next assistant message. Implementations are safe for
// concurrent use and honour ctx's deadline.
type Model interface {
	// Name identifies the model in logs and /v1/info, such as "echo" or
	// "openai:gpt-4o-mini".
	Name() string
	Generate(ctx context.Context, req Request) (Response, error)
}
