package rediskv

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"agentkit/kv"
)

var _ kv.Batcher = (*Store)(nil)

// batchScript applies a batch in one script, which Redis runs atomically:
// it first checks every op's condition against the keys as the ops before
// it leave them (a key written earlier in the batch has a version no
// caller can know), and answers {0, i} for the first op whose condition
// fails, having written nothing; then it applies every op as the single
// write scripts do and answers {1, version...} ("" for a delete).
//
// KEYS are the index, the counter, then each op's data hash; ARGV[1] is a
// nonce, then three arguments per op: its kind (p put, a put if absent,
// v put if version, d delete), its key (the index member), and its value
// or, for v, the value and the expected version in ARGV after them (four
// arguments for v).
var batchScript = redis.NewScript(`
local idx, seq, nonce = KEYS[1], KEYS[2], ARGV[1]
local ops = {}
local a = 2
for i = 3, #KEYS do
  local op = {data = KEYS[i], kind = ARGV[a], key = ARGV[a + 1], value = ARGV[a + 2]}
  a = a + 3
  if op.kind == 'v' then op.expected = ARGV[a]; a = a + 1 end
  ops[#ops + 1] = op
end
local state = {}
for i, op in ipairs(ops) do
  local s = state[op.data]
  if s == nil then
    local r = redis.call('HGET', op.data, 'r')
    if r then s = {exists = true, r = r} else s = {exists = false} end
  end
  if op.kind == 'a' and s.exists then return {0, i - 1} end
  if op.kind == 'v' and (not s.exists or s.r ~= op.expected) then return {0, i - 1} end
  if op.kind == 'd' then state[op.data] = {exists = false} else state[op.data] = {exists = true, r = false} end
end
local out = {1}
for _, op in ipairs(ops) do
  if op.kind == 'd' then
    redis.call('DEL', op.data)
    redis.call('ZREM', idx, op.key)
    out[#out + 1] = ''
  else
    local r = string.format('%d-%s', redis.call('INCR', seq), nonce)
    redis.call('HSET', op.data, 'v', op.value, 'r', r)
    redis.call('ZADD', idx, 0, op.key)
    out[#out + 1] = r
  end
end
return out`)

// WriteBatch applies ops atomically in one script (one round trip):
// Redis runs a script without running any other command meanwhile, and
// the script writes nothing unless every condition holds. A script cut
// short by an error (out of memory) can leave the writes before the error;
// as for any write, that error is returned and the outcome is unknown.
func (s *Store) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	keys := []string{s.index, s.seq}
	args := []any{nonce()}
	for i, op := range ops {
		keys = append(keys, s.dataKey(op.Key))
		switch op.Kind {
		case kv.BatchPut, kv.BatchPutIfAbsent, kv.BatchPutIfVersion:
			if err := s.checkSize(op.Value); err != nil {
				return nil, err
			}
		}
		switch op.Kind {
		case kv.BatchPut:
			args = append(args, "p", op.Key, op.Value)
		case kv.BatchPutIfAbsent:
			args = append(args, "a", op.Key, op.Value)
		case kv.BatchPutIfVersion:
			args = append(args, "v", op.Key, op.Value, string(op.Version))
		case kv.BatchDelete:
			args = append(args, "d", op.Key, "")
		default:
			return nil, fmt.Errorf("rediskv: op %d of the batch has kind %v", i, op.Kind)
		}
	}
	res, err := batchScript.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		return nil, s.err(ctx, err)
	}
	if len(res) == 0 {
		return nil, errors.New("rediskv: the batch script answered nothing")
	}
	if ok, _ := res[0].(int64); ok == 0 {
		i, _ := res[1].(int64)
		cause := fmt.Errorf("%w: the key is missing or its version changed", kv.ErrConflict)
		if ops[i].Kind == kv.BatchPutIfAbsent {
			cause = fmt.Errorf("%w: %w", kv.ErrConflict, kv.ErrExists)
		}
		return nil, &kv.BatchError{Index: int(i), Err: cause}
	}
	if len(res) != len(ops)+1 {
		return nil, fmt.Errorf("rediskv: the batch script answered %d versions for %d ops", len(res)-1, len(ops))
	}
	vers := make([]kv.Version, len(ops))
	for i := range ops {
		r, _ := res[i+1].(string)
		vers[i] = kv.Version(r)
	}
	return vers, nil
}
