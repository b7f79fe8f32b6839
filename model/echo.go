package model

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/template"
	"time"
)

// EchoName is the name Echo reports.
const EchoName = "echo"

// DefaultEchoReply is the reply template Echo uses when it has no script, and
// after a script runs out of steps: it echoes the turn's user message.
const DefaultEchoReply = "echo: {{.UserMessage}}"

// ErrScripted is matched (errors.Is) by the error a scripted failure step
// returns.
var ErrScripted = errors.New("echo: scripted failure")

// EchoConfig is Echo's configuration, as it appears in agentkit.yaml under
// model.echo, or built by a test.
//
// A script runs once per turn (a turn starts at the latest user message):
// the model's first call in the turn runs Script[0], its second call
// Script[1], and so on. Echo keeps no state: the position in the script is
// the number of assistant messages after the latest user message, so one
// Echo serves any number of sessions at once. When the script has no step
// left, Echo answers with Reply.
//
// Text fields are Go text/template templates over EchoData: Text, Reply,
// Error, and every string (at any depth) inside Args. For example, the
// following script reads the memory journal on every turn and answers with
// what the tool returned:
//
//	script:
//	  - tool: read_file
//	    args: {path: memory/journal.jsonl}
//	  - text: "{{.LastToolResult}}"
type EchoConfig struct {
	// Script is the steps of each turn, in order.
	Script []EchoStep `json:"script,omitempty" yaml:"script,omitempty"`
	// Reply is the final answer once the script has no step left; empty
	// means DefaultEchoReply.
	Reply string `json:"reply,omitempty" yaml:"reply,omitempty"`
}

// EchoStep is one step of an Echo script. Exactly one of Tool, Text and
// Error is set.
type EchoStep struct {
	// Tool makes the step a tool call: the name of the tool to call.
	Tool string `json:"tool,omitempty" yaml:"tool,omitempty"`
	// Args are the tool call's arguments, sent as a JSON object. String
	// values are templates.
	Args map[string]any `json:"args,omitempty" yaml:"args,omitempty"`
	// Text makes the step a final answer (a template). It ends the turn.
	Text string `json:"text,omitempty" yaml:"text,omitempty"`
	// Error makes the step fail: Generate returns an error matching
	// ErrScripted whose text is this template's output. The turn fails.
	Error string `json:"error,omitempty" yaml:"error,omitempty"`
	// Delay, a Go duration such as "250ms", makes Generate wait that long
	// before answering (or until ctx ends), to exercise slow models.
	Delay string `json:"delay,omitempty" yaml:"delay,omitempty"`
}

// EchoData is what Echo's templates see.
type EchoData struct {
	// UserMessage is the latest user message: the one that started the
	// turn.
	UserMessage string
	// LastToolResult is the content of the latest tool message in the turn,
	// or "" before any tool ran.
	LastToolResult string
	// ToolResults are the contents of the turn's tool messages, in order.
	ToolResults []string
	// Step is the 0-based index of the step running.
	Step int
	// Turn is the number of user messages in the conversation (1 on the
	// first turn).
	Turn int
}

// Echo is the deterministic model: no network, same answer for the same
// conversation. It is agentkit's default model. Safe for concurrent use.
//
// Usage is derived from text lengths, one token per four bytes rounded up
// (tokens(s) = (len(s)+3)/4), counted over message contents and tool call
// arguments:
//   - InputTokens: every message of the request;
//   - OutputTokens: the answer's text and tool call arguments;
//   - CacheReadTokens: every request message but the last (the prefix an
//     earlier call already sent);
//   - CacheWriteTokens: the last request message (newly cached).
type Echo struct {
	steps []echoStep
	reply *template.Template
}

type echoStep struct {
	src   EchoStep
	delay time.Duration
	text  *template.Template // Text or Error
	args  any                // Args with string leaves parsed as templates
}

var _ Model = (*Echo)(nil)

// NewEcho returns an Echo running the script in cfg. A nil cfg (or an empty
// script) gives the plain echo model. It fails when a step is malformed or
// a template does not parse, naming the step.
func NewEcho(cfg *EchoConfig) (*Echo, error) {
	if cfg == nil {
		cfg = &EchoConfig{}
	}
	e := &Echo{}
	reply := cfg.Reply
	if reply == "" {
		reply = DefaultEchoReply
	}
	var err error
	if e.reply, err = parseEchoTemplate("reply", reply); err != nil {
		return nil, err
	}
	for i, s := range cfg.Script {
		where := fmt.Sprintf("echo script step %d", i+1)
		n := 0
		for _, set := range []bool{s.Tool != "", s.Text != "", s.Error != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			return nil, fmt.Errorf("%s: set exactly one of tool, text and error (found %d)", where, n)
		}
		if s.Args != nil && s.Tool == "" {
			return nil, fmt.Errorf("%s: args belong to a tool step; add tool or remove args", where)
		}
		st := echoStep{src: s}
		if s.Delay != "" {
			if st.delay, err = time.ParseDuration(s.Delay); err != nil || st.delay < 0 {
				return nil, fmt.Errorf("%s: delay %q is not a non-negative Go duration such as 250ms or 2s", where, s.Delay)
			}
		}
		switch {
		case s.Tool != "":
			if st.args, err = parseArgs(where+" args", s.Args); err != nil {
				return nil, err
			}
		case s.Text != "":
			st.text, err = parseEchoTemplate(where+" text", s.Text)
		default:
			st.text, err = parseEchoTemplate(where+" error", s.Error)
		}
		if err != nil {
			return nil, err
		}
		e.steps = append(e.steps, st)
	}
	return e, nil
}

