package kv

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// MaxKeyLength is the longest key, in bytes, the contract accepts. Every key
// agentkit builds (package keys) fits well inside it, and every driver
// stores keys of this length.
const MaxKeyLength = 1024

// ErrBrokenDriver is wrapped in the error *DB returns when a driver breaks a
// promise *DB can see: a List out of order, with a repeat or outside its
// prefix, or an empty Version.
var ErrBrokenDriver = errors.New("kv: driver broke the contract")

// ValidateKey reports whether key is usable: non-empty, at most MaxKeyLength
// bytes, valid UTF-8, and free of NUL bytes. The error matches ErrInvalidKey
// and says what to change.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	return validatePrefix(key)
}

func validatePrefix(p string) error {
	switch {
	case len(p) > MaxKeyLength:
		return fmt.Errorf("%w: %d bytes is longer than the %d-byte limit; encode long segments with package keys", ErrInvalidKey, len(p), MaxKeyLength)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: it is not valid UTF-8; encode it with package keys", ErrInvalidKey)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: it contains a NUL byte; encode it with package keys", ErrInvalidKey)
	}
	return nil
}

// Error is the error every *DB method returns: the operation, the driver and
// the key (never the value), around the driver's error. errors.Is sees
// through it to the sentinels and the driver's native error.
type Error struct {
	Driver string // the driver's name, such as "sqlite"
	Op     string // the method, such as "put" or "list"
	Key    string // the key, or the prefix for list operations
	Err    error
}

// Error formats the error as "driver: op \"key\": cause".
func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s %s: %v", e.Driver, e.Op, quoteKey(e.Key), e.Err)
}

// Unwrap returns the wrapped error.
func (e *Error) Unwrap() error { return e.Err }

// DB is the portable handle to one store: what the runtime and users call.
// It has all eight methods of the contract whatever the backend provides; a
// missing capability is an error matching errors.ErrUnsupported. A DB is safe
// for concurrent use when its backend is, which every registered driver is.
type DB struct {
	name string
	caps Capabilities
	raw  any
	put  Putter
	get  Getter
	del  Deleter
	list Lister
	cas  CAS
	// batch is the backend's atomic batch (Batcher), or nil.
	batch Batcher
	// closed is shared by the handles WithObserver makes.
	closed *atomic.Bool
	obs    []Observer
	// readOnly is set by OpenWith for OpenOptions.ReadOnly.
	readOnly bool
}

var (
	_ Store              = (*DB)(nil)
	_ CAS                = (*DB)(nil)
	_ CapabilityReporter = (*DB)(nil)
)

// New returns the portable handle over a backend: any value implementing at
// least Putter, such as a Funcs. name labels errors and diagnostics (a
// driver's name, "postgres"; or the user's, "billing-db"). New fails when the
// backend has no Put or a partial CAS group, naming what is missing. A *DB
// passed as backend is returned as it is.
func New(name string, backend any) (*DB, error) {
	if d, ok := backend.(*DB); ok {
		if d == nil {
			return nil, fmt.Errorf("%s: the backend is a nil *kv.DB", name)
		}
		return d, nil
	}
	if name == "" {
		name = "kv"
	}
	caps := Discover(backend)
	if err := caps.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d := &DB{name: name, caps: caps, raw: backend, closed: new(atomic.Bool)}
	switch f := backend.(type) {
	case Funcs:
		backend = funcsBackend{f}
	case *Funcs:
		backend = funcsBackend{*f}
	}
	d.put = backend.(Putter)
	if caps.Get {
		d.get = backend.(Getter)
	}
	if caps.Delete {
		d.del = backend.(Deleter)
	}
	if caps.List {
		d.list = backend.(Lister)
	}
	if caps.CAS {
		d.cas = backend.(CAS)
	}
	if caps.Batch {
		d.batch = backend.(Batcher)
	}
	return d, nil
}

// Name returns the label given to New (for opened stores, the driver name).
func (d *DB) Name() string { return d.name }

// Capabilities reports what the backend provides.
func (d *DB) Capabilities() Capabilities { return d.caps }

// Backend returns the value New wrapped, for drivers' own tests and for
// reaching driver-specific methods.
func (d *DB) Backend() any { return d.raw }

// ProcessLocal reports whether the store keeps its data in process memory.
func (d *DB) ProcessLocal() bool { return d.caps.ProcessLocal }

// Close closes the backend if it has a Close method. Later calls on d fail
// with ErrClosed. Close is idempotent.
func (d *DB) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	if c, ok := d.raw.(interface{ Close() error }); ok {
		if err := c.Close(); err != nil {
			return &Error{Driver: d.name, Op: "close", Err: err}
		}
	}
	return nil
}

// wrap turns a driver error into *Error, adding ctx's error when the context
// ended so callers can match context.Canceled or DeadlineExceeded.
func (d *DB) wrap(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	return &Error{Driver: d.name, Op: op, Key: key, Err: err}
}

