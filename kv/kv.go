// Package kv is agentkit's key-value contract: the one interface every store
// agentkit persists to implements, and the portable type that the runtime and
// users call.
//
// The contract has two halves, in the manner of database/sql and gocloud.dev:
//
//   - The driver side is a set of small interfaces. Putter is required;
//     Getter, Deleter and Lister are optional; CAS (compare-and-set) is an
//     optional group of four methods that is all or nothing. A backend is any
//     Go value implementing some of them, discovered by interface assertion.
//     Funcs adapts an existing client with a few function fields.
//   - The user side is [*DB], a concrete type with all eight methods. It
//     validates keys, checks contexts, wraps every error once with the
//     driver's name and the key, checks that drivers keep the ordering
//     promises of List, and reports missing capabilities as
//     errors.ErrUnsupported.
//
// Open selects a driver by URL ("mem://", "sqlite:/var/lib/agentkit/kv.db",
// "postgres://…"). Drivers register themselves with Register from their
// package's init function; programs choose which drivers to link with blank
// imports, as they do with database/sql.
//
// # Semantics every driver holds
//
// Get returns an error matching ErrNotFound only for a real miss. Put creates
// or overwrites and always gives the key a new Version, identical bytes
// included. Delete of a missing key succeeds. List and ListKeys return every
// key with the prefix exactly once, in ascending bytewise order. PutIfAbsent
// and PutIfVersion are atomic, and the loser gets ErrConflict. A Version is
// never reused for a key, including after delete and re-create. Values of at
// least 1 MiB round-trip; a driver with a smaller limit returns ErrTooLarge.
// Package kvtest checks all of this against any backend.
package kv

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"unicode/utf8"
)

// Entry is one key and its value, as List yields them.
type Entry struct {
	Key   string
	Value []byte
}

// Version is an opaque token naming one write of one key. It changes on every
// successful write of its key, a plain Put included, so a writer holding a
// stale Version is fenced instead of clobbering a newer value. Drivers never
// return the empty Version for an existing key; PutIfVersion with the empty
// Version therefore always fails with ErrConflict.
type Version string

// Errors every driver reports through errors.Is. Drivers wrap them (and their
// native error) rather than returning them bare; *DB adds the driver name and
// the key.
var (
	// ErrNotFound means the key does not exist. It is returned only for a
	// real miss: any other failure is a different error.
	ErrNotFound = errors.New("kv: key not found")
	// ErrConflict means a conditional write lost: PutIfAbsent found the key,
	// or PutIfVersion found a different version or no key. It is never
	// returned when the outcome is unknown (a timeout); that is a transport
	// error, because the write may have landed.
	ErrConflict = errors.New("kv: condition failed")
	// ErrExists accompanies ErrConflict when PutIfAbsent found the key
	// present. *DB adds it; errors.Is matches both.
	ErrExists = errors.New("kv: key already exists")
	// ErrTooLarge means the value exceeds a hard limit of the driver. The
	// value was not stored; nothing is ever truncated.
	ErrTooLarge = errors.New("kv: value too large")
	// ErrInvalidKey means a key or prefix breaks the rules of ValidateKey.
	ErrInvalidKey = errors.New("kv: invalid key")
	// ErrClosed means the store was closed.
	ErrClosed = errors.New("kv: store closed")
	// ErrReadOnly means a write through a DB opened with
	// OpenOptions.ReadOnly.
	ErrReadOnly = errors.New("kv: store opened read-only")
)

// maxQuotedKey is how much of a key an error message quotes.
const maxQuotedKey = 128

// quoteKey quotes a key for an error message, cut to maxQuotedKey bytes
// (at a character boundary) with its full length named, so an over-long
// key does not flood a log or a terminal.
func quoteKey(key string) string {
	if len(key) <= maxQuotedKey {
		return strconv.Quote(key)
	}
	cut := maxQuotedKey
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(key[:cut]), len(key))
}

// Putter is the one method every backend has: create or overwrite a key,
// giving it a new version. A nil value stores an empty value.
type Putter interface {
	Put(ctx context.Context, key string, value []byte) error
}

// Getter reads a key. It returns an error matching ErrNotFound only when the
// key does not exist; a nil error with an empty value means the stored value
// is empty.
type Getter interface {
	Get(ctx context.Context, key string) ([]byte, error)
}

// Deleter removes a key. Deleting a missing key is not an error.
type Deleter interface {
	Delete(ctx context.Context, key string) error
}

// Lister yields every entry whose key starts with prefix, in ascending
// bytewise key order, each exactly once. A key that existed before the
// listing began and was not deleted during it is always yielded. The empty
// prefix lists everything in the store's namespace and nothing else. An error
// is yielded once, as the last element.
type Lister interface {
	List(ctx context.Context, prefix string) iter.Seq2[Entry, error]
}

// AfterLister is the optional start-after capability of a listing. A
// backend with an index ordered by key (SQL, S3, a sorted map) starts a
// listing at a point itself, so a caller paging through n keys reads each
// once. Without it, DB's ListAfter and ListKeysAfter read the listing from
// the start of the prefix and drop the keys up to the point, which makes
// paging quadratic.
//
// Both methods yield what List and ListKeys of the prefix would, minus the
// keys that sort at or before after (bytewise), with List's guarantees: a
// key of the prefix that sorts after after and existed before the listing
// began, and was not deleted during it, is always yielded. after need not
// be a stored key, nor start with the prefix.
type AfterLister interface {
	ListAfter(ctx context.Context, prefix, after string) iter.Seq2[Entry, error]
	ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error]
}

// Store is the full core: Put, Get, Delete and List.
type Store interface {
	Putter
	Getter
	Deleter
	Lister
}

// CAS is the compare-and-set group. A backend implements all four methods or
// none. Conditional writes are atomic: among concurrent conditional writes
// against one version of a key exactly one succeeds, across every client of
// the store. The Version a write returns equals what GetWithVersion returns
// next, until the key is written again.
type CAS interface {
	// GetWithVersion returns the value and its current version, or an
	// error matching ErrNotFound.
	GetWithVersion(ctx context.Context, key string) ([]byte, Version, error)
	// PutIfAbsent writes only if the key does not exist; otherwise it
	// returns an error matching ErrConflict.
	PutIfAbsent(ctx context.Context, key string, value []byte) (Version, error)
	// PutIfVersion writes only if the key exists and its version equals
	// expected; otherwise (a missing key included) it returns an error
	// matching ErrConflict.
	PutIfVersion(ctx context.Context, key string, value []byte, expected Version) (Version, error)
	// ListKeys yields the keys with the prefix, with List's guarantees.
	ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error]
}
