package model

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fake is an OpenAI-compatible server that answers each request with the
// next of its replies and records what it received.
type fake struct {
	t       *testing.T
	mu      sync.Mutex
	replies []func(w http.ResponseWriter, r *http.Request)
	bodies  []string
	headers []http.Header
	paths   []string
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	n := len(f.bodies)
	f.bodies = append(f.bodies, string(body))
	f.headers = append(f.headers, r.Header.Clone())
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	reply := f.replies[min(n, len(f.replies)-1)]
	f.mu.Unlock()
	reply(w, r)
}

func (f *fake) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

func status(code int, body string, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

func ok(body string) func(http.ResponseWriter, *http.Request) { return status(200, body) }

const textAnswer = `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`

// newFake starts a fake server and an OpenAI model pointed at it, with
// waits between retries recorded instead of slept.
func newFake(t *testing.T, opts OpenAIOptions, replies ...func(http.ResponseWriter, *http.Request)) (*fake, *OpenAI, *[]time.Duration) {
	t.Helper()
	f := &fake{t: t, replies: replies}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	opts.BaseURL = srv.URL + "/v1"
	if opts.Model == "" {
		opts.Model = "test-model"
	}
	m, err := NewOpenAI(opts)
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration
	var mu sync.Mutex
	m.sleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return ctx.Err()
	}
	return f, m, &waits
}

func userReq(text string) Request {
	return Request{Messages: []Message{{Role: RoleUser, Content: text}}}
}

func TestOpenAIRequestWireFormat(t *testing.T) {
	t.Setenv("AGENTKIT_FAKE_KEY", "sk-test-123")
	temp := 0.5
	f, m, _ := newFake(t, OpenAIOptions{APIKeyEnv: "AGENTKIT_FAKE_KEY", Temperature: &temp, MaxTokens: 99}, ok(textAnswer))
	req := Request{
		Messages: []Message{
			{Role: RoleSystem, Content: "You are terse."},
			{Role: RoleUser, Content: "Read my notes"},
			{Role: RoleAssistant, ToolCalls: []ToolCall{
				{ID: "call_1", Name: "read_file", Arguments: json.RawMessage(`{"path":"notes.md"}`)},
				{ID: "call_2", Name: "list_files"},
			}},
			{Role: RoleTool, ToolCallID: "call_1", Name: "read_file", Content: "buy milk"},
			{Role: RoleTool, ToolCallID: "call_2", Name: "list_files", Content: ""},
			{Role: RoleAssistant, Content: "You need milk."},
			{Role: RoleUser, Content: "Thanks"},
		},
		Tools: []ToolSpec{
			{Name: "read_file", Description: "Read a file", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)},
			{Name: "list_files", Description: "List files"},
		},
	}
	resp, err := m.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"test-model","messages":[` +
		`{"role":"system","content":"You are terse."},` +
		`{"role":"user","content":"Read my notes"},` +
		`{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"notes.md\"}"}},{"id":"call_2","type":"function","function":{"name":"list_files","arguments":"{}"}}]},` +
		`{"role":"tool","content":"buy milk","tool_call_id":"call_1"},` +
		`{"role":"tool","content":"","tool_call_id":"call_2"},` +
		`{"role":"assistant","content":"You need milk."},` +
		`{"role":"user","content":"Thanks"}],` +
		`"tools":[{"type":"function","function":{"name":"read_file","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}},` +
		`{"type":"function","function":{"name":"list_files","description":"List files","parameters":{"type":"object","properties":{}}}}],` +
		`"temperature":0.5,"max_tokens":99}`
	if f.bodies[0] != want {
		t.Errorf("request body:\n got %s\nwant %s", f.bodies[0], want)
	}
	if f.paths[0] != "POST /v1/chat/completions" {
		t.Errorf("request went to %s", f.paths[0])
	}
	h := f.headers[0]
	if h.Get("Authorization") != "Bearer sk-test-123" || h.Get("Content-Type") != "application/json" {
		t.Errorf("headers: Authorization %q, Content-Type %q", h.Get("Authorization"), h.Get("Content-Type"))
	}
	if resp.Message.Role != RoleAssistant || resp.Message.Content != "Hello there" || len(resp.Message.ToolCalls) != 0 {
		t.Errorf("answer = %+v", resp.Message)
	}
	if want := (Usage{InputTokens: 12, OutputTokens: 3}); resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}
	if m.Name() != "openai:test-model" {
		t.Errorf("Name() = %q", m.Name())
	}
}

func TestOpenAINoKeyNoHeader(t *testing.T) {
	f, m, _ := newFake(t, OpenAIOptions{}, ok(textAnswer))
	if _, err := m.Generate(context.Background(), userReq("hi")); err != nil {
		t.Fatal(err)
	}
	if got := f.headers[0].Get("Authorization"); got != "" {
		t.Errorf("Authorization = %q, want none without a key", got)
	}
}

func TestOpenAIToolCallsAndUsage(t *testing.T) {
	_, m, _ := newFake(t, OpenAIOptions{}, ok(`{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[
		{"id":"call_a","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"memory/journal.jsonl\"}"}},
		{"id":"call_b","type":"function","function":{"name":"search_files","arguments":{"pattern":"x"}}},
		{"type":"function","function":{"name":"list_files","arguments":""}}]}}],
		"usage":{"prompt_tokens":2006,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":1920},"cache_creation_input_tokens":86}}`))
	resp, err := m.Generate(context.Background(), userReq("look"))
	if err != nil {
		t.Fatal(err)
	}
	calls := resp.Message.ToolCalls
	if len(calls) != 3 || resp.Message.Content != "" {
		t.Fatalf("answer = %+v, want three tool calls and no text", resp.Message)
	}
	for i, want := range []ToolCall{
		{ID: "call_a", Name: "read_file", Arguments: json.RawMessage(`{"path":"memory/journal.jsonl"}`)},
		{ID: "call_b", Name: "search_files", Arguments: json.RawMessage(`{"pattern":"x"}`)},
		{ID: "call_2", Name: "list_files", Arguments: json.RawMessage(`{}`)},
	} {
		if calls[i].ID != want.ID || calls[i].Name != want.Name || string(calls[i].Arguments) != string(want.Arguments) {
			t.Errorf("call %d = {%s %s %s}, want {%s %s %s}", i, calls[i].ID, calls[i].Name, calls[i].Arguments, want.ID, want.Name, want.Arguments)
		}
	}
	if want := (Usage{InputTokens: 2006, OutputTokens: 300, CacheReadTokens: 1920, CacheWriteTokens: 86}); resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}
}

