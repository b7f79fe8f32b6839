package kv

import (
	"errors"
	"fmt"
)

// TxViewer is the optional capability of a backend that lives inside a
// larger database its caller also writes: the embedded default store,
// kept in the session database of package agent/sessiondb beside the
// runtime's own tables. TxView returns the backend as tx, a transaction of
// that database, sees it: its reads and writes run in tx and commit (or
// roll back) with it, so the caller's rows and the store's records land
// together. tx is the database's own transaction value; TxView refuses a
// transaction of another database. A store that is its own database
// (every registered driver) does not implement it, and nothing asks it
// of them: writes that must be atomic across keys use Batcher.
type TxViewer interface {
	TxView(tx any) (any, error)
}

// InTx returns the store as tx sees it (TxViewer): the same name,
// observers and capabilities, its operations running inside tx. A backend
// without the capability is an error matching errors.ErrUnsupported.
func (d *DB) InTx(tx any) (*DB, error) {
	tv, ok := d.raw.(TxViewer)
	if !ok {
		return nil, fmt.Errorf("%s: %w: the store does not run inside a caller's transaction (kv.TxViewer)", d.name, errors.ErrUnsupported)
	}
	view, err := tv.TxView(tx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name, err)
	}
	v, err := New(d.name, view)
	if err != nil {
		return nil, err
	}
	v.obs, v.closed, v.readOnly = d.obs, d.closed, d.readOnly
	return v, nil
}
