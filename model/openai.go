package model

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Defaults of OpenAIOptions.
const (
	DefaultOpenAITimeout      = 2 * time.Minute
	DefaultOpenAIMaxRetries   = 2
	DefaultOpenAIRetryBackoff = 500 * time.Millisecond
	DefaultOpenAIMaxRetryWait = 30 * time.Second
)

// Size limits on what is read from the server.
const (
	maxResponseBytes  = 32 << 20
	maxErrorBodyBytes = 64 << 10
)

// OpenAIOptions configures an OpenAI model.
type OpenAIOptions struct {
	// BaseURL is the API root, ending in /v1 for most servers, such as
	// "http://127.0.0.1:8000/v1". Requests go to BaseURL + "/chat/completions".
	BaseURL string
	// Model is the model name sent with every request, such as
	// "gpt-4o-mini" or "llama3.1".
	Model string
	// APIKeyEnv is the NAME of the environment variable holding the API key,
	// such as "OPENAI_API_KEY". The key is read once, by NewOpenAI, and sent
	// as a bearer token; it never appears in logs or errors. Empty means no
	// key (local servers).
	APIKeyEnv string
	// Timeout bounds each HTTP attempt; zero means DefaultOpenAITimeout. A
	// timed-out attempt is not retried.
	Timeout time.Duration
	// MaxRetries is how many times a rate-limited (429), failed (5xx) or
	// unreachable request is retried. Zero means DefaultOpenAIMaxRetries;
	// a negative value disables retries.
	MaxRetries int
	// RetryBackoff is the wait before the first retry, doubling after each
	// one; zero means DefaultOpenAIRetryBackoff. A Retry-After (or
	// retry-after-ms) header from the server replaces it.
	RetryBackoff time.Duration
	// MaxRetryWait caps any single wait between attempts, Retry-After
	// included; zero means DefaultOpenAIMaxRetryWait.
	MaxRetryWait time.Duration
	// HTTPClient sends the requests; nil means a new client with no overall
	// timeout (Timeout applies per attempt).
	HTTPClient *http.Client
	// Temperature, when set, is sent as "temperature".
	Temperature *float64
	// MaxTokens, when positive, is sent as "max_tokens".
	MaxTokens int
}