func TestOpenAIUsageExtensions(t *testing.T) {
	_, m, _ := newFake(t, OpenAIOptions{},
		ok(`{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"cache_read_input_tokens":4,"prompt_tokens_details":{"cache_write_tokens":6}}}`))
	resp, err := m.Generate(context.Background(), userReq("x"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "ab" {
		t.Errorf("content parts joined = %q, want ab", resp.Message.Content)
	}
	if want := (Usage{InputTokens: 10, OutputTokens: 1, CacheReadTokens: 4, CacheWriteTokens: 6}); resp.Usage != want {
		t.Errorf("usage = %+v, want %+v", resp.Usage, want)
	}
}

func TestOpenAIBadRequestNotRetried(t *testing.T) {
	f, m, waits := newFake(t, OpenAIOptions{},
		status(400, `{"error":{"message":"Invalid value for 'messages[0].role'","type":"invalid_request_error","code":"invalid_value","param":"messages"}}`))
	_, err := m.Generate(context.Background(), userReq("x"))
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("err = %v, want *APIError", err)
	}
	if apiErr.StatusCode != 400 || apiErr.Type != "invalid_request_error" || apiErr.Code != "invalid_value" || apiErr.Temporary() {
		t.Errorf("APIError = %+v", apiErr)
	}
	if !strings.Contains(err.Error(), "Invalid value for 'messages[0].role'") || !strings.Contains(err.Error(), "400") {
		t.Errorf("error %q lacks the server's message or the status", err)
	}
	if f.requests() != 1 || len(*waits) != 0 {
		t.Errorf("requests = %d, waits = %v; a 400 is not retried", f.requests(), *waits)
	}
}

func TestOpenAIUnauthorizedNamesTheVariable(t *testing.T) {
	t.Setenv("MY_LLM_KEY", "sk-live-abcdef")
	f, m, _ := newFake(t, OpenAIOptions{APIKeyEnv: "MY_LLM_KEY"},
		status(401, `{"error":{"message":"Incorrect API key provided: sk-live-abcdef.","type":"invalid_request_error","code":"invalid_api_key"}}`))
	_, err := m.Generate(context.Background(), userReq("x"))
	if err == nil {
		t.Fatal("no error for 401")
	}
	msg := err.Error()
	if !strings.Contains(msg, "MY_LLM_KEY") || !strings.Contains(msg, "401") || !strings.Contains(msg, "Incorrect API key") {
		t.Errorf("error %q does not name the key variable, the status and the server's message", msg)
	}
	if strings.Contains(msg, "sk-live-abcdef") {
		t.Errorf("error %q leaks the key", msg)
	}
	if f.requests() != 1 {
		t.Errorf("requests = %d; a 401 is not retried", f.requests())
	}
}

func TestOpenAIRateLimitThenSuccess(t *testing.T) {
	f, m, waits := newFake(t, OpenAIOptions{},
		status(429, `{"error":{"message":"Rate limit reached","type":"requests"}}`, "Retry-After", "7"),
		status(429, `{"error":{"message":"Rate limit reached"}}`, "Retry-After-Ms", "1500"),
		ok(textAnswer))
	resp, err := m.Generate(context.Background(), userReq("x"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Content != "Hello there" || f.requests() != 3 {
		t.Errorf("answer %q after %d requests", resp.Message.Content, f.requests())
	}
	if want := []time.Duration{7 * time.Second, 1500 * time.Millisecond}; !equalDurations(*waits, want) {
		t.Errorf("waits = %v, want %v (the server's Retry-After)", *waits, want)
	}
	if f.bodies[0] != f.bodies[2] {
		t.Errorf("the retry sent a different body")
	}
}

func TestOpenAIServerErrorThenSuccess(t *testing.T) {
	f, m, waits := newFake(t, OpenAIOptions{RetryBackoff: 100 * time.Millisecond},
		status(500, `{"error":{"message":"The server had an error"}}`),
		status(503, `upstream unavailable`),
		ok(textAnswer))
	if _, err := m.Generate(context.Background(), userReq("x")); err != nil {
		t.Fatal(err)
	}
	if f.requests() != 3 {
		t.Errorf("requests = %d, want 3", f.requests())
	}
	if want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}; !equalDurations(*waits, want) {
		t.Errorf("waits = %v, want doubling backoff %v", *waits, want)
	}
}

func TestOpenAIRetriesAreBounded(t *testing.T) {
	f, m, waits := newFake(t, OpenAIOptions{MaxRetries: 3, MaxRetryWait: 2 * time.Second},
		status(502, `{"error":"bad gateway"}`, "Retry-After", "3600"))
	_, err := m.Generate(context.Background(), userReq("x"))
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 502 || apiErr.Attempts != 4 || !apiErr.Temporary() {
		t.Fatalf("err = %#v, want a 502 APIError after 4 attempts", err)
	}
	if !strings.Contains(err.Error(), "bad gateway") || !strings.Contains(err.Error(), "4 attempts") {
		t.Errorf("error %q lacks the message or the attempts", err)
	}
	if f.requests() != 4 {
		t.Errorf("requests = %d, want 4", f.requests())
	}
	if want := []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}; !equalDurations(*waits, want) {
		t.Errorf("waits = %v, want %v (Retry-After capped by MaxRetryWait)", *waits, want)
	}

	f, m, _ = newFake(t, OpenAIOptions{MaxRetries: -1}, status(500, `{}`))
	if _, err := m.Generate(context.Background(), userReq("x")); err == nil || f.requests() != 1 {
		t.Errorf("MaxRetries<0: err = %v after %d requests, want an error after 1", err, f.requests())
	}
}

func TestOpenAIRetryWaitHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f, m, _ := newFake(t, OpenAIOptions{RetryBackoff: time.Hour}, status(503, `{"error":{"message":"overloaded"}}`))
	m.sleep = func(ctx context.Context, d time.Duration) error {
		cancel()                // the caller gives up during the wait
		return sleepCtx(ctx, d) // the real wait: an hour unless ctx ends
	}
	_, err := m.Generate(ctx, userReq("x"))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "overloaded") {
		t.Fatalf("err = %v, want context.Canceled carrying the server's error", err)
	}
	if f.requests() != 1 {
		t.Errorf("requests = %d, want 1", f.requests())
	}
}

