package storage

import (
	"fmt"
	"strings"

	"agentkit/kv"
)

// RequireCoordination is the start-up check of features that coordinate
// hosts serving one session at the same time through the store (ledger
// mode of the design, 05-ledger.md; agent.Open runs it for
// Config.Serving "ledger", which this build then refuses). It fails with an
// error matching ErrNoCAS when the backend lacks the CAS group
// (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys) or the Get and
// Delete a ledger's inbox payloads need, and with an error matching
// ErrSplitCAS when the CAS group and the plain methods are not on the same
// durable store, such as a durable Put/Get beside the memory driver's CAS
// group: acknowledged events would then vanish on restart. The memory
// driver used whole (both halves process-local) passes, for tests.
func (b *Binding) RequireCoordination() error {
	return checkCoordination(b.name, b.caps)
}

// CheckCoordination runs RequireCoordination's checks on any backend, such
// as a separate coordination store beside the agent's binding.
func CheckCoordination(backend any) error {
	if backend == nil || isNilPointer(backend) {
		return fmt.Errorf("%w: the coordination store is nil", ErrNoCAS)
	}
	name := "custom"
	if d, ok := backend.(*kv.DB); ok {
		name = d.Name()
	}
	return checkCoordination(name, kv.Discover(backend))
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
