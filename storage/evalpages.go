package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// The derived eval table keeps a run in one record,
// eval-runs/{runId}, while it fits in evalInlineMax bytes (format 1, as
// every earlier build wrote it). A larger run, on a backend with the CAS
// group, keeps its snapshot without the case results there (format 2),
// with the list of its case pages, each an eval-cases/{runId}/{pageId}
// record of up to evalPageCases cases and about evalPageBytes bytes.
//
// A page is never changed: a write puts the pages whose content differs
// from every page of the record it replaces under fresh ids, then swaps
// the record in with a compare-and-set, then deletes the pages only the
// replaced record named. So a reader that finds a page missing knows the
// record moved on and reads it again, a write that lost the swap deletes
// only the pages it made, and the progress writes of a long run rewrite
// the pages whose cases changed, not every page.
const (
	evalInlineMax    = 256 << 10
	evalPageCases    = 64
	evalPageBytes    = 192 << 10
	evalReadAttempts = 8
)

// evalRecord is the stored record of a run: EvalRun, and in format 2 the
// pages of its case results.
type evalRecord struct {
	Agent    string          `json:"agent"`
	ID       string          `json:"runId"`
	Snapshot json.RawMessage `json:"snapshot"`
	Pages    []evalPageRef   `json:"casePages,omitempty"`
}

// RecordVersion is 2 for a run whose case results are in pages.
func (r evalRecord) RecordVersion() int {
	if len(r.Pages) > 0 {
		return 2
	}
	return 1
}

// evalPageRef names one page of a run's case results, in case order.
type evalPageRef struct {
	ID     string `json:"id"`
	Cases  int    `json:"cases"`
	SHA256 string `json:"sha256"` // of the page's cases as a JSON array
}

// evalPage is the record of one page.
type evalPage struct {
	Agent string            `json:"agent"`
	ID    string            `json:"runId"`
	Cases []json.RawMessage `json:"cases"`
}

var errRunGone = errors.New("storage: the eval run was deleted while it was read")

func (d derivedEvals) PutRun(ctx context.Context, run EvalRun) error {
	if !d.db.Capabilities().CAS {
		// Without compare-and-set a page could be deleted under a newer
		// record: the run is one record, as before.
		key, err := evalKey(run.Agent, run.ID)
		if err != nil {
			return err
		}
		data, err := record.Marshal(KindEvalRun, evalRecord{Agent: run.Agent, ID: run.ID, Snapshot: run.Snapshot})
		if err != nil {
			return err
		}
		return d.db.Put(ctx, key, data)
	}
	return d.update(ctx, run.Agent, run.ID, false, func(json.RawMessage) (json.RawMessage, error) { return run.Snapshot, nil })
}

// update replaces run runID's snapshot with what fn returns given the
// stored one (with its case results put back when needOld; nil when
// there is none), in a compare-and-set loop.
func (d derivedEvals) update(ctx context.Context, agent, runID string, needOld bool, fn func(json.RawMessage) (json.RawMessage, error)) error {
	key, err := evalKey(agent, runID)
	if err != nil {
		return err
	}
	var cur evalRecord            // the record the attempt replaces
	var fresh, next []evalPageRef // the pages it wrote, and the ones its record names
	decode := func(data []byte) (json.RawMessage, error) {
		cur = evalRecord{}
		if data == nil {
			return nil, nil
		}
		if _, err := record.Unmarshal(KindEvalRun, key, data, &cur); err != nil {
			return nil, err
		}
		if !needOld {
			return nil, nil
		}
		snap, err := d.assemble(ctx, agent, cur)
		if errors.Is(err, errRunGone) {
			err = errStale
		}
		return snap, err
	}
	encode := func(doc json.RawMessage) ([]byte, error) {
		if err := checkJSON("eval run snapshot", doc); err != nil {
			return nil, err
		}
		rec, written, err := d.paginate(ctx, agent, runID, doc, cur.Pages)
		fresh, next = written, rec.Pages
		if err != nil {
			d.deletePages(ctx, agent, runID, fresh)
			return nil, err
		}
		return record.Marshal(KindEvalRun, rec)
	}
	settled := func(err error) {
		switch {
		case err == nil:
			d.deletePages(ctx, agent, runID, unusedPages(cur.Pages, next))
		case errors.Is(err, kv.ErrConflict):
			d.deletePages(ctx, agent, runID, fresh) // no record names them
		}
		// An unknown outcome keeps both sets: either record may be the
		// stored one. What is left over goes with the run.
		fresh = nil
	}
	return casUpdateHooked(ctx, d.db, key, decode, encode, fn, settled)
}