// OpenAI is a model served by any OpenAI-compatible Chat Completions
// endpoint: OpenAI, vLLM, Ollama, llama.cpp's server and others. Safe for
// concurrent use.
//
// Usage is read from the answer's "usage" object:
//   - InputTokens: prompt_tokens (which, on OpenAI, includes cached tokens);
//   - OutputTokens: completion_tokens;
//   - CacheReadTokens: prompt_tokens_details.cached_tokens, or, when absent,
//     the extension field cache_read_input_tokens;
//   - CacheWriteTokens: the extension field cache_creation_input_tokens
//     (reported by Anthropic-compatible proxies), or
//     prompt_tokens_details.cache_write_tokens; zero when the server reports
//     neither, as OpenAI itself does.
type OpenAI struct {
	endpoint string // BaseURL + /chat/completions
	shown    string // endpoint without credentials, for errors
	opts     OpenAIOptions
	key      string
	client   *http.Client
	// sleep waits between attempts; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

var _ Model = (*OpenAI)(nil)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// NewOpenAI checks opts and returns the model. It fails when the base URL or
// the model name is missing or malformed, or when APIKeyEnv names a variable
// that is unset or empty.
func NewOpenAI(opts OpenAIOptions) (*OpenAI, error) {
	if opts.BaseURL == "" {
		return nil, errors.New("openai: no base URL; set it to the API root, such as http://127.0.0.1:8000/v1")
	}
	u, err := url.Parse(opts.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("openai: the base URL must be an http:// or https:// URL with a host, such as http://127.0.0.1:8000/v1")
	}
	if opts.Model == "" {
		return nil, errors.New("openai: no model name; set it to the model the server serves, such as gpt-4o-mini")
	}
	m := &OpenAI{opts: opts, client: opts.HTTPClient, sleep: sleepCtx}
	if opts.APIKeyEnv != "" {
		if !envNameRE.MatchString(opts.APIKeyEnv) {
			// Never print the value: it may be a key pasted in the wrong place.
			return nil, errors.New("openai: the API key setting must be the NAME of an environment variable (letters, digits and _), such as OPENAI_API_KEY, not the key itself")
		}
		m.key = os.Getenv(opts.APIKeyEnv)
		if m.key == "" {
			return nil, fmt.Errorf("openai: the environment variable %s, which should hold the API key, is unset or empty; export it, or remove the key setting for a server that needs no key", opts.APIKeyEnv)
		}
	}
	if m.client == nil {
		m.client = &http.Client{}
	}
	if m.opts.Timeout <= 0 {
		m.opts.Timeout = DefaultOpenAITimeout
	}
	switch {
	case m.opts.MaxRetries == 0:
		m.opts.MaxRetries = DefaultOpenAIMaxRetries
	case m.opts.MaxRetries < 0:
		m.opts.MaxRetries = 0
	}
	if m.opts.RetryBackoff <= 0 {
		m.opts.RetryBackoff = DefaultOpenAIRetryBackoff
	}
	if m.opts.MaxRetryWait <= 0 {
		m.opts.MaxRetryWait = DefaultOpenAIMaxRetryWait
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/chat/completions"
	m.endpoint = u.String()
	m.shown = u.Redacted()
	return m, nil
}

// Name returns "openai:" followed by the model name.
func (m *OpenAI) Name() string { return "openai:" + m.opts.Model }

// APIError is the error Generate returns when the server answers with an
// HTTP error status. Message is the server's own explanation (with the API
// key, should the server echo it, replaced by "[redacted]").
type APIError struct {
	// StatusCode is the HTTP status of the last attempt.
	StatusCode int
	// Message, Type and Code come from the server's error body, when it has
	// one.
	Message string
	Type    string
	Code    string
	// Endpoint is the URL called, without credentials.
	Endpoint string
	// KeyEnv is the name of the API key's environment variable.
	KeyEnv string
	// Attempts is how many requests were made.
	Attempts int
}

// Error gives the endpoint, the status, the server's message and what to
// check.
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "openai: %s answered HTTP %d", e.Endpoint, e.StatusCode)
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	switch {
	case e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden:
		if e.KeyEnv != "" {
			fmt.Fprintf(&b, "; the API key was refused: check the key in the environment variable %s", e.KeyEnv)
		} else {
			b.WriteString("; the server wants an API key: name the environment variable holding it in the model's API key setting")
		}
	case e.StatusCode == http.StatusNotFound:
		b.WriteString("; check the base URL (usually ending in /v1) and the model name")
	case e.StatusCode == http.StatusTooManyRequests:
		b.WriteString("; the server is rate limiting: retry later or lower the request rate")
	}
	return b.String()
}

// Temporary reports whether the failure may pass by itself (429 or 5xx).
func (e *APIError) Temporary() bool { return retryableStatus(e.StatusCode) }

func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code >= 500
}

