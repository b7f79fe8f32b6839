package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentkit/keys"
	"agentkit/kv"
)

// ProbeTimeout bounds the store probe of RequireCoordination and
// CheckCoordination (ProbeCoordination), which take no context.
const ProbeTimeout = 10 * time.Second

// RequireCoordination is the start-up check of features that coordinate
// hosts serving one session at the same time through the store: serving
// mode ledger (package ledger; agent.Open runs it for Config.Serving
// "ledger" on the agent's store, and ledger.CheckStore runs the same
// checks on a coordination store of its own). It fails with an error
// matching ErrNoCAS when the backend lacks the CAS group (GetWithVersion,
// PutIfAbsent, PutIfVersion, ListKeys) or the Get and Delete a ledger's
// inbox payloads need, and with an error matching ErrSplitCAS when the CAS
// group and the plain methods are not one durable store: acknowledged
// events would then vanish on restart.
//
// A split is found two ways: by what the backend says (a CAS group kept in
// process memory beside durable plain methods, such as kv.CASFuncsOf on
// a memory store, or the reverse), and, since a backend may not say (the
// methods of another store placed in kv.CASFuncs), by ProbeCoordination,
// which writes through each half and reads through the other, waiting at
// most ProbeTimeout. The memory driver used whole (both halves
// process-local) passes without a probe, for tests.
func (b *Binding) RequireCoordination() error {
	if err := checkCoordination(b.name, b.caps); err != nil {
		return err
	}
	return probeUnlessLocal(b.db, b.caps)
}

// CheckCoordination runs RequireCoordination's checks, the probe included,
// on any backend, such as a separate coordination store beside the agent's
// binding.
func CheckCoordination(backend any) error {
	if backend == nil || isNilPointer(backend) {
		return fmt.Errorf("%w: the coordination store is nil", ErrNoCAS)
	}
	name := "custom"
	if d, ok := backend.(*kv.DB); ok {
		name = d.Name()
	}
	caps := kv.Discover(backend)
	if err := checkCoordination(name, caps); err != nil {
		return err
	}
	db, err := kv.New(name, backend)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoCAS, err)
	}
	return probeUnlessLocal(db, caps)
}

// probeUnlessLocal probes db, except when both of its halves say they keep
// data in process memory: nothing of such a store survives a restart
// anyway, and the ledger refuses it outside tests.
func probeUnlessLocal(db *kv.DB, c kv.Capabilities) error {
	if c.ProcessLocal && c.CASProcessLocal {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	return ProbeCoordination(ctx, db)
}

// The two halves of a store, as the probe's errors name them.
const (
	plainHalf = "the plain methods (Put, Get, Delete, List)"
	casHalf   = "the CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys)"
)

// ProbeCoordination checks that the plain methods and the CAS group of db
// are one store: it writes a random probe key with Put and reads it with
// GetWithVersion, writes another with PutIfAbsent and reads it with Get,
// and deletes both with Delete. Probe keys are under keys.ProbePrefix,
// outside every agent's keys. When either read misses its key (or finds
// other bytes), it fails with an error matching ErrSplitCAS that names both
// halves and what each missed; then the key written with PutIfAbsent may
// stay behind in the store that holds the CAS group, which Delete does not
// reach. A store error is returned as it is, wrapped. db needs the CAS
// group and Get and Delete (RequireCoordination checks them first).
func ProbeCoordination(ctx context.Context, db *kv.DB) error {
	name := db.Name()
	fail := func(step string, err error) error {
		return fmt.Errorf("storage: the start-up probe of store %q failed (%s): %w; check that the store answers", name, step, err)
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	id := hex.EncodeToString(nonce)
	plainKey, err := keys.CoordinationProbe(id + "-put")
	if err != nil {
		return err
	}
	casKey, err := keys.CoordinationProbe(id + "-cas")
	if err != nil {
		return err
	}
	want := []byte(`{"v":1,"probe":"` + id + `"}`)
	var missed []string

	// Written by the plain half, read by the CAS group.
	if err := db.Put(ctx, plainKey, want); err != nil {
		return fail("Put", err)
	}
	got, _, err := db.GetWithVersion(ctx, plainKey)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		missed = append(missed, "a key written with Put was not found by GetWithVersion")
	case err != nil:
		return fail("GetWithVersion", err)
	case !bytes.Equal(got, want):
		missed = append(missed, "a key written with Put read back other bytes through GetWithVersion")
	}

	// Written by the CAS group, read by the plain half.
	if _, err := db.PutIfAbsent(ctx, casKey, want); err != nil {
		return fail("PutIfAbsent", err)
	}
	got, err = db.Get(ctx, casKey)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		missed = append(missed, "a key written with PutIfAbsent was not found by Get")
	case err != nil:
		return fail("Get", err)
	case !bytes.Equal(got, want):
		missed = append(missed, "a key written with PutIfAbsent read back other bytes through Get")
	}

	for _, k := range []string{plainKey, casKey} {
		if err := db.Delete(ctx, k); err != nil && !errors.Is(err, kv.ErrNotFound) {
			return fail("Delete", err)
		}
	}
	if len(missed) > 0 {
		return fmt.Errorf("%w: in store %q, %s and %s are not one store: %s. "+
			"In ledger mode the leases, commit heads and pending indexes (written with compare-and-set) and the inbox payloads (written with Put) would be in different stores, and acknowledged events would be lost. "+
			"Back both halves with the same durable store (for a kv.Funcs, set its CAS fields with kv.CASFuncsOf of the store its plain fields use)",
			ErrSplitCAS, name, plainHalf, casHalf, strings.Join(missed, ", and "))
	}
	return nil
}

func checkCoordination(name string, c kv.Capabilities) error {
	if !c.CAS {
		missing := "has none of them"
		if len(c.MissingCAS) > 0 {
			missing = "lacks " + strings.Join(c.MissingCAS, ", ")
		}
		return fmt.Errorf("%w: ledger mode needs the CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys) and store %q %s; use a store whose driver provides it (every driver kv.Open knows does), or implement all four methods on your backend (for a kv.Funcs, its CAS fields)",
			ErrNoCAS, name, missing)
	}
	var plain []string
	if !c.Get {
		plain = append(plain, "Get")
	}
	if !c.Delete {
		plain = append(plain, "Delete")
	}
	if len(plain) > 0 {
		return fmt.Errorf("%w: ledger mode needs Put, Get and Delete for its inbox payloads, and store %q lacks %s; add it to the backend",
			ErrNoCAS, name, strings.Join(plain, " and "))
	}
	switch {
	case c.CASProcessLocal && !c.ProcessLocal:
		return fmt.Errorf("%w: store %q pairs durable Put/Get/Delete/List with a CAS group that lives in process memory (such as kv.CASFuncsOf on a memory store). "+
			"In ledger mode the inbox payloads would survive a restart but the leases, commit heads and pending indexes would not, so acknowledged events would never be delivered. "+
			"Back the CAS group with the same durable store as the plain methods; the memory CAS group is for tests, together with the memory store",
			ErrSplitCAS, name)
	case c.ProcessLocal && !c.CASProcessLocal:
		return fmt.Errorf("%w: store %q keeps Put/Get/Delete/List in process memory beside a durable CAS group. "+
			"In ledger mode the pending indexes would survive a restart but the inbox payloads they point to would not, so acknowledged events would be lost. "+
			"Back the plain methods with the same durable store as the CAS group",
			ErrSplitCAS, name)
	}
	return nil
}
