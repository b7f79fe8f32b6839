package kv_test

import (
	"context"
	"iter"
	"slices"
	"strings"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// Backends with exactly some methods, for Discover.
type (
	putOnly struct{}
	getOnly struct{}
	putGet  struct{ putOnly }
	// partialCAS has the core and two of the four CAS methods.
	partialCAS   struct{ putGet }
	processLocal struct {
		putOnly
		local bool
	}
)

func (putOnly) Put(context.Context, string, []byte) error   { return nil }
func (getOnly) Get(context.Context, string) ([]byte, error) { return nil, kv.ErrNotFound }
func (putGet) Get(context.Context, string) ([]byte, error)  { return nil, kv.ErrNotFound }
func (partialCAS) GetWithVersion(context.Context, string) ([]byte, kv.Version, error) {
	return nil, "", kv.ErrNotFound
}
func (partialCAS) ListKeys(context.Context, string) iter.Seq2[string, error] {
	return func(func(string, error) bool) {}
}
func (p processLocal) ProcessLocal() bool { return p.local }

func TestDiscover(t *testing.T) {
	cases := []struct {
		name    string
		backend any
		want    kv.Capabilities
	}{
		{"nil", nil, kv.Capabilities{}},
		{"put only", putOnly{}, kv.Capabilities{Put: true}},
		{"get only", getOnly{}, kv.Capabilities{Get: true}},
		{"put and get", putGet{}, kv.Capabilities{Put: true, Get: true}},
		{"partial CAS", partialCAS{}, kv.Capabilities{Put: true, Get: true, MissingCAS: []string{"PutIfAbsent", "PutIfVersion"}}},
		{"memkv", memkv.NewStore(), kv.Capabilities{Put: true, Get: true, Delete: true, List: true, CAS: true, ProcessLocal: true, CASProcessLocal: true}},
		{"process-local false", processLocal{local: false}, kv.Capabilities{Put: true}},
		{"process-local true", processLocal{local: true}, kv.Capabilities{Put: true, ProcessLocal: true}},
		{"memkv behind *DB", memkv.New(), kv.Capabilities{Put: true, Get: true, Delete: true, List: true, CAS: true, ProcessLocal: true, CASProcessLocal: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := kv.Discover(c.backend)
			if !equalCaps(got, c.want) {
				t.Errorf("Discover = %+v, want %+v", got, c.want)
			}
		})
	}
}

func equalCaps(a, b kv.Capabilities) bool {
	return a.Put == b.Put && a.Get == b.Get && a.Delete == b.Delete && a.List == b.List && a.CAS == b.CAS &&
		a.ProcessLocal == b.ProcessLocal && a.CASProcessLocal == b.CASProcessLocal && slices.Equal(a.MissingCAS, b.MissingCAS)
}

func TestValidate(t *testing.T) {
	if err := kv.Discover(putOnly{}).Validate(); err != nil {
		t.Errorf("Validate of a Put-only backend: %v", err)
	}
	if err := kv.Discover(memkv.NewStore()).Validate(); err != nil {
		t.Errorf("Validate of memkv: %v", err)
	}
	err := kv.Discover(getOnly{}).Validate()
	if err == nil || !strings.Contains(err.Error(), "no Put method") {
		t.Errorf("Validate of a backend without Put = %v, want an error saying Put is required", err)
	}
	err = kv.Discover(partialCAS{}).Validate()
	if err == nil {
		t.Fatal("Validate of a partial CAS group succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "missing PutIfAbsent, PutIfVersion") {
		t.Errorf("Validate of a partial CAS group = %q, want it to name the missing methods", msg)
	}
	// Both problems at once are both reported.
	err = kv.Capabilities{MissingCAS: []string{"ListKeys"}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Put") || !strings.Contains(err.Error(), "missing ListKeys") {
		t.Errorf("Validate with no Put and a partial group = %v, want both named", err)
	}
	if _, err := kv.New("partial", partialCAS{}); err == nil || !strings.Contains(err.Error(), "partial: ") {
		t.Errorf("New with a partial CAS group = %v, want an error labelled with the name", err)
	}
	if _, err := kv.New("x", getOnly{}); err == nil {
		t.Error("New with a backend without Put succeeded")
	}
}

func TestCapabilitiesString(t *testing.T) {
	for _, c := range []struct {
		caps kv.Capabilities
		want string
	}{
		{kv.Capabilities{}, "none"},
		{kv.Capabilities{Put: true}, "put"},
		{kv.Capabilities{Put: true, Get: true, Delete: true, List: true, CAS: true}, "put,get,delete,list,cas"},
		{kv.Capabilities{Put: true, List: true}, "put,list"},
	} {
		if got := c.caps.String(); got != c.want {
			t.Errorf("%+v.String() = %q, want %q", c.caps, got, c.want)
		}
	}
}

func TestFuncsCapabilities(t *testing.T) {
	store := memkv.NewStore()
	full := kv.Funcs{Put: store.Put, Get: store.Get, Delete: store.Delete, List: store.List, CAS: kv.CASFuncsOf(store)}
	c := full.Capabilities()
	if !c.Put || !c.Get || !c.Delete || !c.List || !c.CAS || c.ProcessLocal || !c.CASProcessLocal {
		t.Errorf("full Funcs over memkv: %+v, want everything, CAS process-local (from memkv), plain fields not", c)
	}
	if d := kv.Discover(full); !equalCaps(d, c) {
		t.Errorf("Discover(Funcs) = %+v, want Funcs.Capabilities() %+v", d, c)
	}
	if d := kv.Discover(&full); !equalCaps(d, c) {
		t.Errorf("Discover(*Funcs) = %+v, want %+v", d, c)
	}

	putOnly := kv.Funcs{Put: store.Put}
	if c := putOnly.Capabilities(); !c.Put || c.Get || c.Delete || c.List || c.CAS || len(c.MissingCAS) != 0 {
		t.Errorf("Funcs with only Put: %+v", c)
	}

	partial := kv.Funcs{Put: store.Put, CAS: kv.CASFuncs{GetWithVersion: store.GetWithVersion, PutIfVersion: store.PutIfVersion}}
	c = partial.Capabilities()
	if c.CAS || !slices.Equal(c.MissingCAS, []string{"PutIfAbsent", "ListKeys"}) {
		t.Errorf("Funcs with half a CAS group: CAS %v, MissingCAS %q; want false and [PutIfAbsent ListKeys]", c.CAS, c.MissingCAS)
	}
	if _, err := kv.New("half", partial); err == nil || !strings.Contains(err.Error(), "PutIfAbsent, ListKeys") {
		t.Errorf("New with half a CAS group = %v, want an error naming PutIfAbsent and ListKeys", err)
	}

	local := kv.Funcs{Put: store.Put, ProcessLocal: true}
	if c := local.Capabilities(); !c.ProcessLocal || c.CASProcessLocal {
		t.Errorf("Funcs{ProcessLocal: true} without CAS: %+v", c)
	}
	casLocal := kv.Funcs{Put: store.Put, CAS: kv.CASFuncs{
		GetWithVersion: store.GetWithVersion, PutIfAbsent: store.PutIfAbsent,
		PutIfVersion: store.PutIfVersion, ListKeys: store.ListKeys, ProcessLocal: false,
	}}
	if c := casLocal.Capabilities(); !c.CAS || c.CASProcessLocal {
		t.Errorf("CAS group not marked process-local: %+v", c)
	}
}
