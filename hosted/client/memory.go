package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"agentkit/internal/atomicfile"
	"agentkit/kv"
	"agentkit/kv/hostedkv"
	"agentkit/memory"
)

// cursorName is the file beside the local journal that remembers the last
// record copied from the service.
const cursorName = ".hosted-cursor"

// Memory is a memory.MemoryBackend that keeps an agent's journal in the
// storage service, so the journal outlives the host: a redeployed host, or
// another host of the same deployment, starts from the same records.
//
// The service's copy is the journal of record. The model still reads the
// default journal under the state root (the workspace's memory/ folder and
// the first prompt's path name it), so Memory keeps that file as a local
// copy: AppendTurn sends the record to the service and then copies every
// record the local journal lacks, in the service's order; PrepareSession
// does the same copy when a session starts. Records written on other hosts
// therefore appear at the next turn or session on this one, which the
// memory contract allows (a record may show up only in a later session). A
// cursor file beside the journal (.hosted-cursor) remembers how far the
// copy got; a host that dies between copying records and saving the cursor
// may copy the last page's records twice, never lose one.
type Memory struct {
	s *hostedkv.Store

	mu       sync.Mutex
	journals map[string]*memory.Journal // by folder
}

var (
	_ memory.MemoryBackend   = (*Memory)(nil)
	_ memory.SessionPreparer = (*Memory)(nil)
)

// NewMemory returns the memory backend of a store opened by the
// agentkit+http(s) driver, and false for a store of another driver. Give
// it as the memory hook's Backend (memory.Options.Backend); close it when
// the runtime is closed.
func NewMemory(db *kv.DB) (*Memory, bool) {
	s, ok := storeOf(db)
	if !ok {
		return nil, false
	}
	return &Memory{s: s, journals: map[string]*memory.Journal{}}, true
}

// AppendTurn stores rec in the service's journal of info.AgentName, then
// brings the local journal up to date. The record is durable once the
// service has it; an error of the local copy is returned (and counted by
// the hook) but the record is not lost: the next copy brings it.
func (m *Memory) AppendTurn(ctx context.Context, rec memory.Record, info memory.Info) error {
	line, err := rec.Line()
	if err != nil {
		return err
	}
	if info.AgentName == "" {
		return errors.New("hosted memory: the agent name is empty")
	}
	if err := m.s.AppendMemory(ctx, info.AgentName, line[:len(line)-1]); err != nil {
		return err
	}
	if err := m.Sync(ctx, info); err != nil {
		return fmt.Errorf("hosted memory: the record is stored in the service, but the local journal is behind: %w", err)
	}
	return nil
}

// PrepareSession brings the local journal up to date.
func (m *Memory) PrepareSession(ctx context.Context, info memory.Info) error {
	return m.Sync(ctx, info)
}

// Sync copies the records of info.AgentName that the local journal under
// info.StateRoot lacks from the service, in order.
func (m *Memory) Sync(ctx context.Context, info memory.Info) error {
	if info.StateRoot == "" || info.AgentName == "" {
		return errors.New("hosted memory: the state root and the agent name must be set")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	dir := memory.Dir(info.StateRoot)
	j := m.journals[dir]
	if j == nil {
		var err error
		if j, err = memory.NewJournal(dir, nil); err != nil {
			return err
		}
		m.journals[dir] = j
	}
	if err := j.PrepareSession(ctx, info); err != nil {
		return err
	}
	cursorFile := filepath.Join(dir, cursorName)
	owner := m.s.Namespace() + " " + info.AgentName
	after := readCursor(cursorFile, owner)
	var last int64 = -1
	save := func() error {
		if last < 0 {
			return nil
		}
		return writeCursor(cursorFile, owner, last)
	}
	n := 0
	for l, err := range m.s.MemoryRecords(ctx, info.AgentName, after) {
		if err != nil {
			return errors.Join(save(), err)
		}
		var rec memory.Record
		if err := json.Unmarshal(l.Record, &rec); err != nil {
			return errors.Join(save(), fmt.Errorf("hosted memory: record %d does not decode: %w", l.Seq, err))
		}
		if err := j.Append(ctx, rec); err != nil {
			return errors.Join(save(), err)
		}
		last = l.Seq
		if n++; n%m.s.PageSize() == 0 {
			if err := save(); err != nil {
				return err
			}
		}
	}
	return save()
}

// Close closes the local journals.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for dir, j := range m.journals {
		errs = append(errs, j.Close())
		delete(m.journals, dir)
	}
	return errors.Join(errs...)
}

// readCursor returns the last sequence number copied for owner, or 0.
func readCursor(path, owner string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	o, n, ok := strings.Cut(strings.TrimSpace(string(b)), "\t")
	if !ok || o != owner {
		return 0
	}
	seq, err := strconv.ParseInt(n, 10, 64)
	if err != nil || seq < 0 {
		return 0
	}
	return seq
}

// writeCursor replaces the cursor file atomically (synced, then renamed),
// so a crash leaves the old or the new cursor, never an empty one.
func writeCursor(path, owner string, seq int64) error {
	err := atomicfile.Write(path, []byte(owner+"\t"+strconv.FormatInt(seq, 10)+"\n"), nil)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hosted memory: the journal folder disappeared: %w", err)
	}
	if err != nil {
		return fmt.Errorf("hosted memory: saving the cursor: %w", err)
	}
	return nil
}
