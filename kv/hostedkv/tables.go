package hostedkv

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"agentkit/kv/hostedkv/wire"
)

// The service keeps three native resources beside each namespace's keys:
// an eval-run table, an A/B table (samples and a snapshot) and a memory
// journal for each agent (docs/hosted-protocol.md). The methods below
// speak to them in the protocol's terms; package hosted/client binds them
// to the runtime (storage's EvalTable and ABTable, memory's
// MemoryBackend), so the driver imports nothing of the runtime.

var jsonType = map[string]string{"Content-Type": wire.ContentJSON}

// PutEvalRun stores the snapshot of eval run runID of agent, a JSON
// document, replacing a run of the same id.
func (s *Store) PutEvalRun(ctx context.Context, agent, runID string, snapshot json.RawMessage) error {
	if !json.Valid(snapshot) {
		return fmt.Errorf("hostedkv: eval run %q: the snapshot is not a JSON document", runID)
	}
	return s.expect(ctx, call{method: http.MethodPut, resource: "evals", write: true,
		query: url.Values{"agent": {agent}, "run": {runID}}, body: snapshot, headers: jsonType},
		http.StatusNoContent, "put eval run "+runID)
}

// DeleteEvalRun removes eval run runID of agent; a missing run is not an
// error.
func (s *Store) DeleteEvalRun(ctx context.Context, agent, runID string) error {
	return s.expect(ctx, call{method: http.MethodDelete, resource: "evals", write: true,
		query: url.Values{"agent": {agent}, "run": {runID}}}, http.StatusNoContent, "delete eval run "+runID)
}

// EvalRuns yields the eval runs of agent in ascending run id order, page
// by page.
func (s *Store) EvalRuns(ctx context.Context, agent string) iter.Seq2[wire.EvalRun, error] {
	return func(yield func(wire.EvalRun, error) bool) {
		q := url.Values{"agent": {agent}}
		for l, err := range s.pages(ctx, "evals", q, "", func(l *line) string { return *l.RunID }) {
			if err != nil {
				yield(wire.EvalRun{}, fmt.Errorf("hostedkv: list eval runs: %w", err))
				return
			}
			if !yield(wire.EvalRun{RunID: *l.RunID, Snapshot: l.Snapshot}, nil) {
				return
			}
		}
	}
}

// PutABSample appends one A/B sample. The table is keyed by agent,
// experiment, session and time, so a resent sample is stored once.
func (s *Store) PutABSample(ctx context.Context, x wire.ABSample) error {
	body, err := json.Marshal(x)
	if err != nil {
		return fmt.Errorf("hostedkv: encode the A/B sample: %w", err)
	}
	return s.expect(ctx, call{method: http.MethodPost, resource: "ab-samples", write: true, body: body, headers: jsonType},
		http.StatusNoContent, "put A/B sample")
}

// PutABSnapshot replaces the A/B snapshot of agent, a JSON document.
func (s *Store) PutABSnapshot(ctx context.Context, agent string, snapshot json.RawMessage) error {
	return s.expect(ctx, call{method: http.MethodPut, resource: "ab-snapshot", write: true,
		query: url.Values{"agent": {agent}}, body: snapshot, headers: jsonType}, http.StatusNoContent, "put A/B snapshot")
}

// ABSnapshot returns the A/B snapshot of agent, or an error matching
// kv.ErrNotFound when there is none.
func (s *Store) ABSnapshot(ctx context.Context, agent string) (json.RawMessage, error) {
	resp, err := s.do(ctx, call{method: http.MethodGet, resource: "ab-snapshot", query: url.Values{"agent": {agent}}})
	if err != nil {
		return nil, fmt.Errorf("hostedkv: get A/B snapshot: %w", err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("hostedkv: get A/B snapshot: %w", s.errorFrom(resp))
	}
	b, err := readBody(resp)
	if err != nil {
		return nil, fmt.Errorf("hostedkv: get A/B snapshot: %w", err)
	}
	return b, nil
}

// AppendMemory appends record, one JSON object, to the memory journal of
// agent. The write carries a request id, so a resent append is stored
// once.
func (s *Store) AppendMemory(ctx context.Context, agent string, record json.RawMessage) error {
	return s.expect(ctx, call{method: http.MethodPost, resource: "memory", write: true,
		query: url.Values{"agent": {agent}}, body: record, headers: jsonType}, http.StatusOK, "memory: append")
}

// MemoryRecords yields the records of agent's memory journal whose
// sequence number is past after (0: from the first), in order, page by
// page (PageSize lines a page).
func (s *Store) MemoryRecords(ctx context.Context, agent string, after int64) iter.Seq2[wire.MemoryLine, error] {
	return func(yield func(wire.MemoryLine, error) bool) {
		q := url.Values{"agent": {agent}}
		for l, err := range s.pages(ctx, "memory", q, strconv.FormatInt(after, 10), func(l *line) string { return strconv.FormatInt(*l.Seq, 10) }) {
			if err != nil {
				yield(wire.MemoryLine{}, err)
				return
			}
			if !yield(wire.MemoryLine{Seq: *l.Seq, Record: l.Record}, nil) {
				return
			}
		}
	}
}

// PageSize is how many lines one listing page holds: Options.PageSize,
// capped at the service's page limit.
func (s *Store) PageSize() int { return s.page }

// expect sends c and checks the answer's status.
func (s *Store) expect(ctx context.Context, c call, want int, what string) error {
	resp, err := s.do(ctx, c)
	if err != nil {
		return fmt.Errorf("hostedkv: %s: %w", what, err)
	}
	defer drain(resp)
	if resp.StatusCode != want {
		return fmt.Errorf("hostedkv: %s: %w", what, s.errorFrom(resp))
	}
	return nil
}
