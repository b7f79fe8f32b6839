package kv

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// BatchKind is the kind of one write of a batch.
type BatchKind uint8

// The writes a batch can hold: the core's Put and Delete and the CAS
// group's conditional writes, with the same meaning as the methods.
const (
	BatchPut BatchKind = iota + 1
	BatchPutIfAbsent
	BatchPutIfVersion
	BatchDelete
)

// String names the kind as the method it stands for.
func (k BatchKind) String() string {
	switch k {
	case BatchPut:
		return "Put"
	case BatchPutIfAbsent:
		return "PutIfAbsent"
	case BatchPutIfVersion:
		return "PutIfVersion"
	case BatchDelete:
		return "Delete"
	}
	return fmt.Sprintf("BatchKind(%d)", uint8(k))
}

// BatchOp is one write of a batch.
type BatchOp struct {
	Kind  BatchKind
	Key   string
	Value []byte // for the puts
	// Version is the version a BatchPutIfVersion expects.
	Version Version
}

// Batcher is the optional batch capability: several writes applied in one
// call, all or none. Drivers whose backend has transactions implement it
// (SQLite and PostgreSQL in one transaction, the memory driver under its
// lock); a backend implementing it implements the CAS group too.
//
// WriteBatch applies ops in order, atomically: either every op is applied,
// or none is and no reader ever saw a part of them. It returns the version
// each op gave its key (empty for a delete). When the condition of a
// conditional op fails, nothing is applied and the error is a *BatchError
// with that op's Index and Applied 0, matching ErrConflict (and ErrExists
// for a PutIfAbsent), as the lone method's would. Any other error leaves
// the outcome unknown, as for a single write. ops is never empty; *DB
// validates it first.
type Batcher interface {
	WriteBatch(ctx context.Context, ops []BatchOp) ([]Version, error)
}

// BatchError says which op of a batch failed, and how many before it were
// applied: 0 when the batch is atomic (the backend is a Batcher), Index
// when *DB applied the ops one by one.
type BatchError struct {
	Index   int
	Applied int
	Err     error
}

// Error names the failed op.
func (e *BatchError) Error() string {
	return fmt.Sprintf("op %d of the batch (%d applied before it): %v", e.Index, e.Applied, e.Err)
}

// Unwrap returns the op's error.
func (e *BatchError) Unwrap() error { return e.Err }

// OpWriteBatch is a WriteBatch, as observers see it: Key is its first key.
const OpWriteBatch Op = "write_batch"

