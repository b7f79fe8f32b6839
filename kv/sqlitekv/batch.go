package sqlitekv

import (
	"context"
	"errors"
	"fmt"

	"agentkit/kv"
)

var _ kv.Batcher = (*store)(nil)

// WriteBatch applies ops in one transaction on the writing connection: it
// takes the write lock at its start (BEGIN IMMEDIATE, waiting up to the
// busy timeout for other processes), runs each op's statement, and
// commits once (one fsync with synchronous=FULL). A condition that fails
// rolls the whole transaction back.
func (s *store) WriteBatch(ctx context.Context, ops []kv.BatchOp) (_ []kv.Version, err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, s.mapErr(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	vers := make([]kv.Version, len(ops))
	for i, op := range ops {
		var err error
		switch op.Kind {
		case kv.BatchPut:
			vers[i], err = scanVersion(tx.StmtContext(ctx, s.put).QueryContext(ctx, op.Key, op.Value))
		case kv.BatchPutIfAbsent:
			vers[i], err = scanVersion(tx.StmtContext(ctx, s.putAbsent).QueryContext(ctx, op.Key, op.Value))
		case kv.BatchPutIfVersion:
			var want int64
			if want, err = parseVersion(op.Version); err == nil {
				vers[i], err = scanVersion(tx.StmtContext(ctx, s.putVersion).QueryContext(ctx, op.Key, op.Value, want))
			}
		case kv.BatchDelete:
			_, err = tx.StmtContext(ctx, s.del).ExecContext(ctx, op.Key)
		default:
			err = fmt.Errorf("sqlitekv: op %d of the batch has kind %v", i, op.Kind)
		}
		if err != nil {
			if errors.Is(err, kv.ErrConflict) {
				return nil, &kv.BatchError{Index: i, Err: err}
			}
			return nil, s.mapErr(err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, s.mapErr(err)
	}
	return vers, nil
}
