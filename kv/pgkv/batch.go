package pgkv

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"agentkit/kv"
)

var _ kv.Batcher = (*Store)(nil)

// batchStatements are the SQL of a batch's ops for one table. Each
// returns one row; a conditional op whose condition fails raises an error
// instead of returning no row, because an error is what makes PostgreSQL
// abandon the rest of the batch and roll it back: a PutIfAbsent of a taken
// key fails the primary key (unique_violation), and a PutIfVersion that
// updated nothing divides by the number of rows it updated
// (division_by_zero). Those two errors on those ops, and only they, are
// conflicts.
type batchStatements struct {
	put, putIfAbsent, putIfVersion, del string
}

func newBatchStatements(table string) batchStatements {
	t := pgx.Identifier{table}.Sanitize()
	return batchStatements{
		put:          "INSERT INTO " + t + " (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, version = DEFAULT RETURNING version",
		putIfAbsent:  "INSERT INTO " + t + " (key, value) VALUES ($1, $2) RETURNING version",
		putIfVersion: "WITH u AS (UPDATE " + t + " SET value = $2, version = DEFAULT WHERE key = $1 AND version = $3 RETURNING version) SELECT (SELECT version FROM u), 1 / (SELECT count(*)::int FROM u)",
		del:          "DELETE FROM " + t + " WHERE key = $1 RETURNING 0::bigint",
	}
}

// SQLSTATEs that mean a batch op's condition failed.
const (
	uniqueViolation = "23505"
	divisionByZero  = "22012"
)

// WriteBatch applies ops in one round trip and one transaction: the
// statements go to the server as one pipeline ending in a single Sync, so
// PostgreSQL runs them in one implicit transaction, committed at the Sync
// when every statement succeeded and rolled back at the first that
// failed.
func (s *Store) WriteBatch(ctx context.Context, ops []kv.BatchOp) ([]kv.Version, error) {
	sql := newBatchStatements(s.table)
	b := &pgx.Batch{}
	for i, op := range ops {
		if op.Kind != kv.BatchDelete {
			if err := s.checkSize(op.Value); err != nil {
				return nil, err
			}
		}
		switch op.Kind {
		case kv.BatchPut:
			b.Queue(sql.put, op.Key, op.Value)
		case kv.BatchPutIfAbsent:
			b.Queue(sql.putIfAbsent, op.Key, op.Value)
		case kv.BatchPutIfVersion:
			want, err := strconv.ParseInt(string(op.Version), 10, 64)
			if err != nil || want <= 0 || versionOf(want) != op.Version {
				return nil, &kv.BatchError{Index: i, Err: fmt.Errorf("%w: the version is not one this driver issued", kv.ErrConflict)}
			}
			b.Queue(sql.putIfVersion, op.Key, op.Value, want)
		case kv.BatchDelete:
			b.Queue(sql.del, op.Key)
		default:
			return nil, fmt.Errorf("pgkv: op %d of the batch has kind %v", i, op.Kind)
		}
	}
	br := s.pool.SendBatch(ctx, b)
	vers := make([]kv.Version, len(ops))
	var failed error
	for i, op := range ops {
		if op.Kind == kv.BatchDelete {
			_, err := br.Exec()
			if err != nil && failed == nil {
				failed = s.err(err)
			}
			continue
		}
		var n *int64
		var one *int32
		var err error
		if op.Kind == kv.BatchPutIfVersion {
			err = br.QueryRow().Scan(&n, &one)
		} else {
			err = br.QueryRow().Scan(&n)
		}
		if err != nil && failed == nil {
			failed = s.batchErr(i, op, err)
		}
		if err == nil && n != nil {
			vers[i] = versionOf(*n)
		}
	}
	if err := br.Close(); err != nil && failed == nil {
		failed = s.err(err)
	}
	if failed != nil {
		return nil, failed
	}
	return vers, nil
}

// batchErr turns the error of op i into a conflict when it is its
// condition failing, and returns any other error as it is.
func (s *Store) batchErr(i int, op kv.BatchOp, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case op.Kind == kv.BatchPutIfAbsent && pe.Code == uniqueViolation:
			return &kv.BatchError{Index: i, Err: fmt.Errorf("%w: %w", kv.ErrConflict, kv.ErrExists)}
		case op.Kind == kv.BatchPutIfVersion && pe.Code == divisionByZero:
			return &kv.BatchError{Index: i, Err: fmt.Errorf("%w: the key is missing or its version changed", kv.ErrConflict)}
		}
	}
	return s.err(err)
}
