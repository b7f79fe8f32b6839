package storage_test

import (
	"bytes"
	"context"
	"iter"
	"log/slog"
	"sync"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/storage"
)

// backend is a kv.Funcs over a memory store that records every call and can
// fail Put on demand. Its plain methods do not claim to be process-local, so
// it stands in for a durable store.
type backend struct {
	store *memkv.Store

	mu      sync.Mutex
	calls   []string // "put KEY", "get KEY", "delete KEY", "list PREFIX"
	failPut error
}

func newBackend() *backend { return &backend{store: memkv.NewStore()} }

func (b *backend) record(op, key string) {
	b.mu.Lock()
	b.calls = append(b.calls, op+" "+key)
	b.mu.Unlock()
}

func (b *backend) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}

func (b *backend) FailPut(err error) {
	b.mu.Lock()
	b.failPut = err
	b.mu.Unlock()
}

// Funcs returns the adapter with the chosen parts: any of "put", "get",
// "delete", "list".
func (b *backend) Funcs(parts ...string) kv.Funcs {
	var f kv.Funcs
	for _, p := range parts {
		switch p {
		case "put":
			f.Put = func(ctx context.Context, key string, value []byte) error {
				b.record("put", key)
				b.mu.Lock()
				err := b.failPut
				b.mu.Unlock()
				if err != nil {
					return err
				}
				return b.store.Put(ctx, key, value)
			}
		case "get":
			f.Get = func(ctx context.Context, key string) ([]byte, error) {
				b.record("get", key)
				return b.store.Get(ctx, key)
			}
		case "delete":
			f.Delete = func(ctx context.Context, key string) error {
				b.record("delete", key)
				return b.store.Delete(ctx, key)
			}
		case "list":
			f.List = func(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
				b.record("list", prefix)
				return b.store.List(ctx, prefix)
			}
		default:
			panic("unknown part " + p)
		}
	}
	return f
}

// Core is every plain part.
func (b *backend) Core() kv.Funcs { return b.Funcs("put", "get", "delete", "list") }

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) Logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

func define(t *testing.T, cfg storage.Config) *storage.Binding {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = (&logBuffer{}).Logger()
	}
	b, err := storage.Define(cfg)
	if err != nil {
		t.Fatalf("Define: %v", err)
	}
	return b
}

func agent(t *testing.T, b *storage.Binding, name string) *storage.AgentStore {
	t.Helper()
	a, err := b.Agent(name)
	if err != nil {
		t.Fatalf("Agent(%q): %v", name, err)
	}
	return a
}
