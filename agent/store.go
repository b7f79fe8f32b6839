package agent

import (
	"context"
	"errors"
	"iter"
	"strings"
	"time"

	"agentkit/kv"
)

// timed wraps db so that every operation is reported to obs.StoreOp. The
// wrapper has exactly db's capabilities. Errors pass through unchanged
// except that db's own *kv.Error layer is removed, because the returned
// *kv.DB adds the same layer again.
func timed(db *kv.DB, obs Observer) *kv.DB {
	caps := db.Capabilities()
	report := func(op string, start time.Time, err error) error {
		obs.StoreOp(op, time.Since(start), err)
		return unwrapKV(err)
	}
	f := kv.Funcs{ProcessLocal: caps.ProcessLocal}
	f.Put = func(ctx context.Context, key string, value []byte) error {
		start := time.Now()
		return report("put", start, db.Put(ctx, key, value))
	}
	if caps.Get {
		f.Get = func(ctx context.Context, key string) ([]byte, error) {
			start := time.Now()
			v, err := db.Get(ctx, key)
			return v, report("get", start, err)
		}
	}
	if caps.Delete {
		f.Delete = func(ctx context.Context, key string) error {
			start := time.Now()
			return report("delete", start, db.Delete(ctx, key))
		}
	}
	if caps.List {
		f.List = func(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
			return timedSeq("list", db.List(ctx, prefix), report)
		}
	}
	if caps.CAS {
		f.CAS = kv.CASFuncs{
			ProcessLocal: caps.CASProcessLocal,
			GetWithVersion: func(ctx context.Context, key string) ([]byte, kv.Version, error) {
				start := time.Now()
				v, ver, err := db.GetWithVersion(ctx, key)
				return v, ver, report("get_with_version", start, err)
			},
			PutIfAbsent: func(ctx context.Context, key string, value []byte) (kv.Version, error) {
				start := time.Now()
				ver, err := db.PutIfAbsent(ctx, key, value)
				return ver, report("put_if_absent", start, err)
			},
			PutIfVersion: func(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
				start := time.Now()
				ver, err := db.PutIfVersion(ctx, key, value, expected)
				return ver, report("put_if_version", start, err)
			},
			ListKeys: func(ctx context.Context, prefix string) iter.Seq2[string, error] {
				return timedSeq("list_keys", db.ListKeys(ctx, prefix), report)
			},
		}
	}
	w, err := kv.New(db.Name(), f)
	if err != nil {
		return db // unreachable: f has db's valid capabilities
	}
	return w
}

// timedSeq reports a listing once its iteration ends.
func timedSeq[T any](op string, seq iter.Seq2[T, error], report func(string, time.Time, error) error) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		start := time.Now()
		var failed error
		defer func() { report(op, start, failed) }()
		for v, err := range seq {
			if err != nil {
				failed = err
				yield(v, unwrapKV(err))
				return
			}
			if !yield(v, nil) {
				return
			}
		}
	}
}

// unwrapKV removes one *kv.Error layer.
func unwrapKV(err error) error {
	var ke *kv.Error
	if errors.As(err, &ke) && ke == err {
		return ke.Err
	}
	return err
}

// redacted is what a continuation token becomes in logs and errors.
const redacted = "REDACTED"

// redactKey hides the token in a key of the continuations family.
func (r *Runtime) redactKey(key string) string {
	if p := r.scope.ContinuationsPrefix(); strings.HasPrefix(key, p) {
		return p + redacted
	}
	return key
}

// redactErr hides the token in a *kv.Error about a continuation key.
func (r *Runtime) redactErr(err error) error {
	var ke *kv.Error
	if errors.As(err, &ke) && strings.HasPrefix(ke.Key, r.scope.ContinuationsPrefix()) {
		c := *ke
		c.Key = r.redactKey(ke.Key)
		return &c
	}
	return err
}
