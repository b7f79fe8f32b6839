package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// HostKV is the key-value space handlers keep their own JSON in. An author
// key is any non-empty string ("alert-memory/abc"); it is stored, as one
// encoded segment, at agentkit/v1/{agent}/kv/{key}. Writes are awaited and
// their errors returned, unlike the session mirror.
//
// Values are JSON documents. Each is stored inside a small record,
// {"v":1,"key":"alert-memory/abc","value":…}, that keeps the author's key
// beside the value: a key too long to encode is stored under its digest, and
// the record is how List gives it back.
type HostKV struct{ a *AgentStore }

// HostEntry is one host KV entry, as List yields it.
type HostEntry struct {
	// Key is the author's key, as given to Put.
	Key string
	// Value is the stored JSON document.
	Value json.RawMessage
}

// hostRecord is the stored form of a host KV entry.
type hostRecord struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

func (h *HostKV) key(authorKey string) (string, error) {
	key, err := h.a.keys.AuthorKV(authorKey)
	if err != nil {
		return "", fmt.Errorf("storage: host KV: %w", err)
	}
	return key, nil
}

// Put stores value, marshalled with encoding/json (a json.RawMessage is
// stored as it is, once checked), under key, and returns once the store has
// it, or the store's error.
func (h *HostKV) Put(ctx context.Context, key string, value any) error {
	k, err := h.key(key)
	if err != nil {
		return err
	}
	doc, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("storage: host KV put %q: the value does not encode as JSON: %w", key, err)
	}
	data, err := record.Marshal(KindHostKV, hostRecord{Key: key, Value: doc})
	if err != nil {
		return err
	}
	return h.a.b.db.Put(ctx, k, data)
}

// Get returns the JSON stored under key, or an error matching
// kv.ErrNotFound when there is none.
func (h *HostKV) Get(ctx context.Context, key string) (json.RawMessage, error) {
	k, err := h.key(key)
	if err != nil {
		return nil, err
	}
	if !h.a.b.caps.Get {
		return nil, unsupported(h.a.b, "reading host KV", "Get")
	}
	data, err := h.a.b.db.Get(ctx, k)
	if err != nil {
		return nil, err
	}
	var rec hostRecord
	if _, err := record.Unmarshal(KindHostKV, k, data, &rec); err != nil {
		return nil, err
	}
	if rec.Key != key {
		return nil, fmt.Errorf("%w: the record at %q is for host KV key %q, not %q", ErrBadRecord, k, rec.Key, key)
	}
	return rec.Value, nil
}

// Delete removes key; a missing key is not an error.
func (h *HostKV) Delete(ctx context.Context, key string) error {
	k, err := h.key(key)
	if err != nil {
		return err
	}
	if !h.a.b.caps.Delete {
		return unsupported(h.a.b, "deleting host KV entries", "Delete")
	}
	return h.a.b.db.Delete(ctx, k)
}

// List yields the entries whose author key starts with prefix ("" for all).
// Entries come in the store's key order, which follows the encoded keys and
// is not the author keys' byte order; keys too long to encode come last. An
// error ends the sequence.
func (h *HostKV) List(ctx context.Context, prefix string) iter.Seq2[HostEntry, error] {
	return func(yield func(HostEntry, error) bool) {
		if !h.a.b.caps.List {
			yield(HostEntry{}, unsupported(h.a.b, "listing host KV", "List"))
			return
		}
		k := h.a.keys
		dir, _ := k.AuthorKVPrefix("")
		// Keys that encode in full, found by their encoded prefix.
		if p, ok := k.AuthorKVPrefix(prefix); ok {
			for e, err := range h.a.b.db.List(ctx, p) {
				if err == nil && keys.IsDigest(e.Key[len(dir):]) {
					continue // handled with the digests below
				}
				if !h.yieldEntry(e, err, prefix, yield) || err != nil {
					return
				}
			}
		}
		// Keys stored under their digest, matched by the key in the record.
		for e, err := range h.a.b.db.List(ctx, k.AuthorKVDigestPrefix()) {
			if !h.yieldEntry(e, err, prefix, yield) || err != nil {
				return
			}
		}
	}
}

// yieldEntry decodes one listed entry and yields it when its author key has
// the prefix. It returns false when the listing must stop.
func (h *HostKV) yieldEntry(e kv.Entry, err error, prefix string, yield func(HostEntry, error) bool) bool {
	if err != nil {
		yield(HostEntry{}, err)
		return false
	}
	var rec hostRecord
	if _, err := record.Unmarshal(KindHostKV, e.Key, e.Value, &rec); err != nil {
		yield(HostEntry{}, err)
		return false
	}
	if want, kerr := h.key(rec.Key); kerr != nil || want != e.Key {
		yield(HostEntry{}, fmt.Errorf("%w: the record at %q names host KV key %q, which is stored elsewhere", ErrBadRecord, e.Key, rec.Key))
		return false
	}
	if !strings.HasPrefix(rec.Key, prefix) {
		return true
	}
	return yield(HostEntry(rec), nil)
}
