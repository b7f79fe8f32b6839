package agent

import (
	"context"
	"encoding/json"
	"iter"

	"agentkit/storage"
	"agentkit/tool"
)

// hostKV adapts the storage binding's host KV to tool.HostKV. Values are
// JSON documents (a non-JSON value is an error); writes are awaited and the
// store's errors returned.
type hostKV struct{ kv *storage.HostKV }

var _ tool.HostKV = hostKV{}

func newHostKV(as *storage.AgentStore) hostKV { return hostKV{kv: as.KV()} }

// Put stores the JSON document value under key.
func (h hostKV) Put(ctx context.Context, key string, value []byte) error {
	return h.kv.Put(ctx, key, json.RawMessage(value))
}

// Get returns the JSON document under key, or an error matching
// kv.ErrNotFound.
func (h hostKV) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := h.kv.Get(ctx, key)
	return []byte(v), err
}

// Delete removes key.
func (h hostKV) Delete(ctx context.Context, key string) error { return h.kv.Delete(ctx, key) }

// List yields the entries whose key starts with prefix.
func (h hostKV) List(ctx context.Context, prefix string) iter.Seq2[tool.KVEntry, error] {
	return func(yield func(tool.KVEntry, error) bool) {
		for e, err := range h.kv.List(ctx, prefix) {
			if !yield(tool.KVEntry{Key: e.Key, Value: []byte(e.Value)}, err) || err != nil {
				return
			}
		}
	}
}