var echoFuncs = template.FuncMap{
	// json quotes a value as JSON, for templates that build JSON text.
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
}

func parseEchoTemplate(where, text string) (*template.Template, error) {
	t, err := template.New(where).Funcs(echoFuncs).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%s: the template does not parse: %w", where, err)
	}
	return t, nil
}

// parseArgs copies v, turning every string into a parsed template.
func parseArgs(where string, v any) (any, error) {
	switch v := v.(type) {
	case string:
		return parseEchoTemplate(where, v)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			p, err := parseArgs(where+"."+k, x)
			if err != nil {
				return nil, err
			}
			out[k] = p
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			p, err := parseArgs(fmt.Sprintf("%s[%d]", where, i), x)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	default:
		return v, nil
	}
}

// expandArgs executes the templates parseArgs made.
func expandArgs(v any, data *EchoData) (any, error) {
	switch v := v.(type) {
	case *template.Template:
		return execTemplate(v, data)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			p, err := expandArgs(x, data)
			if err != nil {
				return nil, err
			}
			out[k] = p
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			p, err := expandArgs(x, data)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	default:
		return v, nil
	}
}

func execTemplate(t *template.Template, data *EchoData) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("echo: %w", err)
	}
	return b.String(), nil
}

// Name returns "echo".
func (e *Echo) Name() string { return EchoName }

// Generate answers the next step of the script for the conversation in req.
func (e *Echo) Generate(ctx context.Context, req Request) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	data := echoState(req.Messages)
	var msg Message
	msg.Role = RoleAssistant
	if data.Step >= len(e.steps) {
		text, err := execTemplate(e.reply, &data)
		if err != nil {
			return Response{}, err
		}
		msg.Content = text
		return Response{Message: msg, Usage: echoUsage(req.Messages, msg)}, nil
	}
	st := e.steps[data.Step]
	if st.delay > 0 {
		t := time.NewTimer(st.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return Response{}, ctx.Err()
		case <-t.C:
		}
	}
	switch {
	case st.src.Tool != "":
		args, err := expandArgs(st.args, &data)
		if err != nil {
			return Response{}, err
		}
		if args == nil {
			args = map[string]any{}
		}
		raw, err := json.Marshal(args)
		if err != nil {
			return Response{}, fmt.Errorf("echo: step %d args: %w", data.Step+1, err)
		}
		msg.ToolCalls = []ToolCall{{
			ID:        "echo-" + strconv.Itoa(data.Turn) + "-" + strconv.Itoa(data.Step+1),
			Name:      st.src.Tool,
			Arguments: raw,
		}}
	case st.src.Text != "":
		text, err := execTemplate(st.text, &data)
		if err != nil {
			return Response{}, err
		}
		msg.Content = text
	default:
		text, err := execTemplate(st.text, &data)
		if err != nil {
			return Response{}, err
		}
		return Response{}, fmt.Errorf("%w: %s", ErrScripted, text)
	}
	return Response{Message: msg, Usage: echoUsage(req.Messages, msg)}, nil
}

// echoState reads the turn's position out of the conversation.
func echoState(msgs []Message) EchoData {
	var d EchoData
	last := -1
	for i, m := range msgs {
		if m.Role == RoleUser {
			last = i
			d.Turn++
		}
	}
	if last < 0 {
		return d
	}
	d.UserMessage = msgs[last].Content
	for _, m := range msgs[last+1:] {
		switch m.Role {
		case RoleAssistant:
			d.Step++
		case RoleTool:
			d.ToolResults = append(d.ToolResults, m.Content)
			d.LastToolResult = m.Content
		}
	}
	return d
}

// echoTokens is Echo's token estimate of a text.
func echoTokens(s string) int64 { return int64((len(s) + 3) / 4) }

func messageTokens(m Message) int64 {
	n := echoTokens(m.Content)
	for _, c := range m.ToolCalls {
		n += echoTokens(c.Name) + echoTokens(string(c.Arguments))
	}
	return n
}

func echoUsage(req []Message, out Message) Usage {
	var u Usage
	for i, m := range req {
		t := messageTokens(m)
		u.InputTokens += t
		if i == len(req)-1 {
			u.CacheWriteTokens = t
		} else {
			u.CacheReadTokens += t
		}
	}
	u.OutputTokens = messageTokens(out)
	return u
}
