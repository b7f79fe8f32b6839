package memkv_test

import (
	"context"
	"errors"
	"testing"

	"agentkit/kv"
	"agentkit/kv/kvtest"
	"agentkit/kv/memkv"
)

// harness gives each test a fresh Store; every Opener call returns a new
// *kv.DB over it, as reopening does for other drivers.
func harness() kvtest.Harness {
	return kvtest.Harness{
		// Handles over one Store are independent clients of it: the
		// cross-client checks race them.
		Shared: true,
		NewNamespace: func(t testing.TB) kvtest.Opener {
			store := memkv.NewStore()
			return func(t testing.TB) *kv.DB {
				db, err := kv.New("mem", store)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, harness())
}

func BenchmarkMem(b *testing.B) {
	kvtest.RunBenchmarks(b, harness())
}

// TestOpenURL checks the mem scheme: "mem://" is a new store each time,
// "mem://NAME" is shared by name.
func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	open := func(u string) *kv.DB {
		t.Helper()
		db, err := kv.Open(ctx, u)
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	a, b := open("mem://"), open("mem://")
	if err := a.Put(ctx, "k", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "k"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("two mem:// stores share data: Get from the second = %v, want ErrNotFound", err)
	}
	if a.Name() != "mem" || !a.ProcessLocal() {
		t.Errorf("mem:// store: Name %q ProcessLocal %v, want \"mem\" and true", a.Name(), a.ProcessLocal())
	}

	n1, n2, other := open("mem://shared-test"), open("mem://shared-test"), open("mem://other-test")
	if err := n1.Put(ctx, "k", []byte("n")); err != nil {
		t.Fatal(err)
	}
	if v, err := n2.Get(ctx, "k"); err != nil || string(v) != "n" {
		t.Errorf("mem://shared-test opened twice: Get = %q, %v; want the value written through the first", v, err)
	}
	if _, err := other.Get(ctx, "k"); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("mem://other-test sees mem://shared-test's data: %v", err)
	}
	// The opaque form names the same store.
	if v, err := open("mem:shared-test").Get(ctx, "k"); err != nil || string(v) != "n" {
		t.Errorf("mem:shared-test: Get = %q, %v; want the shared store's value", v, err)
	}
	// Closing one handle leaves the shared store usable through another.
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Get(ctx, "k"); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
	if _, err := n2.Get(ctx, "k"); err != nil {
		t.Errorf("Get through a second handle after closing the first: %v", err)
	}
	c := memkv.New().Capabilities()
	if !c.Put || !c.Get || !c.Delete || !c.List || !c.CAS || !c.ProcessLocal || !c.CASProcessLocal {
		t.Errorf("memkv capabilities = %+v, want everything and process-local", c)
	}
}
