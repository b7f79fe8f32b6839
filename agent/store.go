package agent

import (
	"context"
	"fmt"
	"log/slog"

	"agentkit/kv"
	"agentkit/storage"
)

// openStore opens the default store when none is configured and binds the
// store once (storage.Define), with every operation observed once inside
// package kv for the Observer's StoreOp. It builds the record views the
// runtime uses: host KV, the session records (through the mirror) and the
// reminder records.
func (r *Runtime) openStore(ctx context.Context) error {
	backend := r.cfg.Store
	name := r.cfg.StoreName
	if backend == nil {
		url, err := r.root.PrepareDefaultStore()
		if err != nil {
			return fmt.Errorf("agent: opening the default store: %w", err)
		}
		db, err := kv.Open(ctx, url)
		if err != nil {
			return fmt.Errorf("agent: opening the default store: %w", err)
		}
		r.ownStore = db
		backend = db
		if name == "" {
			name = "sqlite (default)"
		}
	}
	obs := r.obs
	var err error
	r.binding, err = storage.Define(storage.Config{
		Backend: backend, Name: name, Policy: r.cfg.Policy, Logger: r.log,
		Evals: r.cfg.Evals, ABs: r.cfg.ABs,
		Observer: func(_ context.Context, o kv.Observation) { obs.StoreOp(string(o.Op), o.Duration, o.Err) },
	})
	if err != nil {
		return fmt.Errorf("agent: Config.Store: %w", err)
	}
	r.caps = r.binding.Capabilities()
	r.policy = r.binding.Policy()
	if r.agentStore, err = r.binding.Agent(r.agent.Name); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	r.hostKV = newHostKV(r.agentStore)
	if r.hostID, err = r.root.HostID(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	r.mirror = newStoreMirror(r, r.agentStore.Sessions())
	return nil
}

// logStoreName is the store's name as logs show it.
func (r *Runtime) logStoreName() slog.Attr { return slog.String("store", r.binding.Name()) }