// paginate returns the record of doc, writing the pages that old lacks.
// A snapshot that fits in evalInlineMax, or has no cases array, is one
// record.
func (d derivedEvals) paginate(ctx context.Context, agent, runID string, doc json.RawMessage, old []evalPageRef) (evalRecord, []evalPageRef, error) {
	rec := evalRecord{Agent: agent, ID: runID, Snapshot: doc}
	if len(doc) <= evalInlineMax {
		return rec, nil, nil
	}
	head, cases, ok := splitCases(doc)
	if !ok {
		return rec, nil, nil
	}
	k, err := keys.Agent(agent)
	if err != nil {
		return rec, nil, fmt.Errorf("storage: %w", err)
	}
	have := map[string]evalPageRef{}
	for _, p := range old {
		have[p.SHA256] = p
	}
	var pages, fresh []evalPageRef
	for _, group := range pageGroups(cases) {
		body, err := json.Marshal(group)
		if err != nil {
			return rec, fresh, err
		}
		sum := sha256.Sum256(body)
		digest := hex.EncodeToString(sum[:])
		if p, ok := have[digest]; ok && p.Cases == len(group) {
			pages = append(pages, p)
			continue
		}
		p := evalPageRef{ID: pageID(), Cases: len(group), SHA256: digest}
		pk, err := k.EvalCasePage(runID, p.ID)
		if err != nil {
			return rec, fresh, fmt.Errorf("storage: %w", err)
		}
		data, err := record.Marshal(KindEvalCasePage, evalPage{Agent: agent, ID: runID, Cases: group})
		if err != nil {
			return rec, fresh, err
		}
		if err := d.db.Put(ctx, pk, data); err != nil {
			return rec, fresh, err
		}
		fresh = append(fresh, p)
		pages = append(pages, p)
	}
	rec.Snapshot, rec.Pages = head, pages
	return rec, fresh, nil
}

// splitCases takes the "cases" array out of a run snapshot.
func splitCases(doc json.RawMessage) (head json.RawMessage, cases []json.RawMessage, ok bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(doc, &fields) != nil {
		return nil, nil, false
	}
	raw, found := fields["cases"]
	if !found || json.Unmarshal(raw, &cases) != nil || len(cases) == 0 {
		return nil, nil, false
	}
	delete(fields, "cases")
	head, err := json.Marshal(fields)
	if err != nil {
		return nil, nil, false
	}
	return head, cases, true
}

// pageGroups cuts cases into pages: evalPageCases at a time, so that a
// case's page stays where it is while later cases change, and each cut
// again where its cases pass evalPageBytes.
func pageGroups(cases []json.RawMessage) [][]json.RawMessage {
	var out [][]json.RawMessage
	for start := 0; start < len(cases); start += evalPageCases {
		group := cases[start:min(start+evalPageCases, len(cases))]
		from, size := 0, 0
		for i, c := range group {
			if i > from && size+len(c) > evalPageBytes {
				out = append(out, group[from:i])
				from, size = i, 0
			}
			size += len(c) + 1
		}
		out = append(out, group[from:])
	}
	return out
}

// assemble returns the snapshot of a run record with its case results put
// back. A page that is gone means the record was replaced since it was
// read (errRunGone wraps that case).
func (d derivedEvals) assemble(ctx context.Context, agent string, rec evalRecord) (json.RawMessage, error) {
	if len(rec.Pages) == 0 {
		return rec.Snapshot, nil
	}
	k, err := keys.Agent(agent)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(rec.Snapshot, &fields); err != nil {
		return nil, fmt.Errorf("storage: the paged eval run %q has a snapshot that is not a JSON object: %w", rec.ID, err)
	}
	var cases []json.RawMessage
	for _, ref := range rec.Pages {
		pk, err := k.EvalCasePage(rec.ID, ref.ID)
		if err != nil {
			return nil, fmt.Errorf("storage: %w", err)
		}
		data, err := d.get(ctx, pk)
		if errors.Is(err, kv.ErrNotFound) {
			return nil, fmt.Errorf("%w (its case page %s is gone)", errRunGone, pk)
		}
		if err != nil {
			return nil, err
		}
		var page evalPage
		if _, err := record.Unmarshal(KindEvalCasePage, pk, data, &page); err != nil {
			return nil, err
		}
		body, err := json.Marshal(page.Cases)
		if err != nil {
			return nil, err
		}
		if sum := sha256.Sum256(body); len(page.Cases) != ref.Cases || hex.EncodeToString(sum[:]) != ref.SHA256 {
			return nil, fmt.Errorf("storage: the eval case page %s holds %d cases that do not match its run's record (%d cases, sha256 %s); the store was changed by something other than agentkit", pk, len(page.Cases), ref.Cases, ref.SHA256)
		}
		cases = append(cases, page.Cases...)
	}
	raw, err := json.Marshal(cases)
	if err != nil {
		return nil, err
	}
	fields["cases"] = raw
	return json.Marshal(fields)
}