// preList runs pre's checks for a listing, and checks its start point.
func (d *DB) preList(ctx context.Context, op, prefix, after string, present bool, method string) error {
	if err := d.pre(ctx, op, prefix, present, method); err != nil {
		return err
	}
	if err := validatePrefix(after); err != nil {
		return &Error{Driver: d.name, Op: op, Key: prefix, Err: fmt.Errorf("the start point (after): %w", err)}
	}
	return nil
}

// pre runs the checks every keyed method shares.
func (d *DB) pre(ctx context.Context, op, key string, present bool, method string) error {
	var err error
	switch {
	case d.closed.Load():
		err = ErrClosed
	case !present:
		err = unsupported(method)
	case d.readOnly && isWrite(op):
		err = ErrReadOnly
	default:
		if op == "list" || op == "list keys" {
			err = validatePrefix(key)
		} else {
			err = ValidateKey(key)
		}
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		return &Error{Driver: d.name, Op: op, Key: key, Err: err}
	}
	return nil
}

// Put creates or overwrites key with value, giving it a new version.
func (d *DB) Put(ctx context.Context, key string, value []byte) (err error) {
	if d.obs != nil {
		defer d.observe(ctx, OpPut, key, time.Now(), &err)
	}
	if err := d.pre(ctx, "put", key, true, "Put"); err != nil {
		return err
	}
	if value == nil {
		value = []byte{}
	}
	return d.wrap(ctx, "put", key, d.put.Put(ctx, key, value))
}

// Get returns the value of key, or an error matching ErrNotFound when the key
// does not exist. A stored empty value is returned as a non-nil empty slice.
func (d *DB) Get(ctx context.Context, key string) (_ []byte, err error) {
	if d.obs != nil {
		defer d.observe(ctx, OpGet, key, time.Now(), &err)
	}
	if err := d.pre(ctx, "get", key, d.get != nil, "Get"); err != nil {
		return nil, err
	}
	v, err := d.get.Get(ctx, key)
	if err != nil {
		return nil, d.wrap(ctx, "get", key, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// Delete removes key. Deleting a missing key succeeds.
func (d *DB) Delete(ctx context.Context, key string) (err error) {
	if d.obs != nil {
		defer d.observe(ctx, OpDelete, key, time.Now(), &err)
	}
	if err := d.pre(ctx, "delete", key, d.del != nil, "Delete"); err != nil {
		return err
	}
	return d.wrap(ctx, "delete", key, d.del.Delete(ctx, key))
}

// List yields every entry whose key starts with prefix, in ascending bytewise
// key order, each once. An error ends the sequence.
func (d *DB) List(ctx context.Context, prefix string) iter.Seq2[Entry, error] {
	return d.entries(ctx, prefix, "", false)
}

// ListAfter yields what List(ctx, prefix) would, minus the keys that sort
// at or before after: the next page of a listing that stopped at after.
// On a backend with the start-after capability (Capabilities.ListAfter)
// the listing starts at the point; on others it reads the prefix from its
// start and drops the keys up to the point, so prefer large pages there.
// after need not be a stored key; "" lists the whole prefix.
func (d *DB) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[Entry, error] {
	return d.entries(ctx, prefix, after, true)
}

func (d *DB) entries(ctx context.Context, prefix, after string, from bool) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		var failed error
		if d.obs != nil {
			defer d.observe(ctx, OpList, prefix, time.Now(), &failed)
		}
		if err := d.preList(ctx, "list", prefix, after, d.list != nil, "List"); err != nil {
			failed = err
			yield(Entry{}, err)
			return
		}
		var seq iter.Seq2[Entry, error]
		switch {
		case !from:
			seq = d.list.List(ctx, prefix)
		case d.caps.ListAfter:
			seq = d.list.(AfterLister).ListAfter(ctx, prefix, after)
		default:
			seq = skipTo(d.list.List(ctx, prefix), after, func(e Entry) string { return e.Key })
		}
		check := orderCheck{prefix: prefix, after: after}
		for e, err := range seq {
			if err == nil {
				err = check.next(e.Key)
			}
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				failed = d.wrap(ctx, "list", prefix, err)
				yield(Entry{}, failed)
				return
			}
			if e.Value == nil {
				e.Value = []byte{}
			}
			if !yield(e, nil) {
				return
			}
		}
	}
}

// skipTo drops the elements of seq whose key sorts at or before after.
func skipTo[T any](seq iter.Seq2[T, error], after string, key func(T) string) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for v, err := range seq {
			if err == nil && key(v) <= after {
				continue
			}
			if !yield(v, err) || err != nil {
				return
			}
		}
	}
}

