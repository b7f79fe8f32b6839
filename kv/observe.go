package kv

import (
	"context"
	"time"
)

// Op names a store operation as observers, metrics and logs see it.
type Op string

// The operations of the contract, one per method of DB.
const (
	OpPut            Op = "put"
	OpGet            Op = "get"
	OpDelete         Op = "delete"
	OpList           Op = "list"
	OpGetWithVersion Op = "get_with_version"
	OpPutIfAbsent    Op = "put_if_absent"
	OpPutIfVersion   Op = "put_if_version"
	OpListKeys       Op = "list_keys"
)

// Observation is one finished operation of an observed DB.
type Observation struct {
	// Op is the method.
	Op Op
	// Key is the key, or the prefix of a listing. It is the caller's key
	// as given: an observer that logs it redacts what must not be logged
	// (package keys' Redact hides continuation tokens).
	Key string
	// Duration runs from the call to its return; for a listing, until its
	// iteration ended (exhausted, failed, or stopped by the caller).
	Duration time.Duration
	// Err is the error the caller got (a *Error), or nil. A Get of a
	// missing key is an error matching ErrNotFound; a lost conditional
	// write one matching ErrConflict.
	Err error
}

// Observer receives the operations of a DB made by WithObserver, each once,
// after it finished, on the caller's goroutine. It must be quick and safe
// for concurrent use.
type Observer func(ctx context.Context, o Observation)

// WithObserver returns a DB that reports every operation to obs, including
// those refused before they reach the backend (an invalid key, a missing
// capability, a closed store). The returned DB shares d's backend, name,
// capabilities and closed state: it is one store seen through a second
// handle, so each call is validated once and its error wrapped once, and
// Backend still returns the driver value (for driver methods such as
// pgkv's Drop). Closing either handle closes the store for both. A DB that
// already has observers keeps them; obs is called after them. A nil obs
// returns d.
func (d *DB) WithObserver(obs Observer) *DB {
	if obs == nil {
		return d
	}
	c := *d
	c.obs = append(append([]Observer(nil), d.obs...), obs)
	return &c
}

// observe reports one finished keyed operation. It is deferred by the
// methods of DB, with start taken when they were called.
func (d *DB) observe(ctx context.Context, op Op, key string, start time.Time, errp *error) {
	o := Observation{Op: op, Key: key, Duration: time.Since(start), Err: *errp}
	for _, obs := range d.obs {
		obs(ctx, o)
	}
}