// get reads a key with Get, or GetWithVersion when the backend has only
// the CAS group.
func (d derivedEvals) get(ctx context.Context, key string) ([]byte, error) {
	if d.db.Capabilities().Get {
		return d.db.Get(ctx, key)
	}
	v, _, err := d.db.GetWithVersion(ctx, key)
	return v, err
}

// deletePages deletes pages no record names any more. A failure leaves
// them to DeleteRun, which removes every page of the run.
func (d derivedEvals) deletePages(ctx context.Context, agent, runID string, pages []evalPageRef) {
	k, err := keys.Agent(agent)
	if err != nil {
		return
	}
	for _, p := range pages {
		if pk, err := k.EvalCasePage(runID, p.ID); err == nil {
			_ = d.db.Delete(ctx, pk)
		}
	}
}

// unusedPages returns the pages of old that next does not name.
func unusedPages(old, next []evalPageRef) []evalPageRef {
	kept := map[string]bool{}
	for _, p := range next {
		kept[p.ID] = true
	}
	var out []evalPageRef
	for _, p := range old {
		if !kept[p.ID] {
			out = append(out, p)
			kept[p.ID] = true // named twice, deleted once
		}
	}
	return out
}

// pageID is a fresh page id: 16 random bytes in hex.
func pageID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (d derivedEvals) DeleteRun(ctx context.Context, agent, runID string) error {
	key, err := evalKey(agent, runID)
	if err != nil {
		return err
	}
	if !d.db.Capabilities().CAS {
		return d.db.Delete(ctx, key) // no run of this store has pages
	}
	// Only the pages the deleted record named go: a write racing the
	// deletion may already have put the pages of a new record of the run,
	// which stays whole. Pages no record names (a write whose outcome was
	// unknown) stay behind.
	var named []evalPageRef
	data, _, err := d.db.GetWithVersion(ctx, key)
	switch {
	case errors.Is(err, kv.ErrNotFound):
	case err != nil:
		return err
	default:
		var rec evalRecord
		if _, err := record.Unmarshal(KindEvalRun, key, data, &rec); err == nil {
			named = rec.Pages
		}
	}
	if err := d.db.Delete(ctx, key); err != nil {
		return err
	}
	k, _ := keys.Agent(agent)
	for _, p := range unusedPages(named, nil) {
		pk, err := k.EvalCasePage(runID, p.ID)
		if err != nil {
			return fmt.Errorf("storage: %w", err)
		}
		if err := d.db.Delete(ctx, pk); err != nil {
			return fmt.Errorf("storage: the eval run %q is deleted, but deleting its case pages failed: %w", runID, err)
		}
	}
	return nil
}

func (d derivedEvals) ListRuns(ctx context.Context, agent string) iter.Seq2[EvalRun, error] {
	return func(yield func(EvalRun, error) bool) {
		k, err := keys.Agent(agent)
		if err != nil {
			yield(EvalRun{}, fmt.Errorf("storage: %w", err))
			return
		}
		for e, err := range d.db.List(ctx, k.EvalRunsPrefix()) {
			if err != nil {
				yield(EvalRun{}, err)
				return
			}
			run, err := d.readRun(ctx, agent, e.Key, e.Value)
			if errors.Is(err, errRunGone) {
				continue // deleted while listed
			}
			if err != nil {
				yield(EvalRun{}, err)
				return
			}
			if !yield(run, nil) {
				return
			}
		}
	}
}

// readRun decodes a run record with its case pages, reading the record
// again when it moved on while its pages were read.
func (d derivedEvals) readRun(ctx context.Context, agent, key string, data []byte) (EvalRun, error) {
	for attempt := 1; ; attempt++ {
		var rec evalRecord
		if _, err := record.Unmarshal(KindEvalRun, key, data, &rec); err != nil {
			return EvalRun{}, err
		}
		snap, err := d.assemble(ctx, agent, rec)
		if err == nil {
			return EvalRun{Agent: rec.Agent, ID: rec.ID, Snapshot: snap}, nil
		}
		if !errors.Is(err, errRunGone) {
			return EvalRun{}, err
		}
		missing := err
		if attempt == evalReadAttempts {
			return EvalRun{}, fmt.Errorf("storage: the eval run at %s changed %d times while its case pages were read: %w", key, evalReadAttempts, kv.ErrConflict)
		}
		prev := data
		if data, err = d.get(ctx, key); err != nil {
			if errors.Is(err, kv.ErrNotFound) {
				return EvalRun{}, errRunGone
			}
			return EvalRun{}, err
		}
		if bytes.Equal(prev, data) {
			// No write deletes a page its record still names: this one was
			// lost, or deleted by something other than agentkit.
			return EvalRun{}, fmt.Errorf("storage: the eval run at %s names a case page that is missing%s; restore the page from a backup or delete the run", key, strings.TrimPrefix(missing.Error(), errRunGone.Error()))
		}
	}
}
