package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"agentkit/agent/sessiondb"
	"agentkit/kv"
	"agentkit/storage"
)

// openStore opens the default store when none is configured and binds the
// store once (storage.Define), with every operation observed once inside
// package kv for the Observer's StoreOp. It builds the record views the
// runtime uses: host KV, the session records (through the mirror) and the
// reminder records; Open builds the commit path on them.
func (r *Runtime) openStore(ctx context.Context) error {
	backend := r.cfg.Store
	name := r.cfg.StoreName
	if backend == nil {
		st, err := r.openDefaultStore(ctx)
		if err != nil {
			return fmt.Errorf("agent: opening the default store: %w", err)
		}
		if backend, err = kv.New("sqlite", st); err != nil {
			return fmt.Errorf("agent: opening the default store: %w", err)
		}
		r.embedded = st
		if name == "" {
			name = "sqlite (default)"
		}
	}
	obs := r.obs
	r.storeObs = func(_ context.Context, o kv.Observation) { obs.StoreOp(string(o.Op), o.Duration, o.Err) }
	var err error
	r.binding, err = storage.Define(storage.Config{
		Backend: backend, Name: name, Policy: r.cfg.Policy, Logger: r.log,
		Evals: r.cfg.Evals, ABs: r.cfg.ABs,
		Observer: r.storeObs,
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
	return nil
}

// logStoreName is the store's name as logs show it.
func (r *Runtime) logStoreName() slog.Attr { return slog.String("store", r.binding.Name()) }

// openDefaultStore returns the default store: the embedded store of the
// session database (sessiondb.Store). A format-1 state root's store file,
// kv/kv.db, is copied into it first (keys, values and versions), then the
// root is marked format 2 and the old file removed: a copy interrupted
// before the mark is made again from the start at the next Open.
func (r *Runtime) openDefaultStore(ctx context.Context) (*sessiondb.Store, error) {
	st, err := r.db.Store(ctx)
	if err != nil {
		return nil, err
	}
	if r.root.Format() >= 2 {
		return st, nil
	}
	old := r.root.FormatOneKVPath()
	if _, err := os.Stat(old); err == nil {
		if err := r.db.ImportStore(ctx, old); err != nil {
			return nil, err
		}
		r.log.Info("agent: moved the default store into the session database (state root format 2)", "from", old, "to", r.root.SessionsPath())
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err := r.root.SetFormat(2); err != nil {
		return nil, err
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(old + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("agent: removing the default store's old file failed; nothing reads it any more", "file", old+suffix, "error", err)
		}
	}
	return st, nil
}

// txStore returns the store as the session database's write tx sees it:
// the bound store itself (observed once), through the embedded default
// store's transaction capability (kv.TxViewer).
func (r *Runtime) txStore(tx *sessiondb.Tx) (*kv.DB, error) {
	return r.binding.DB().InTx(tx)
}