// Wire types of the Chat Completions API.
type (
	oaRequest struct {
		Model       string      `json:"model"`
		Messages    []oaMessage `json:"messages"`
		Tools       []oaTool    `json:"tools,omitempty"`
		Temperature *float64    `json:"temperature,omitempty"`
		MaxTokens   int         `json:"max_tokens,omitempty"`
	}
	oaMessage struct {
		Role       string       `json:"role"`
		Content    *string      `json:"content,omitempty"`
		ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
		ToolCallID string       `json:"tool_call_id,omitempty"`
	}
	oaToolCall struct {
		ID       string     `json:"id"`
		Type     string     `json:"type"`
		Function oaFunction `json:"function"`
	}
	oaFunction struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	oaTool struct {
		Type     string         `json:"type"`
		Function oaToolFunction `json:"function"`
	}
	oaToolFunction struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	oaResponse struct {
		Choices []struct {
			Message struct {
				Content   json.RawMessage `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct {
						Name      string          `json:"name"`
						Arguments json.RawMessage `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens        int64 `json:"prompt_tokens"`
			CompletionTokens    int64 `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens     int64 `json:"cached_tokens"`
				CacheWriteTokens int64 `json:"cache_write_tokens"`
			} `json:"prompt_tokens_details"`
			CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
			CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
		} `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
)

var emptyObjectSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// buildRequest turns req into the wire request.
func (m *OpenAI) buildRequest(req Request) ([]byte, error) {
	out := oaRequest{Model: m.opts.Model, Temperature: m.opts.Temperature}
	if m.opts.MaxTokens > 0 {
		out.MaxTokens = m.opts.MaxTokens
	}
	for i, msg := range req.Messages {
		w := oaMessage{Role: msg.Role}
		switch msg.Role {
		case RoleSystem, RoleUser:
		case RoleTool:
			if msg.ToolCallID == "" {
				return nil, fmt.Errorf("openai: message %d is a tool result without the id of the call it answers", i)
			}
			w.ToolCallID = msg.ToolCallID
		case RoleAssistant:
			for _, c := range msg.ToolCalls {
				args := string(c.Arguments)
				if strings.TrimSpace(args) == "" {
					args = "{}"
				}
				w.ToolCalls = append(w.ToolCalls, oaToolCall{
					ID: c.ID, Type: "function",
					Function: oaFunction{Name: c.Name, Arguments: args},
				})
			}
		default:
			return nil, fmt.Errorf("openai: message %d has role %q; use system, user, assistant or tool", i, msg.Role)
		}
		// Content is required except on an assistant message carrying tool
		// calls.
		if msg.Content != "" || len(w.ToolCalls) == 0 {
			c := msg.Content
			w.Content = &c
		}
		out.Messages = append(out.Messages, w)
	}
	for _, t := range req.Tools {
		params := t.Parameters
		if len(bytes.TrimSpace(params)) == 0 {
			params = emptyObjectSchema
		}
		out.Tools = append(out.Tools, oaTool{Type: "function", Function: oaToolFunction{
			Name: t.Name, Description: t.Description, Parameters: params,
		}})
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("openai: encoding the request: %w", err)
	}
	return b, nil
}

// Generate sends the conversation to the endpoint and returns the first
// choice. Rate limits (429), server errors (5xx) and connection failures are
// retried up to MaxRetries times, waiting as the server's Retry-After says
// or with doubling backoff; other errors are returned at once.
func (m *OpenAI) Generate(ctx context.Context, req Request) (Response, error) {
	body, err := m.buildRequest(req)
	if err != nil {
		return Response{}, err
	}
	backoff := m.opts.RetryBackoff
	for attempt := 1; ; attempt++ {
		resp, wait, err := m.attempt(ctx, body, attempt)
		if err == nil {
			return resp, nil
		}
		if wait < 0 || attempt > m.opts.MaxRetries {
			return Response{}, err
		}
		if wait == 0 {
			wait = backoff
			backoff *= 2
		}
		wait = min(wait, m.opts.MaxRetryWait)
		if serr := m.sleep(ctx, wait); serr != nil {
			return Response{}, fmt.Errorf("openai: gave up waiting to retry (%w) after: %w", serr, err)
		}
	}
}

// attempt makes one request. On failure, wait says whether to retry: -1
// never, 0 after the default backoff, >0 after that long (Retry-After).
func (m *OpenAI) attempt(ctx context.Context, body []byte, n int) (Response, time.Duration, error) {
	actx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, m.endpoint, bytes.NewReader(body))
	if err != nil {
		return Response{}, -1, fmt.Errorf("openai: building the request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if m.key != "" {
		hreq.Header.Set("Authorization", "Bearer "+m.key)
	}
	hresp, err := m.client.Do(hreq)
	if err != nil {
		return Response{}, m.transportWait(ctx, actx), m.transportError(ctx, actx, err)
	}
	defer hresp.Body.Close()
	if hresp.StatusCode < 200 || hresp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(hresp.Body, maxErrorBodyBytes))
		apiErr := &APIError{
			StatusCode: hresp.StatusCode, Endpoint: m.shown,
			KeyEnv: m.opts.APIKeyEnv, Attempts: n,
		}
		apiErr.Message, apiErr.Type, apiErr.Code = parseErrorBody(raw)
		apiErr.Message = m.redact(apiErr.Message)
		if !retryableStatus(hresp.StatusCode) {
			return Response{}, -1, apiErr
		}
		return Response{}, retryAfter(hresp.Header, time.Now()), apiErr
	}
	raw, err := io.ReadAll(io.LimitReader(hresp.Body, maxResponseBytes+1))
	if err != nil {
		return Response{}, m.transportWait(ctx, actx), m.transportError(ctx, actx, err)
	}
	if len(raw) > maxResponseBytes {
		return Response{}, -1, fmt.Errorf("openai: %s answered more than %d MiB; refusing to read it", m.shown, maxResponseBytes>>20)
	}
	resp, err := m.parseResponse(raw)
	return resp, -1, err
}

// transportWait decides whether a failed round trip is retried: not when
// ctx ended or the attempt timed out.
func (m *OpenAI) transportWait(ctx, actx context.Context) time.Duration {
	if ctx.Err() != nil || actx.Err() != nil {
		return -1
	}
	return 0
}

func (m *OpenAI) transportError(ctx, actx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("openai: request to %s abandoned: %w", m.shown, ctx.Err())
	case actx.Err() != nil:
		return fmt.Errorf("openai: no answer from %s within %s (%w); raise the model timeout or check the server", m.shown, m.opts.Timeout, context.DeadlineExceeded)
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return fmt.Errorf("openai: %s timed out: %w", m.shown, err)
	}
	// *url.Error repeats the URL, which may hold credentials: keep only the
	// cause.
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	return fmt.Errorf("openai: cannot reach %s: %w; check the base URL and that the server is running", m.shown, err)
}

