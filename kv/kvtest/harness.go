package kvtest

import (
	"testing"

	"agentkit/kv"
)

// Opener opens a client to one namespace made by Harness.NewNamespace. The
// suite closes what it opens.
type Opener func(t testing.TB) *kv.DB

// Harness tells the suite how to make stores of one backend.
type Harness struct {
	// NewNamespace creates a fresh, empty namespace for one test (a table,
	// a key prefix, a bucket, a folder) and returns an Opener for it. Each
	// call of the Opener opens a new client with its own connections, as
	// another process would. A process-local store may return the same
	// *kv.DB from every call. NewNamespace registers any clean-up with
	// t.Cleanup.
	NewNamespace func(t testing.TB) Opener
	// Shared is true when clients from separate Opener calls are
	// independent (separate pools or connections to one server, or one
	// database file opened twice). The cross-client checks then race two
	// clients.
	Shared bool
	// MaxValueSize is the driver's documented hard limit on value size, or
	// zero when values of at least 1 MiB round-trip. Past a limit the
	// driver must return kv.ErrTooLarge.
	MaxValueSize int
	// ManyKeys is how many keys the large listing check writes and lists.
	// Zero means DefaultManyKeys (10,000); a driver for a slow server may
	// set a smaller number, and should say why.
	ManyKeys int
}

// DefaultManyKeys is the number of keys the large listing check uses when
// Harness.ManyKeys is zero.
const DefaultManyKeys = 10000
