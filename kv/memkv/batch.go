package memkv

import (
	"context"

	"agentkit/kv"
)

var _ kv.Batcher = (*Store)(nil)

// WriteBatch applies ops atomically under the store's lock: every
// condition is checked against the store as the ops before it in the
// batch left it, and when one fails nothing is written.
func (s *Store) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Check the whole batch against a view of the keys it touches first,
	// so a failure writes nothing.
	view := map[string]*uint64{} // key -> version after the ops so far (nil: absent)
	state := func(key string) *uint64 {
		if v, ok := view[key]; ok {
			return v
		}
		if it, ok := s.data[key]; ok {
			n := it.version
			return &n
		}
		return nil
	}
	next := s.counter
	for i, op := range ops {
		cur := state(op.Key)
		switch op.Kind {
		case kv.BatchDelete:
			view[op.Key] = nil
			continue
		case kv.BatchPutIfAbsent:
			if cur != nil {
				return nil, &kv.BatchError{Index: i, Err: kv.ErrConflict}
			}
		case kv.BatchPutIfVersion:
			if cur == nil || versionOf(*cur) != op.Version {
				return nil, &kv.BatchError{Index: i, Err: kv.ErrConflict}
			}
		}
		next++
		n := next
		view[op.Key] = &n
	}
	vers := make([]kv.Version, len(ops))
	for i, op := range ops {
		if op.Kind == kv.BatchDelete {
			delete(s.data, op.Key)
			continue
		}
		vers[i] = s.write(op.Key, op.Value)
	}
	return vers, nil
}
