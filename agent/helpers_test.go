package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/tool"

	"agentkit/agent"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
)

// echoModel returns an Echo running the script.
func echoModel(t testing.TB, steps ...model.EchoStep) *model.Echo {
	t.Helper()
	e, err := model.NewEcho(&model.EchoConfig{Script: steps})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// open starts a runtime and closes it at the end of the test.
func open(t testing.TB, cfg agent.Config) *agent.Runtime {
	t.Helper()
	if cfg.Agent.Name == "" {
		cfg.Agent.Name = "test-agent"
	}
	if cfg.Agent.Model == nil {
		cfg.Agent.Model = echoModel(t)
	}
	if cfg.StateRoot == "" {
		cfg.StateRoot = t.TempDir()
	}
	if cfg.Store == nil {
		cfg.Store = memkv.New()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rt, err := agent.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return rt
}

func start(t testing.TB, rt *agent.Runtime, msg string) agent.TurnResult {
	t.Helper()
	res, err := rt.StartSession(context.Background(), agent.StartRequest{Message: msg})
	if err != nil {
		t.Fatalf("StartSession: %v", err)
	}
	return res
}

// counting wraps a store and counts operations and bytes read.
type counting struct {
	db               *kv.DB
	puts, gets, dels atomic.Int64
	lists, listed    atomic.Int64
	bytesRead        atomic.Int64
	failPut          atomic.Bool
	failGet          atomic.Bool
	mu               sync.Mutex
	putKeys          []string
	getKeys          []string
	failKey          func(key string) bool // under mu; puts of matching keys fail
}

// failPutsOf makes the puts of keys containing sub fail ("" for none).
func (c *counting) failPutsOf(sub string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sub == "" {
		c.failKey = nil
		return
	}
	c.failKey = func(k string) bool { return strings.Contains(k, sub) }
}

func (c *counting) gotKeys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.getKeys...)
}

func newCounting(inner *kv.DB) *counting { return &counting{db: inner} }

var errInjected = errors.New("injected store failure")

func (c *counting) reset() {
	c.puts.Store(0)
	c.gets.Store(0)
	c.dels.Store(0)
	c.lists.Store(0)
	c.listed.Store(0)
	c.bytesRead.Store(0)
	c.mu.Lock()
	c.getKeys, c.putKeys = nil, nil
	c.mu.Unlock()
}

func (c *counting) funcs() kv.Funcs {
	return kv.Funcs{
		Put: func(ctx context.Context, key string, value []byte) error {
			c.puts.Add(1)
			c.mu.Lock()
			fail := c.failPut.Load() || (c.failKey != nil && c.failKey(key))
			if !fail {
				c.putKeys = append(c.putKeys, key)
			}
			c.mu.Unlock()
			if fail {
				return errInjected
			}
			return c.db.Put(ctx, key, value)
		},
		Get: func(ctx context.Context, key string) ([]byte, error) {
			c.gets.Add(1)
			c.mu.Lock()
			c.getKeys = append(c.getKeys, key)
			c.mu.Unlock()
			if c.failGet.Load() {
				return nil, errInjected
			}
			v, err := c.db.Get(ctx, key)
			c.bytesRead.Add(int64(len(v)))
			return v, err
		},
		Delete: func(ctx context.Context, key string) error {
			c.dels.Add(1)
			return c.db.Delete(ctx, key)
		},
		List: func(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
			c.lists.Add(1)
			return func(yield func(kv.Entry, error) bool) {
				for e, err := range c.db.List(ctx, prefix) {
					if err == nil {
						c.listed.Add(1)
						c.bytesRead.Add(int64(len(e.Value)))
					}
					if !yield(e, err) || err != nil {
						return
					}
				}
			}
		},
	}
}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock(t time.Time) *clock { return &clock{now: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Millisecond) // strictly increasing
	return c.now
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// keysWith lists the store's keys under prefix.
func keysWith(t testing.TB, db *kv.DB, prefix string) []string {
	t.Helper()
	var out []string
	for k, err := range db.ListKeys(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

func contains(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// recorder is a model that records its requests and answers from a
// function.
type recorder struct {
	mu     sync.Mutex
	reqs   []model.Request
	answer func(req model.Request) (model.Response, error)
}

func (r *recorder) Name() string { return "recorder" }

func (r *recorder) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	if r.answer != nil {
		return r.answer(req)
	}
	last := req.Messages[len(req.Messages)-1]
	return model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "ok: " + last.Content}, Usage: model.Usage{InputTokens: 1, OutputTokens: 2}}, nil
}

func (r *recorder) requests() []model.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]model.Request(nil), r.reqs...)
}

type toolT = tool.Tool

func noop(context.Context, *tool.Env, json.RawMessage) (string, error) { return "", nil }

var discard = slog.New(slog.DiscardHandler)
