package kvtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"agentkit/kv"
)

// The linearizability check records a concurrent history and asks porcupine
// whether some sequential order of it, consistent with real time, obeys a
// model of one key. Versions are opaque, so the model cannot compare them;
// instead every write stores a value never written before, which names the
// write. A version token is remembered with the value it was read or
// written with, and PutIfVersion must succeed exactly when the key still
// holds that value, that is, when the write the token names is still the
// current one. A driver that reuses versions (after a delete, or for
// identical bytes) or whose conditional writes are not atomic produces a
// history no such order explains.

type linKind int

const (
	linGet linKind = iota
	linPut
	linPutIfAbsent
	linPutIfVersion
	linDelete
)

// linInput is one call.
type linInput struct {
	kind  linKind
	key   string
	value string // the value written (never written before)
	// expect is the value the PutIfVersion token was read or written with,
	// or "" for a token the store never issued.
	expect string
}

// linOutput is one result: for Get whether the key was found and its
// value, for writes whether they succeeded.
type linOutput struct {
	ok    bool
	value string
}

// linState is one key: absent, or holding the value of one write.
type linState struct {
	present bool
	value   string
}

var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Input.(linInput).key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(linState), input.(linInput), output.(linOutput)
		switch in.kind {
		case linGet:
			if out.ok {
				return s.present && s.value == out.value, s
			}
			return !s.present, s
		case linPut:
			return true, linState{present: true, value: in.value}
		case linPutIfAbsent:
			if out.ok {
				return !s.present, linState{present: true, value: in.value}
			}
			return s.present, s
		case linPutIfVersion:
			match := s.present && in.expect != "" && s.value == in.expect
			if out.ok {
				return match, linState{present: true, value: in.value}
			}
			return !match, s
		case linDelete:
			return true, linState{}
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		res := "conflict"
		if out.ok {
			res = "ok"
		}
		switch in.kind {
		case linGet:
			if !out.ok {
				return fmt.Sprintf("get(%s) -> not found", in.key)
			}
			return fmt.Sprintf("get(%s) -> %s", in.key, out.value)
		case linPut:
			return fmt.Sprintf("put(%s, %s)", in.key, in.value)
		case linPutIfAbsent:
			return fmt.Sprintf("putIfAbsent(%s, %s) -> %s", in.key, in.value, res)
		case linPutIfVersion:
			return fmt.Sprintf("putIfVersion(%s, %s, version of %q) -> %s", in.key, in.value, in.expect, res)
		default:
			return fmt.Sprintf("delete(%s)", in.key)
		}
	},
	DescribeState: func(state any) string {
		s := state.(linState)
		if !s.present {
			return "absent"
		}
		return s.value
	},
}

// linToken is a version and the value it was issued with.
type linToken struct {
	ver   kv.Version
	value string
}

// linConfig bounds one history.
const (
	linClients    = 4
	linOpsPerGo   = 60
	linKeys       = 2
	linTimeout    = 20 * time.Second
	garbageToken  = kv.Version("kvtest-never-issued")
	linKeyPattern = "lin/%d"
)

// recordHistory runs linClients goroutines of random operations over a few
// keys, spread over the clients given, and returns the history.
func recordHistory(t testing.TB, s *suite, clients []*kv.DB, seed uint64) []porcupine.Operation {
	t.Helper()
	ctx := t.Context()
	var (
		clock   atomic.Int64
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
		failed  atomic.Value
	)
	for c := range linClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := clients[c%len(clients)]
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			tokens := map[string]linToken{}
			for i := range linOpsPerGo {
				key := fmt.Sprintf(linKeyPattern, r.IntN(linKeys))
				in := linInput{key: key, value: fmt.Sprintf("c%d-%d", c, i)}
				var out linOutput
				var err error
				call := clock.Add(1)
				switch p := r.IntN(100); {
				case p < 25:
					in.kind = linGet
					in.value = ""
					var v []byte
					if s.caps.Get && p < 8 {
						v, err = db.Get(ctx, key)
					} else {
						var ver kv.Version
						v, ver, err = db.GetWithVersion(ctx, key)
						if err == nil {
							tokens[key] = linToken{ver, string(v)}
						}
					}
					if errors.Is(err, kv.ErrNotFound) {
						err = nil
					} else if err == nil {
						out = linOutput{ok: true, value: string(v)}
					}
				case p < 37:
					in.kind = linPut
					err = db.Put(ctx, key, []byte(in.value))
					out.ok = err == nil
				case p < 55:
					in.kind = linPutIfAbsent
					var ver kv.Version
					ver, err = db.PutIfAbsent(ctx, key, []byte(in.value))
					if err == nil {
						out.ok = true
						tokens[key] = linToken{ver, in.value}
					}
				case p < 88 || !s.caps.Delete:
					in.kind = linPutIfVersion
					tok, ok := tokens[key]
					if !ok || r.IntN(10) == 0 {
						tok = linToken{ver: garbageToken}
					}
					in.expect = tok.value
					var ver kv.Version
					ver, err = db.PutIfVersion(ctx, key, []byte(in.value), tok.ver)
					if err == nil {
						out.ok = true
						tokens[key] = linToken{ver, in.value}
					}
				default:
					in.kind = linDelete
					err = db.Delete(ctx, key)
					out.ok = err == nil
				}
				ret := clock.Add(1)
				if errors.Is(err, kv.ErrConflict) {
					err = nil
				}
				if err != nil {
					failed.CompareAndSwap(nil, fmt.Errorf("client %d, %s: %w", c, linModel.DescribeOperation(in, out), err))
					return
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		t.Fatalf("an operation of the concurrent history failed: %v", err)
	}
	return history
}

func checkLinearizable(t testing.TB, s *suite) {
	for run := range 3 {
		// Each run starts from absent keys in a fresh namespace.
		a, b := s.twoClients(t)
		history := recordHistory(t, s, []*kv.DB{a, b}, uint64(run+1))
		res, info := porcupine.CheckOperationsVerbose(linModel, history, linTimeout)
		switch res {
		case porcupine.Illegal:
			where := ""
			if s.drawHistories {
				where = drawHistory(info)
			}
			t.Fatalf("run %d: a concurrent history of %d operations over %d keys from %d goroutines is not linearizable: no order of the operations consistent with real time explains the results (a conditional write that was not atomic, or a version token matching another write)%s",
				run, len(history), linKeys, linClients, where)
		case porcupine.Unknown:
			t.Logf("run %d: the linearizability check timed out after %v; inconclusive", run, linTimeout)
		}
	}
}

// drawHistory writes porcupine's drawing of a history to a temporary file
// and says where, for the failure message.
func drawHistory(info porcupine.LinearizationInfo) string {
	f, err := os.CreateTemp("", "kvtest-linearizability-*.html")
	if err != nil {
		return ""
	}
	defer f.Close()
	if porcupine.Visualize(linModel, info, f) != nil {
		return ""
	}
	return "; the history is drawn in " + f.Name()
}