// WriteBatch applies ops in order. With a Batcher backend
// (Capabilities().Batch) it is atomic and one call to the backend;
// otherwise *DB applies the ops one at a time with the backend's methods
// and stops at the first failure, leaving the ops before it applied (the
// *BatchError's Applied says how many): callers that need all or nothing
// either check Capabilities().Batch or order their ops so that a prefix
// is harmless. An empty batch does nothing.
//
// Each op is validated as its method validates it; a PutIfVersion with the
// empty Version fails with ErrConflict before anything is written. A
// conditional op on a store without the CAS group, or a delete on one
// without Delete, is errors.ErrUnsupported, found before anything is
// written. It returns the version each op gave its key (empty for a
// delete).
func (d *DB) WriteBatch(ctx context.Context, ops []BatchOp) (_ []Version, err error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if d.obs != nil {
		defer d.observe(ctx, OpWriteBatch, ops[0].Key, time.Now(), &err)
	}
	if err := d.checkBatch(ctx, ops); err != nil {
		return nil, err
	}
	if d.batch != nil {
		for i, op := range ops {
			if op.Value == nil && op.Kind != BatchDelete {
				// Drivers get a non-nil value for every put, as Put's do.
				ops = append([]BatchOp(nil), ops...)
				for j := i; j < len(ops); j++ {
					if ops[j].Kind != BatchDelete {
						ops[j].Value = nonNil(ops[j].Value)
					}
				}
				break
			}
		}
		vers, err := d.batch.WriteBatch(ctx, ops)
		if err != nil {
			return nil, d.wrapBatch(ctx, ops, err)
		}
		if len(vers) != len(ops) {
			return nil, d.wrap(ctx, "write batch", ops[0].Key, fmt.Errorf("%w: WriteBatch returned %d versions for %d ops", ErrBrokenDriver, len(vers), len(ops)))
		}
		for i, op := range ops {
			if op.Kind != BatchDelete && vers[i] == "" {
				return nil, d.wrap(ctx, "write batch", op.Key, fmt.Errorf("%w: WriteBatch returned an empty version for op %d", ErrBrokenDriver, i))
			}
		}
		return vers, nil
	}
	vers := make([]Version, len(ops))
	for i, op := range ops {
		var err error
		switch op.Kind {
		case BatchPut:
			err = d.put.Put(ctx, op.Key, nonNil(op.Value))
		case BatchDelete:
			err = d.del.Delete(ctx, op.Key)
		case BatchPutIfAbsent:
			vers[i], err = d.cas.PutIfAbsent(ctx, op.Key, nonNil(op.Value))
			err = conflictExists(err)
		case BatchPutIfVersion:
			vers[i], err = d.cas.PutIfVersion(ctx, op.Key, nonNil(op.Value), op.Version)
		}
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return nil, d.wrap(ctx, "write batch", op.Key, &BatchError{Index: i, Applied: i, Err: err})
		}
	}
	return vers, nil
}

// checkBatch validates a batch before anything is written.
func (d *DB) checkBatch(ctx context.Context, ops []BatchOp) error {
	if d.closed.Load() {
		return &Error{Driver: d.name, Op: "write batch", Key: ops[0].Key, Err: ErrClosed}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Driver: d.name, Op: "write batch", Key: ops[0].Key, Err: err}
	}
	for i, op := range ops {
		var err error
		switch op.Kind {
		case BatchPut:
		case BatchDelete:
			if d.del == nil {
				err = unsupported("Delete")
			}
		case BatchPutIfAbsent:
			if d.cas == nil {
				err = unsupported("PutIfAbsent")
			}
		case BatchPutIfVersion:
			switch {
			case d.cas == nil:
				err = unsupported("PutIfVersion")
			case op.Version == "":
				err = fmt.Errorf("%w: the expected version is empty (use PutIfAbsent to create a key)", ErrConflict)
			}
		default:
			err = fmt.Errorf("kv: op %d of the batch has no kind; set Kind to BatchPut, BatchPutIfAbsent, BatchPutIfVersion or BatchDelete", i)
		}
		if err == nil {
			err = ValidateKey(op.Key)
		}
		if err != nil {
			return &Error{Driver: d.name, Op: "write batch", Key: op.Key, Err: &BatchError{Index: i, Err: err}}
		}
	}
	return nil
}

// wrapBatch wraps an atomic batch's error, adding ErrExists or ErrConflict
// to a failed PutIfAbsent's conflict as PutIfAbsent does.
func (d *DB) wrapBatch(ctx context.Context, ops []BatchOp, err error) error {
	key := ops[0].Key
	var be *BatchError
	if errors.As(err, &be) && be.Index >= 0 && be.Index < len(ops) {
		key = ops[be.Index].Key
		if ops[be.Index].Kind == BatchPutIfAbsent {
			if c := conflictExists(be.Err); c != be.Err {
				err = &BatchError{Index: be.Index, Applied: be.Applied, Err: c}
			}
		}
	}
	return d.wrap(ctx, "write batch", key, err)
}

// conflictExists makes a PutIfAbsent conflict match both ErrConflict and
// ErrExists.
func conflictExists(err error) error {
	switch c, e := errors.Is(err, ErrConflict), errors.Is(err, ErrExists); {
	case c && !e:
		return fmt.Errorf("%w: %w", ErrExists, err)
	case e && !c:
		return fmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}