func (m *OpenAI) redact(s string) string {
	if m.key != "" {
		s = strings.ReplaceAll(s, m.key, "[redacted]")
	}
	return s
}

// parseErrorBody reads the error shapes OpenAI-compatible servers use:
// {"error": {"message", "type", "code"}}, {"error": "text"},
// {"message": "…"} and {"detail": "…"}. Anything else is shown as text,
// cut short.
func parseErrorBody(raw []byte) (msg, typ, code string) {
	var body struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(raw, &body) == nil {
		var obj struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		}
		var str string
		switch {
		case len(body.Error) > 0 && json.Unmarshal(body.Error, &obj) == nil && obj.Message != "":
			return obj.Message, obj.Type, rawScalar(obj.Code)
		case len(body.Error) > 0 && json.Unmarshal(body.Error, &str) == nil && str != "":
			return str, "", ""
		case body.Message != "":
			return body.Message, "", ""
		case len(body.Detail) > 0:
			if json.Unmarshal(body.Detail, &str) == nil {
				return str, "", ""
			}
			return cut(string(body.Detail), 500), "", ""
		}
	}
	return cut(strings.TrimSpace(string(raw)), 500), "", ""
}

// rawScalar renders a JSON string or number as text.
func rawScalar(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	return string(raw)
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// retryAfter reads Retry-After (seconds or an HTTP date) or OpenAI's
// retry-after-ms; 0 when neither is usable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// parseResponse reads a 2xx answer.
func (m *OpenAI) parseResponse(raw []byte) (Response, error) {
	var r oaResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return Response{}, fmt.Errorf("openai: %s answered something that is not a Chat Completions JSON object (%v): %q", m.shown, err, cut(string(raw), 200))
	}
	if len(r.Error) > 0 && string(r.Error) != "null" {
		msg, _, _ := parseErrorBody(raw)
		return Response{}, fmt.Errorf("openai: %s answered with an error: %s", m.shown, m.redact(msg))
	}
	if len(r.Choices) == 0 {
		return Response{}, fmt.Errorf("openai: %s answered with no choices", m.shown)
	}
	c := r.Choices[0].Message
	out := Message{Role: RoleAssistant}
	text, err := contentText(c.Content)
	if err != nil {
		return Response{}, fmt.Errorf("openai: %s answered a message whose content is neither text nor text parts: %w", m.shown, err)
	}
	out.Content = text
	for i, tc := range c.ToolCalls {
		call := ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: argumentsOf(tc.Function.Arguments)}
		if call.ID == "" {
			call.ID = "call_" + strconv.Itoa(i)
		}
		if call.Name == "" {
			return Response{}, fmt.Errorf("openai: %s answered tool call %d without a function name", m.shown, i)
		}
		out.ToolCalls = append(out.ToolCalls, call)
	}
	var u Usage
	if r.Usage != nil {
		u.InputTokens = r.Usage.PromptTokens
		u.OutputTokens = r.Usage.CompletionTokens
		u.CacheReadTokens = r.Usage.CacheReadInputTokens
		u.CacheWriteTokens = r.Usage.CacheCreationInputTokens
		if d := r.Usage.PromptTokensDetails; d != nil {
			if d.CachedTokens != 0 {
				u.CacheReadTokens = d.CachedTokens
			}
			if u.CacheWriteTokens == 0 {
				u.CacheWriteTokens = d.CacheWriteTokens
			}
		}
	}
	return Response{Message: out, Usage: u}, nil
}

// contentText reads a message content: a string, null, or an array of
// {"type":"text","text":…} parts.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// argumentsOf reads a tool call's arguments: normally a JSON string holding
// the JSON object, but some servers send the object itself.
func argumentsOf(raw json.RawMessage) json.RawMessage {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if strings.TrimSpace(s) == "" {
			return json.RawMessage("{}")
		}
		return json.RawMessage(s)
	}
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}")
	}
	return raw
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
