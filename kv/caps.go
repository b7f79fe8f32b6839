package kv

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
)

// Capabilities says which parts of the contract a backend provides.
type Capabilities struct {
	Put    bool
	Get    bool
	Delete bool
	List   bool
	// CAS is true only when all four methods of the CAS group are present.
	CAS bool
	// Batch is true when the backend applies batches atomically
	// (Batcher); it comes with the CAS group, and is false without it.
	Batch bool
	// ListAfter is true when the backend starts a listing after a key
	// itself (AfterLister), so a page costs what it yields. Without it,
	// DB.ListAfter still works, by reading and dropping the keys up to the
	// point. It is false without List.
	ListAfter bool
	// MissingCAS names the CAS methods a partial group lacks, in contract
	// order. It is empty when the group is complete or wholly absent.
	MissingCAS []string
	// ProcessLocal is true when the plain methods keep data in this
	// process's memory only (the memory driver).
	ProcessLocal bool
	// CASProcessLocal is true when the CAS group keeps its data in this
	// process's memory only. Pairing such a group with durable plain methods
	// is the configuration coordination features must refuse.
	CASProcessLocal bool
}

// CapabilityReporter is implemented by backends whose method set does not say
// what they can do, such as Funcs (every field is a method, set or not) and
// wrappers such as *DB. Discover trusts it over interface assertions.
type CapabilityReporter interface {
	Capabilities() Capabilities
}

// ProcessLocaler is implemented by backends that can say whether they keep
// data in process memory only.
type ProcessLocaler interface {
	ProcessLocal() bool
}

// The CAS methods one by one, so a partial group can be named.
type (
	getWithVersioner interface {
		GetWithVersion(ctx context.Context, key string) ([]byte, Version, error)
	}
	putIfAbsenter interface {
		PutIfAbsent(ctx context.Context, key string, value []byte) (Version, error)
	}
	putIfVersioner interface {
		PutIfVersion(ctx context.Context, key string, value []byte, expected Version) (Version, error)
	}
	keyLister interface {
		ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error]
	}
)

// Discover reports the capabilities of a backend. A nil backend has none.
func Discover(backend any) Capabilities {
	if backend == nil {
		return Capabilities{}
	}
	if d, ok := backend.(*DB); ok && d == nil {
		return Capabilities{}
	}
	switch f := backend.(type) {
	case Funcs:
		return f.Capabilities()
	case *Funcs:
		return f.Capabilities()
	}
	if r, ok := backend.(CapabilityReporter); ok {
		return r.Capabilities()
	}
	var c Capabilities
	_, c.Put = backend.(Putter)
	_, c.Get = backend.(Getter)
	_, c.Delete = backend.(Deleter)
	_, c.List = backend.(Lister)
	_, c.ListAfter = backend.(AfterLister)
	c.ListAfter = c.ListAfter && c.List
	present := []bool{false, false, false, false}
	_, present[0] = backend.(getWithVersioner)
	_, present[1] = backend.(putIfAbsenter)
	_, present[2] = backend.(putIfVersioner)
	_, present[3] = backend.(keyLister)
	c.CAS, c.MissingCAS = casGroup(present)
	if _, ok := backend.(Batcher); ok && c.CAS {
		c.Batch = true
	}
	if p, ok := backend.(ProcessLocaler); ok && p.ProcessLocal() {
		c.ProcessLocal = true
		c.CASProcessLocal = c.CAS
	}
	return c
}

// casMethods are the CAS group's method names in contract order.
var casMethods = []string{"GetWithVersion", "PutIfAbsent", "PutIfVersion", "ListKeys"}

// casGroup turns per-method presence into (complete, missing-if-partial).
func casGroup(present []bool) (bool, []string) {
	var missing []string
	n := 0
	for i, ok := range present {
		if ok {
			n++
		} else {
			missing = append(missing, casMethods[i])
		}
	}
	switch n {
	case len(casMethods):
		return true, nil
	case 0:
		return false, nil
	default:
		return false, missing
	}
}

// Validate reports what makes the capabilities unusable as a backend: no Put,
// or a partial CAS group (naming the missing methods).
func (c Capabilities) Validate() error {
	var errs []error
	if !c.Put {
		errs = append(errs, errors.New("kv: the backend has no Put method; Put(ctx, key, value) error is required"))
	}
	if len(c.MissingCAS) > 0 {
		errs = append(errs, fmt.Errorf("kv: the CAS group is partial: missing %s; implement all four of GetWithVersion, PutIfAbsent, PutIfVersion and ListKeys, or none",
			strings.Join(c.MissingCAS, ", ")))
	}
	return errors.Join(errs...)
}

// String lists the capabilities present, for logs and diagnostics.
func (c Capabilities) String() string {
	var parts []string
	for _, p := range []struct {
		name string
		ok   bool
	}{{"put", c.Put}, {"get", c.Get}, {"delete", c.Delete}, {"list", c.List}, {"list-after", c.ListAfter}, {"cas", c.CAS}} {
		if p.ok {
			parts = append(parts, p.name)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}