// GetWithVersion returns the value of key and its current version.
func (d *DB) GetWithVersion(ctx context.Context, key string) (_ []byte, _ Version, err error) {
	if d.obs != nil {
		defer d.observe(ctx, OpGetWithVersion, key, time.Now(), &err)
	}
	if err := d.pre(ctx, "get with version", key, d.cas != nil, "GetWithVersion"); err != nil {
		return nil, "", err
	}
	v, ver, err := d.cas.GetWithVersion(ctx, key)
	if err == nil && ver == "" {
		err = fmt.Errorf("%w: GetWithVersion returned an empty version", ErrBrokenDriver)
	}
	if err != nil {
		return nil, "", d.wrap(ctx, "get with version", key, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, ver, nil
}

// PutIfAbsent writes key only if it does not exist. When it does, the error
// matches both ErrConflict and ErrExists.
func (d *DB) PutIfAbsent(ctx context.Context, key string, value []byte) (_ Version, err error) {
	if d.obs != nil {
		defer d.observe(ctx, OpPutIfAbsent, key, time.Now(), &err)
	}
	if err := d.pre(ctx, "put if absent", key, d.cas != nil, "PutIfAbsent"); err != nil {
		return "", err
	}
	if value == nil {
		value = []byte{}
	}
	ver, err := d.cas.PutIfAbsent(ctx, key, value)
	switch c, e := errors.Is(err, ErrConflict), errors.Is(err, ErrExists); {
	case c && !e:
		err = fmt.Errorf("%w: %w", ErrExists, err)
	case e && !c:
		err = fmt.Errorf("%w: %w", ErrConflict, err)
	}
	if err == nil && ver == "" {
		err = fmt.Errorf("%w: PutIfAbsent returned an empty version", ErrBrokenDriver)
	}
	return ver, d.wrap(ctx, "put if absent", key, err)
}

// PutIfVersion writes key only if it exists with version expected. A missing
// key, another version, or the empty Version is an error matching
// ErrConflict.
func (d *DB) PutIfVersion(ctx context.Context, key string, value []byte, expected Version) (_ Version, err error) {
	if d.obs != nil {
		defer d.observe(ctx, OpPutIfVersion, key, time.Now(), &err)
	}
	if err := d.pre(ctx, "put if version", key, d.cas != nil, "PutIfVersion"); err != nil {
		return "", err
	}
	if expected == "" {
		return "", &Error{Driver: d.name, Op: "put if version", Key: key,
			Err: fmt.Errorf("%w: the expected version is empty (use PutIfAbsent to create a key)", ErrConflict)}
	}
	if value == nil {
		value = []byte{}
	}
	ver, err := d.cas.PutIfVersion(ctx, key, value, expected)
	if err == nil && ver == "" {
		err = fmt.Errorf("%w: PutIfVersion returned an empty version", ErrBrokenDriver)
	}
	return ver, d.wrap(ctx, "put if version", key, err)
}

// ListKeys yields the keys with the prefix, with List's guarantees. Without a
// CAS group it falls back to List and drops the values.
func (d *DB) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return d.keys(ctx, prefix, "", false)
}

// ListKeysAfter yields what ListKeys(ctx, prefix) would, minus the keys
// that sort at or before after, as ListAfter does for entries.
func (d *DB) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return d.keys(ctx, prefix, after, true)
}

func (d *DB) keys(ctx context.Context, prefix, after string, from bool) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		var failed error
		if d.obs != nil {
			defer d.observe(ctx, OpListKeys, prefix, time.Now(), &failed)
		}
		if err := d.preList(ctx, "list keys", prefix, after, d.cas != nil || d.list != nil, "ListKeys"); err != nil {
			failed = err
			yield("", err)
			return
		}
		var seq iter.Seq2[string, error]
		switch {
		case from && d.caps.ListAfter:
			seq = d.list.(AfterLister).ListKeysAfter(ctx, prefix, after)
		case d.cas != nil:
			seq = d.cas.ListKeys(ctx, prefix)
		default:
			seq = func(yield func(string, error) bool) {
				for e, err := range d.list.List(ctx, prefix) {
					if !yield(e.Key, err) || err != nil {
						return
					}
				}
			}
		}
		if from && !d.caps.ListAfter {
			seq = skipTo(seq, after, func(k string) string { return k })
		}
		check := orderCheck{prefix: prefix, after: after}
		for k, err := range seq {
			if err == nil {
				err = check.next(k)
			}
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				failed = d.wrap(ctx, "list keys", prefix, err)
				yield("", failed)
				return
			}
			if !yield(k, nil) {
				return
			}
		}
	}
}

// orderCheck verifies a listing stays inside its prefix, after its start
// point, in strictly ascending order.
type orderCheck struct {
	prefix  string
	after   string // "" for a listing from the start of the prefix
	last    string
	started bool
}

func (c *orderCheck) next(key string) error {
	if !strings.HasPrefix(key, c.prefix) {
		return fmt.Errorf("%w: listing yielded %q, outside the prefix", ErrBrokenDriver, key)
	}
	if key <= c.after {
		return fmt.Errorf("%w: a listing after %q yielded %q, which sorts at or before it", ErrBrokenDriver, c.after, key)
	}
	if c.started && key <= c.last {
		what := "out of ascending order"
		if key == c.last {
			what = "twice"
		}
		return fmt.Errorf("%w: listing yielded %q %s (after %q); List must yield each key once in ascending bytewise order", ErrBrokenDriver, key, what, c.last)
	}
	c.last, c.started = key, true
	return nil
}
