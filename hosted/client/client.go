// Package client gives the agent runtime what the hosted storage service
// (`agentkit storaged`, package hosted) offers beyond the kv contract: its
// native eval-run and A/B tables, for storage.Config's Evals and ABs, and a
// memory backend that keeps each agent's memory journal in the service, so
// the journal outlives the host. Both work on a store opened by the
// agentkit+http(s) driver (package kv/hostedkv):
//
//	db, err := kv.Open(ctx, "agentkit+https://TOKEN@storage.internal:8443/acme-prod")
//	…
//	cfg := storage.Config{Backend: db}
//	if evals, abs, ok := client.Tables(db); ok {
//		cfg.Evals, cfg.ABs = evals, abs
//	}
//	if mem, ok := client.NewMemory(db); ok {
//		rc.Memory.Backend = mem // agent.Config; close mem after the runtime
//	}
//
// The driver speaks the protocol, in its own terms (hostedkv.Store's
// PutEvalRun, AppendMemory, …); this package binds it to packages storage
// and memory, which sit above the driver, so no package under kv/ imports
// the runtime. `agentkit serve --storage agentkit+http(s)://…` does both
// by itself.
package client

import (
	"agentkit/kv"
	"agentkit/kv/hostedkv"
)

// storeOf returns the driver's store behind db, if db was opened by the
// agentkit+http(s) driver.
func storeOf(db *kv.DB) (*hostedkv.Store, bool) {
	if db == nil {
		return nil, false
	}
	s, ok := db.Backend().(*hostedkv.Store)
	return s, ok
}
