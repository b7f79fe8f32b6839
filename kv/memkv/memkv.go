// Package memkv is the reference kv driver: every rule of the contract, held
// in process memory. Other drivers are compared against it, tests use it as a
// fake, and its behaviour settles any doubt about what the contract means.
//
// It registers the "mem" scheme. "mem://" opens a new, empty store each time;
// "mem://NAME" opens the store of that name, shared by every Open of the same
// name in this process (handy for two runtimes in one test).
//
// Data lives in process memory only: it is gone when the process exits, and
// the store reports itself process-local so coordination features refuse it
// beside a durable store.
package memkv

import (
	"context"
	"fmt"
	"iter"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

func init() {
	kv.RegisterOptions("mem", func(_ context.Context, u *url.URL, o kv.OpenOptions) (*kv.DB, error) {
		if _, err := driverkit.Params(u); err != nil {
			return nil, fmt.Errorf("memkv: %w (write mem:// or mem://NAME)", err)
		}
		name := u.Host
		if name == "" {
			name = strings.Trim(u.Opaque, "/")
		}
		if name == "" {
			return New(), nil
		}
		namedMu.Lock()
		defer namedMu.Unlock()
		s, ok := named[name]
		if !ok && o.ReadOnly {
			return New(), nil // nothing to read; remember nothing
		}
		if !ok {
			s = NewStore()
			named[name] = s
		}
		return kv.New("mem", s)
	})
}

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// Store is the memory backend. It implements the full core and the CAS
// group. Use New for the portable handle; the zero Store is not usable.
type Store struct {
	mu      sync.RWMutex
	data    map[string]item
	counter uint64 // the last version issued; versions are never reused
}

type item struct {
	value   []byte
	version uint64
}

var (
	_ kv.Store          = (*Store)(nil)
	_ kv.CAS            = (*Store)(nil)
	_ kv.ProcessLocaler = (*Store)(nil)
	_ kv.AfterLister    = (*Store)(nil)
)

// NewStore returns an empty memory backend.
func NewStore() *Store { return &Store{data: map[string]item{}} }

// New returns a new, empty memory store behind the portable handle.
func New() *kv.DB {
	db, err := kv.New("mem", NewStore())
	if err != nil {
		panic(err) // unreachable: Store implements the whole contract
	}
	return db
}

// ProcessLocal reports true: the data lives in this process only.
func (s *Store) ProcessLocal() bool { return true }

// write stores a copy of value under a fresh version. Call with mu held.
func (s *Store) write(key string, value []byte) kv.Version {
	s.counter++
	s.data[key] = item{value: slices.Clone(value), version: s.counter}
	return versionOf(s.counter)
}

func versionOf(n uint64) kv.Version { return kv.Version(strconv.FormatUint(n, 10)) }

// Put creates or overwrites key.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.write(key, value)
	return nil
}

// Get returns a copy of the value of key, or kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := s.GetWithVersion(ctx, key)
	return v, err
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.data, key)
	return nil
}

// List yields a consistent snapshot, taken when iteration starts, of the
// entries under prefix in ascending key order.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter is List without the keys at or before after. The snapshot
// holds (and sorts) only the keys after the point.
func (s *Store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		if err := ctx.Err(); err != nil {
			yield(kv.Entry{}, err)
			return
		}
		snap := s.snapshot(prefix, after)
		for _, e := range snap {
			if err := ctx.Err(); err != nil {
				yield(kv.Entry{}, err)
				return
			}
			if !yield(e, nil) {
				return
			}
		}
	}
}

func (s *Store) snapshot(prefix, after string) []kv.Entry {
	s.mu.RLock()
	out := make([]kv.Entry, 0, 16)
	for k, it := range s.data {
		if k > after && strings.HasPrefix(k, prefix) {
			out = append(out, kv.Entry{Key: k, Value: slices.Clone(it.value)})
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b kv.Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// GetWithVersion returns a copy of the value of key and its version.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	it, ok := s.data[key]
	if !ok {
		return nil, "", kv.ErrNotFound
	}
	return slices.Clone(it.value), versionOf(it.version), nil
}

// PutIfAbsent writes key only if it does not exist.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.data[key]; ok {
		return "", kv.ErrConflict
	}
	return s.write(key, value), nil
}

// PutIfVersion writes key only if it exists with version expected.
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.data[key]
	if !ok || versionOf(it.version) != expected {
		return "", kv.ErrConflict
	}
	return s.write(key, value), nil
}

// ListKeys yields the keys under prefix in ascending order.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter yields the keys under prefix that sort after after, in
// ascending order.
func (s *Store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for e, err := range s.ListAfter(ctx, prefix, after) {
			if !yield(e.Key, err) || err != nil {
				return
			}
		}
	}
}