func TestOpenAITimeout(t *testing.T) {
	release := make(chan struct{})
	f, m, waits := newFake(t, OpenAIOptions{Timeout: 50 * time.Millisecond}, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	_, err := m.Generate(context.Background(), userReq("x"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "within 50ms") {
		t.Fatalf("err = %v, want a timeout naming the limit", err)
	}
	if f.requests() != 1 || len(*waits) != 0 {
		t.Errorf("requests = %d, waits = %v; a timeout is not retried", f.requests(), *waits)
	}
}

func TestOpenAIMalformedAnswers(t *testing.T) {
	for name, c := range map[string]struct{ body, want string }{
		"not json":     {`{"choices": [`, "not a Chat Completions JSON object"},
		"html":         {`<html>gateway</html>`, "<html>gateway</html>"},
		"no choices":   {`{"choices":[]}`, "no choices"},
		"error in 200": {`{"error":{"message":"model overloaded"}}`, "model overloaded"},
		"bad content":  {`{"choices":[{"message":{"content":42}}]}`, "neither text"},
		"nameless":     {`{"choices":[{"message":{"tool_calls":[{"id":"x","function":{"arguments":"{}"}}]}}]}`, "without a function name"},
	} {
		_, m, _ := newFake(t, OpenAIOptions{}, ok(c.body))
		_, err := m.Generate(context.Background(), userReq("x"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one containing %q", name, err, c.want)
		}
	}
}

func TestOpenAIUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	m, err := NewOpenAI(OpenAIOptions{BaseURL: "http://user:pw@" + addr + "/v1", Model: "m", MaxRetries: 2})
	if err != nil {
		t.Fatal(err)
	}
	var waits int
	m.sleep = func(ctx context.Context, d time.Duration) error { waits++; return nil }
	_, err = m.Generate(context.Background(), userReq("x"))
	if err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("err = %v, want cannot reach", err)
	}
	if strings.Contains(err.Error(), "pw") {
		t.Errorf("error %q shows the URL's password", err)
	}
	if waits != 2 {
		t.Errorf("waits = %d, want 2 (connection failures are retried)", waits)
	}
}

func TestOpenAIBadRequestMessages(t *testing.T) {
	_, m, _ := newFake(t, OpenAIOptions{}, ok(textAnswer))
	for _, msgs := range [][]Message{
		{{Role: "robot", Content: "x"}},
		{{Role: RoleTool, Content: "result without id"}},
	} {
		if _, err := m.Generate(context.Background(), Request{Messages: msgs}); err == nil {
			t.Errorf("messages %+v accepted", msgs)
		}
	}
}

func TestNewOpenAIValidation(t *testing.T) {
	t.Setenv("AGENTKIT_EMPTY_KEY", "")
	for _, c := range []struct {
		opts OpenAIOptions
		want string
	}{
		{OpenAIOptions{Model: "m"}, "no base URL"},
		{OpenAIOptions{BaseURL: "ftp://x/v1", Model: "m"}, "http:// or https://"},
		{OpenAIOptions{BaseURL: "127.0.0.1:8000/v1", Model: "m"}, "http:// or https://"},
		{OpenAIOptions{BaseURL: "http://x/v1"}, "no model name"},
		{OpenAIOptions{BaseURL: "http://x/v1", Model: "m", APIKeyEnv: "AGENTKIT_EMPTY_KEY"}, "AGENTKIT_EMPTY_KEY"},
		{OpenAIOptions{BaseURL: "http://x/v1", Model: "m", APIKeyEnv: "AGENTKIT_UNSET_KEY_XYZ"}, "AGENTKIT_UNSET_KEY_XYZ"},
		{OpenAIOptions{BaseURL: "http://x/v1", Model: "m", APIKeyEnv: "sk-proj-pasted-key"}, "NAME of an environment variable"},
	} {
		_, err := NewOpenAI(c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewOpenAI(%+v) = %v, want an error containing %q", c.opts, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "pasted-key") {
			t.Errorf("error %q repeats the value given as a variable name", err)
		}
	}
}

func TestRetryAfterDate(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := http.Header{}
	h.Set("Retry-After", now.Add(9*time.Second).Format(http.TimeFormat))
	if got := retryAfter(h, now); got != 9*time.Second {
		t.Errorf("retryAfter(date) = %v, want 9s", got)
	}
	h.Set("Retry-After", "soon")
	if got := retryAfter(h, now); got != 0 {
		t.Errorf("retryAfter(soon) = %v, want 0", got)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
