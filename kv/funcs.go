package kv

import (
	"context"
	"errors"
	"iter"
)

// Funcs adapts an existing client to the contract with function fields. A nil
// field means the capability is not provided: the method then returns an
// error matching errors.ErrUnsupported, and Capabilities reports it absent.
//
//	backend := kv.Funcs{
//		Put: func(ctx context.Context, key string, value []byte) error {
//			return client.Upsert(ctx, key, value)
//		},
//		Get: client.Get,
//	}
//	db, err := kv.New("mydb", backend)
type Funcs struct {
	Put    func(ctx context.Context, key string, value []byte) error
	Get    func(ctx context.Context, key string) ([]byte, error)
	Delete func(ctx context.Context, key string) error
	List   func(ctx context.Context, prefix string) iter.Seq2[Entry, error]
	// ListAfter and ListKeysAfter are the start-after capability
	// (AfterLister): both or neither, and only with List. Left nil, DB's
	// ListAfter and ListKeysAfter fall back to List and drop the keys up to
	// the point.
	ListAfter     func(ctx context.Context, prefix, after string) iter.Seq2[Entry, error]
	ListKeysAfter func(ctx context.Context, prefix, after string) iter.Seq2[string, error]
	// CAS is the compare-and-set group: all four fields or none. A partial
	// group is rejected by New and by storage.Define, naming the missing
	// fields.
	CAS CASFuncs
	// ProcessLocal says the plain fields keep data in process memory only.
	ProcessLocal bool
}

// CASFuncs is the compare-and-set group of Funcs.
type CASFuncs struct {
	GetWithVersion func(ctx context.Context, key string) ([]byte, Version, error)
	PutIfAbsent    func(ctx context.Context, key string, value []byte) (Version, error)
	PutIfVersion   func(ctx context.Context, key string, value []byte, expected Version) (Version, error)
	ListKeys       func(ctx context.Context, prefix string) iter.Seq2[string, error]
	// ProcessLocal says the group keeps data in process memory only, as the
	// memory driver's does.
	ProcessLocal bool
}

// CASFuncsOf returns the CAS group of c as function fields, marking it
// process-local when c says so (see ProcessLocaler).
func CASFuncsOf(c CAS) CASFuncs {
	f := CASFuncs{
		GetWithVersion: c.GetWithVersion,
		PutIfAbsent:    c.PutIfAbsent,
		PutIfVersion:   c.PutIfVersion,
		ListKeys:       c.ListKeys,
	}
	if p, ok := c.(ProcessLocaler); ok {
		f.ProcessLocal = p.ProcessLocal()
	}
	return f
}

// funcsBackend gives Funcs its methods (a struct cannot have a field and a
// method of the same name).
type funcsBackend struct{ f Funcs }

var _ interface {
	Store
	CAS
	AfterLister
	CapabilityReporter
} = funcsBackend{}

func unsupported(method string) error {
	return errors.Join(errors.ErrUnsupported, errors.New("kv: the backend does not provide "+method))
}

// Capabilities reports which fields are set.
func (f Funcs) Capabilities() Capabilities {
	return funcsBackend{f}.Capabilities()
}

// Capabilities reports which fields are set.
func (b funcsBackend) Capabilities() Capabilities {
	f := b.f
	c := Capabilities{
		Put:          f.Put != nil,
		Get:          f.Get != nil,
		Delete:       f.Delete != nil,
		List:         f.List != nil,
		ListAfter:    f.List != nil && f.ListAfter != nil && f.ListKeysAfter != nil,
		ProcessLocal: f.ProcessLocal,
	}
	c.CAS, c.MissingCAS = casGroup([]bool{
		f.CAS.GetWithVersion != nil, f.CAS.PutIfAbsent != nil,
		f.CAS.PutIfVersion != nil, f.CAS.ListKeys != nil,
	})
	c.CASProcessLocal = c.CAS && f.CAS.ProcessLocal
	return c
}

// Put calls the Put field.
func (b funcsBackend) Put(ctx context.Context, key string, value []byte) error {
	if b.f.Put == nil {
		return unsupported("Put")
	}
	return b.f.Put(ctx, key, value)
}

// Get calls the Get field.
func (b funcsBackend) Get(ctx context.Context, key string) ([]byte, error) {
	if b.f.Get == nil {
		return nil, unsupported("Get")
	}
	return b.f.Get(ctx, key)
}

// Delete calls the Delete field.
func (b funcsBackend) Delete(ctx context.Context, key string) error {
	if b.f.Delete == nil {
		return unsupported("Delete")
	}
	return b.f.Delete(ctx, key)
}

// List calls the List field.
func (b funcsBackend) List(ctx context.Context, prefix string) iter.Seq2[Entry, error] {
	if b.f.List == nil {
		return errSeq[Entry](unsupported("List"))
	}
	return b.f.List(ctx, prefix)
}

// ListAfter calls the ListAfter field.
func (b funcsBackend) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[Entry, error] {
	if b.f.ListAfter == nil {
		return errSeq[Entry](unsupported("ListAfter"))
	}
	return b.f.ListAfter(ctx, prefix, after)
}

// ListKeysAfter calls the ListKeysAfter field.
func (b funcsBackend) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	if b.f.ListKeysAfter == nil {
		return errSeq[string](unsupported("ListKeysAfter"))
	}
	return b.f.ListKeysAfter(ctx, prefix, after)
}

// GetWithVersion calls the CAS.GetWithVersion field.
func (b funcsBackend) GetWithVersion(ctx context.Context, key string) ([]byte, Version, error) {
	if b.f.CAS.GetWithVersion == nil {
		return nil, "", unsupported("GetWithVersion")
	}
	return b.f.CAS.GetWithVersion(ctx, key)
}

// PutIfAbsent calls the CAS.PutIfAbsent field.
func (b funcsBackend) PutIfAbsent(ctx context.Context, key string, value []byte) (Version, error) {
	if b.f.CAS.PutIfAbsent == nil {
		return "", unsupported("PutIfAbsent")
	}
	return b.f.CAS.PutIfAbsent(ctx, key, value)
}

// PutIfVersion calls the CAS.PutIfVersion field.
func (b funcsBackend) PutIfVersion(ctx context.Context, key string, value []byte, expected Version) (Version, error) {
	if b.f.CAS.PutIfVersion == nil {
		return "", unsupported("PutIfVersion")
	}
	return b.f.CAS.PutIfVersion(ctx, key, value, expected)
}

// ListKeys calls the CAS.ListKeys field.
func (b funcsBackend) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	if b.f.CAS.ListKeys == nil {
		return errSeq[string](unsupported("ListKeys"))
	}
	return b.f.CAS.ListKeys(ctx, prefix)
}

// errSeq yields one error.
func errSeq[T any](err error) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		yield(zero, err)
	}
}
