package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"agentkit/agent/sessiondb"
	"agentkit/memory"
)

// recordVersion is the format version ("v") of the session records the
// runtime writes to the store. A newer version is refused when read.
const recordVersion = 1

// metaRecord is the stored session metadata: the value of
// sessions/{id}/meta and of the session's index entry.
type metaRecord struct {
	V                 int       `json:"v"`
	ID                string    `json:"id"`
	ChannelID         string    `json:"channelId"`
	Title             string    `json:"title,omitempty"`
	CreatedAt         time.Time `json:"createdAt"`
	UpdatedAt         time.Time `json:"updatedAt"`
	Turns             int64     `json:"turns"`
	LastSeq           int64     `json:"lastSeq"`
	LastStatus        string    `json:"lastStatus,omitempty"`
	Batches           int64     `json:"batches"`
	ContinuationToken string    `json:"continuationToken"`
}

// batchRecord is one stored event batch: sessions/{id}/events/{batch}.
type batchRecord struct {
	V         int               `json:"v"`
	SessionID string            `json:"sessionId"`
	Batch     int64             `json:"batch"`
	Events    []json.RawMessage `json:"events"`
}

// continuationRecord is the value of continuations/{token}.
type continuationRecord struct {
	V         int    `json:"v"`
	SessionID string `json:"sessionId"`
}

// decodeStored checks a stored record's format version and decodes it.
func decodeStored(what string, data []byte, v any) error {
	var head struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return fmt.Errorf("the stored %s is not JSON: %w", what, err)
	}
	if head.V > recordVersion {
		return fmt.Errorf("the stored %s has format version %d, newer than this build's %d; upgrade agentkit", what, head.V, recordVersion)
	}
	if head.V < 1 {
		return fmt.Errorf("the stored %s has no format version; it was not written by agentkit", what)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("the stored %s does not decode: %w", what, err)
	}
	return nil
}

func metaRecordOf(m sessiondb.Meta) metaRecord {
	return metaRecord{
		V: recordVersion, ID: m.ID, ChannelID: m.ChannelID, Title: m.Title,
		CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, Turns: m.Turns,
		LastSeq: m.LastSeq, LastStatus: m.LastStatus, Batches: m.Batches,
		ContinuationToken: m.Token,
	}
}

// mirrorPut writes one mirror key at most once: a failure is logged (the
// key redacted when it holds a token), counted, reported to the Observer
// and dropped.
func (r *Runtime) mirrorPut(ctx context.Context, key string, value []byte) bool {
	err := r.store.Put(ctx, key, value)
	if err == nil {
		return true
	}
	r.mirrorDropped(ctx, key, err)
	return false
}

func (r *Runtime) mirrorDropped(ctx context.Context, key string, err error) {
	n := r.dropped.Add(1)
	shown := r.redactKey(key)
	err = r.redactErr(err)
	r.log.LogAttrs(ctx, slog.LevelWarn, "agent: mirror write dropped",
		slog.String("store", r.binding.Name()), slog.String("key", shown),
		slog.String("error", err.Error()), slog.Int64("dropped_total", n))
	r.obs.MirrorDropped(shown, err)
}

// flushNow flushes a session's mirror and stops its debounce timer. The
// caller holds the session's turn lock.
func (r *Runtime) flushNow(ctx context.Context, st *sessionState, id string) {
	r.mu.Lock()
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
	r.mu.Unlock()
	st.mirror.Lock()
	defer st.mirror.Unlock()
	r.flush(ctx, id)
}

// armDebounce (re)starts a busy session's debounce timer.
func (r *Runtime) armDebounce(st *sessionState, id string) {
	d := r.policy.Debounce
	if d <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.timer != nil {
		st.timer.Reset(d)
		return
	}
	st.timer = time.AfterFunc(d, func() {
		exit, err := r.enter()
		if err != nil {
			return
		}
		defer exit()
		st.mirror.Lock()
		defer st.mirror.Unlock()
		r.flush(r.bg, id)
	})
}

// flush writes what the store lacks of a session: the events after the
// last mirrored one as one batch, then the metadata, the continuation
// token (on the first flush) and the session-index entry, deleting the
// previous index entry. Every write is at most once. The caller holds
// st.mirror.
func (r *Runtime) flush(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, mirrorTimeout)
	defer cancel()
	log := r.logger(id)
	m, err := r.db.Get(ctx, id)
	if err != nil {
		log.Warn("agent: mirror: reading the session failed", "error", err)
		return
	}
	if m.LastSeq <= m.MirroredSeq {
		return
	}
	recs, err := r.db.Range(ctx, id, m.MirroredSeq+1, m.LastSeq)
	if err != nil {
		log.Warn("agent: mirror: reading events failed", "error", err)
		return
	}
	if len(recs) > 0 {
		b := batchRecord{V: recordVersion, SessionID: id, Batch: m.Batches + 1}
		for _, rec := range recs {
			b.Events = append(b.Events, rec.Data)
		}
		if key, err := r.scope.EventBatch(id, uint64(b.Batch)); err == nil {
			data, _ := json.Marshal(b)
			r.mirrorPut(ctx, key, data)
		}
		m.Batches = b.Batch
	}
	m.MirroredSeq = m.LastSeq
	meta, _ := json.Marshal(metaRecordOf(m))
	if key, err := r.scope.SessionMeta(id); err == nil {
		r.mirrorPut(ctx, key, meta)
	}
	if !m.TokenMirrored {
		// Until one write of the token succeeds, every flush tries again:
		// without it, other hosts cannot resolve the token.
		if key, err := r.scope.Continuation(m.Token); err == nil {
			data, _ := json.Marshal(continuationRecord{V: recordVersion, SessionID: id})
			m.TokenMirrored = r.mirrorPut(ctx, key, data)
		}
	}
	// The index entry: written anew for the new update time, the old one
	// deleted once the new one is in. A failed write keeps the old key, to
	// be deleted by a later flush.
	if indexKey, err := r.scope.SessionIndex(m.UpdatedAt, id); err == nil && indexKey != m.IndexKey {
		if r.mirrorPut(ctx, indexKey, meta) {
			if m.IndexKey != "" && r.caps.Delete {
				if err := r.store.Delete(ctx, m.IndexKey); err != nil {
					r.mirrorDropped(ctx, m.IndexKey, err)
				}
			}
			m.IndexKey = indexKey
		}
	}
	if err := r.db.SetMirrored(ctx, m); err != nil {
		log.Warn("agent: mirror: saving the mirror state failed", "error", err)
	}
}

// flushUnmirrored flushes sessions whose last events never reached the
// mirror (the process stopped before a turn's end).
func (r *Runtime) flushUnmirrored(ctx context.Context) error {
	ids, err := r.db.Unmirrored(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		r.flush(ctx, id)
	}
	return nil
}

// memoryTurn converts a finished turn for the memory journal.
func memoryTurn(t TurnInfo) memory.TurnInfo {
	mt := memory.TurnInfo{
		SessionID: t.SessionID, ChannelID: t.ChannelID, Title: t.Title,
		UserMessage: t.UserMessage, Result: t.Result, Usage: t.Usage,
		FinishedAt: t.FinishedAt,
	}
	if t.Status == StatusFailed {
		mt.Err = failure(t.Result)
	}
	return mt
}

// failure is a turn's failure message as an error.
type failure string

func (f failure) Error() string { return string(f) }
