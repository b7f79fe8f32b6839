package storage

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// ErrSessionDeleted means the session's head is a tombstone: the session
// was deleted (on this host or another), and nothing may bring it back.
var ErrSessionDeleted = errors.New("storage: the session was deleted")

// ErrSessionMoved means the session's head is marked moved to the session
// ledger (Head.Moved): a host of serving mode ledger adopted it, and it is
// served there now. A host of serving mode local neither runs nor commits
// a turn of it.
var ErrSessionMoved = errors.New("storage: the session moved to serving mode ledger")

// MovedMark is the mark a head carries once the session moved to the
// session ledger: where, when and by which host.
type MovedMark struct {
	To   string    `json:"to"`
	At   time.Time `json:"at"`
	Host string    `json:"host"`
}

// SessionMeta is a session's metadata as the store keeps it: the value of
// sessions/{id}/meta and of the session's index entry, and the body of its
// head.
type SessionMeta struct {
	// ID is the session id.
	ID string `json:"id"`
	// ChannelID is the channel that started the session.
	ChannelID string `json:"channelId"`
	// Title is the session's title, if any.
	Title string `json:"title,omitempty"`
	// CreatedAt and UpdatedAt are when the session was created and when
	// its last stored event was recorded.
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// Turns is the number of the last turn with a stored event.
	Turns int64 `json:"turns"`
	// LastSeq is the sequence number of the last stored event.
	LastSeq int64 `json:"lastSeq"`
	// LastStatus is how the last finished turn ended.
	LastStatus string `json:"lastStatus,omitempty"`
	// Batches is the number of the session's last event batch. Numbers
	// may skip a batch a host wrote and then lost the head with; readers
	// follow the batches' links from the head, never the numbers.
	Batches int64 `json:"batches"`
	// TokenDigest is the digest (keys.TokenDigest) of the session's first
	// continuation token, so a host that restores the session resolves the
	// token without another read. The token itself is never stored. Empty
	// in a tombstone.
	TokenDigest string `json:"tokenDigest,omitempty"`
	// LegacyToken is the plain token a record of an earlier build carries
	// ("continuationToken"): read, for its digest, and never written (the
	// record layer clears it on every write).
	LegacyToken string `json:"continuationToken,omitempty"`
}

// Digest returns the digest of the session's token: TokenDigest, or the
// digest of the plain token an earlier build's record carries.
func (m SessionMeta) Digest() string {
	if m.TokenDigest == "" && m.LegacyToken != "" {
		return keys.TokenDigest(m.LegacyToken)
	}
	return m.TokenDigest
}

// stored returns m as it is written: the digest in place of a plain
// token.
func (m SessionMeta) stored() SessionMeta {
	m.TokenDigest, m.LegacyToken = m.Digest(), ""
	return m
}

// RecordVersion is 2 for metadata that carries a token digest: a reader
// of version 1 would take the missing plain token for none.
func (m SessionMeta) RecordVersion() int {
	if m.TokenDigest != "" {
		return 2
	}
	return 1
}

// Head is a session's head: its metadata, the last batch, who wrote it,
// or a tombstone. Hosts change it only with compare-and-set (Commit,
// Delete), so a host whose copy of the session is older than the store's
// can never overwrite newer batches.
type Head struct {
	SessionMeta
	// BatchID is the random id of batch Batches, which the batch record
	// repeats: a reader checks it to be sure the batch is the one the head
	// names. Empty when the last batch was written before heads existed.
	BatchID string `json:"batchId,omitempty"`
	// Writer is the host id of the host that wrote the head.
	Writer string `json:"writer"`
	// Deleted makes the head a tombstone: the session was deleted at
	// UpdatedAt by Writer. A tombstone stays, so that no host's later
	// write brings the session back.
	Deleted bool `json:"deleted,omitempty"`
	// Moved marks a session that moved to the session ledger (MarkMoved):
	// its batches stay, for the ledger's adoption to read, and every
	// commit of serving mode local is refused (Outcome Moved).
	Moved *MovedMark `json:"moved,omitempty"`
}

// RecordVersion is 3 for a head marked moved (a reader of version 2 would
// go on committing to it), else the metadata's.
func (h Head) RecordVersion() int {
	if h.Moved != nil {
		return 3
	}
	return h.SessionMeta.RecordVersion()
}

// Tip returns the batch the head names.
func (h Head) Tip() BatchRef { return BatchRef{Number: h.Batches, ID: h.BatchID} }

// BatchRef names one event batch: its number and its id.
type BatchRef struct {
	// Number is the batch number; 0 names "no batch yet".
	Number int64
	// ID is the batch's random id; empty for a batch written before heads
	// existed (such a batch matches by number alone).
	ID string
}

// matches reports whether r and o name the same batch. An empty id (a
// batch from before heads) cannot be checked and matches by number.
func (r BatchRef) matches(o BatchRef) bool {
	return r.Number == o.Number && (r.ID == "" || o.ID == "" || r.ID == o.ID)
}

// Sessions is one agent's session records in the store: heads, metadata,
// event batches and their parts, continuation tokens and the session
// index. Each method says its write semantics: the batches and the head go
// through Commit, which never overwrites what another host committed; the
// metadata, index and token writes are plain Puts whose errors are returned
// for the caller to keep and retry; reads check the head first, so a
// deleted session never comes back through a stray key.
type Sessions struct {
	a  *AgentStore
	on *kv.DB // another handle on the store (On), or nil
}

// Sessions returns the agent's session records.
func (a *AgentStore) Sessions() *Sessions { return &Sessions{a: a} }

// On returns the same records read and written through db, another handle
// on the binding's store: the embedded default store seen inside a write
// transaction of the session database it lives in, so that a commit is
// part of that transaction. db must be the same store.
func (s *Sessions) On(db *kv.DB) *Sessions { return &Sessions{a: s.a, on: db} }

func (s *Sessions) db() *kv.DB {
	if s.on != nil {
		return s.on
	}
	return s.a.b.db
}

func (s *Sessions) caps() kv.Capabilities {
	if s.on != nil {
		return s.on.Capabilities()
	}
	return s.a.b.caps
}

// key builds a key of the agent's scope, wrapping the error.
func key(k string, err error) (string, error) {
	if err != nil {
		return "", fmt.Errorf("storage: %w", err)
	}
	return k, nil
}

// ReadHead returns the session's head and its version (empty on a store
// without the CAS group, which reads it with Get). A session without a head
// (never committed, or written before heads existed) is an error matching
// kv.ErrNotFound; so is any session on a store without Get.
func (s *Sessions) ReadHead(ctx context.Context, id string) (Head, kv.Version, error) {
	h, ver, _, err := s.readHead(ctx, id)
	return h, ver, err
}

// readHead is ReadHead, also returning the bytes read.
func (s *Sessions) readHead(ctx context.Context, id string) (Head, kv.Version, int64, error) {
	k, err := key(s.a.keys.SessionHead(id))
	if err != nil {
		return Head{}, "", 0, err
	}
	var data []byte
	var ver kv.Version
	switch {
	case s.caps().CAS:
		data, ver, err = s.db().GetWithVersion(ctx, k)
	case s.caps().Get:
		data, err = s.db().Get(ctx, k)
	default:
		return Head{}, "", 0, fmt.Errorf("storage: %q cannot read the session head (no Get): %w", s.a.b.name, kv.ErrNotFound)
	}
	if err != nil {
		return Head{}, "", 0, err
	}
	n := int64(len(data))
	var h Head
	if _, err := record.Unmarshal(KindSessionHead, k, data, &h); err != nil {
		return Head{}, "", n, err
	}
	if h.ID != id {
		return Head{}, "", n, fmt.Errorf("%w: the session head at %q names session %q", ErrBadRecord, k, h.ID)
	}
	return h, ver, n, nil
}

// putHead writes the head: with the CAS group, only over version expected
// (PutIfAbsent when expected is empty), so a head another host wrote since
// it was read is never overwritten; without it, a plain Put.
func (s *Sessions) putHead(ctx context.Context, h Head, expected kv.Version) (kv.Version, error) {
	k, err := key(s.a.keys.SessionHead(h.ID))
	if err != nil {
		return "", err
	}
	h.SessionMeta = h.SessionMeta.stored()
	data, err := record.Marshal(KindSessionHead, h)
	if err != nil {
		return "", err
	}
	switch {
	case !s.caps().CAS:
		return "", s.db().Put(ctx, k, data)
	case expected == "":
		return s.db().PutIfAbsent(ctx, k, data)
	default:
		return s.db().PutIfVersion(ctx, k, data, expected)
	}
}

// ReadMeta returns the stored metadata of a session, or an error matching
// kv.ErrNotFound.
func (s *Sessions) ReadMeta(ctx context.Context, id string) (SessionMeta, int64, error) {
	k, err := key(s.a.keys.SessionMeta(id))
	if err != nil {
		return SessionMeta{}, 0, err
	}
	if !s.caps().Get {
		return SessionMeta{}, 0, fmt.Errorf("storage: %q cannot read session metadata (no Get): %w", s.a.b.name, kv.ErrNotFound)
	}
	data, err := s.db().Get(ctx, k)
	if err != nil {
		return SessionMeta{}, 0, err
	}
	var m SessionMeta
	if _, err := record.Unmarshal(KindSessionMeta, k, data, &m); err != nil {
		return SessionMeta{}, int64(len(data)), err
	}
	if m.ID != id {
		return SessionMeta{}, int64(len(data)), fmt.Errorf("%w: the session metadata at %q names session %q", ErrBadRecord, k, m.ID)
	}
	return m, int64(len(data)), nil
}

// PutMeta writes sessions/{id}/meta, a plain copy of the head's metadata
// kept for readers that predate heads and for people looking into the
// store. Its error is returned: the caller keeps the write and retries.
func (s *Sessions) PutMeta(ctx context.Context, m SessionMeta) error {
	k, err := key(s.a.keys.SessionMeta(m.ID))
	if err != nil {
		return err
	}
	data, err := record.Marshal(KindSessionMeta, m.stored())
	if err != nil {
		return err
	}
	return redact(s.db().Put(ctx, k, data))
}

// PutIndex writes the session's entry in the newest-first session index
// (value: its metadata) for m.UpdatedAt and returns the entry's key. Its
// error is returned.
func (s *Sessions) PutIndex(ctx context.Context, m SessionMeta) (string, error) {
	k, err := key(s.a.keys.SessionIndex(m.UpdatedAt, m.ID))
	if err != nil {
		return "", err
	}
	data, err := record.Marshal(KindSessionMeta, m.stored())
	if err != nil {
		return "", err
	}
	if err := s.db().Put(ctx, k, data); err != nil {
		return "", err
	}
	return k, nil
}

// IndexKey returns the index key of a session last updated at updated.
func (s *Sessions) IndexKey(id string, updated time.Time) (string, error) {
	return key(s.a.keys.SessionIndex(updated, id))
}

// IndexExists reports whether the index entry key is stored.
func (s *Sessions) IndexExists(ctx context.Context, indexKey string) (bool, error) {
	_, err := s.db().Get(ctx, indexKey)
	if errors.Is(err, kv.ErrNotFound) {
		return false, nil
	}
	return err == nil, redact(err)
}

// DeleteIndex removes an index entry written by PutIndex. Without Delete in
// the store it does nothing: a stale entry is harmless, because readers
// check the session itself.
func (s *Sessions) DeleteIndex(ctx context.Context, indexKey string) error {
	if !s.caps().Delete || indexKey == "" {
		return nil
	}
	return s.db().Delete(ctx, indexKey)
}

// IndexEntry is one entry of the session index, as ListIndex yields it.
type IndexEntry struct {
	// Key is the entry's key.
	Key string
	// Updated is the update time the key encodes.
	Updated time.Time
	// Meta is the session's metadata when the entry was written.
	Meta SessionMeta
	// Bytes is the size of the stored value.
	Bytes int
}

// ListIndex yields the session index, newest first. An entry whose key or
// record is unreadable is yielded as an error matching ErrBadRecord (or
// ErrNewerFormat), and the listing goes on; a store error ends it.
// Entries are hints: a session may have several (a stale one a host could
// not delete), and a deleted session may keep one; readers check the
// session's head.
func (s *Sessions) ListIndex(ctx context.Context) iter.Seq2[IndexEntry, error] {
	return s.ListIndexAfter(ctx, "")
}

// ListIndexAfter is ListIndex from after the entry key afterKey ("": from
// the newest), which need not be a stored entry (IndexKey makes one for a
// cursor). On a backend with the start-after capability the listing
// starts there; on another it reads from the newest and drops what comes
// first.
func (s *Sessions) ListIndexAfter(ctx context.Context, afterKey string) iter.Seq2[IndexEntry, error] {
	return func(yield func(IndexEntry, error) bool) {
		if !s.caps().List {
			yield(IndexEntry{}, fmt.Errorf("storage: listing the session index needs a backend with List, and %q has none: %w", s.a.b.name, errors.ErrUnsupported))
			return
		}
		prefix := s.a.keys.SessionIndexPrefix()
		for e, err := range s.db().ListAfter(ctx, prefix, afterKey) {
			if err != nil {
				yield(IndexEntry{}, err)
				return
			}
			updated, seg, ok := keys.ParseSessionIndex(prefix, e.Key)
			if !ok {
				if !yield(IndexEntry{Key: e.Key}, fmt.Errorf("%w: %q is not a session-index key", ErrBadRecord, e.Key)) {
					return
				}
				continue
			}
			var m SessionMeta
			_, err := record.Unmarshal(KindSessionMeta, e.Key, e.Value, &m)
			if err == nil {
				if want, _ := keys.Segment(m.ID); want != seg {
					err = fmt.Errorf("%w: the session-index entry %q names session %q", ErrBadRecord, e.Key, m.ID)
				}
			}
			if !yield(IndexEntry{Key: e.Key, Updated: updated, Meta: m, Bytes: len(e.Value)}, err) {
				return
			}
		}
	}
}

// continuationRecord is the value of continuations/{digest}.
type continuationRecord struct {
	SessionID string `json:"sessionId"`
}

// PutToken writes continuations/{digest}, naming the session, so any host
// can resolve the token whose digest (keys.TokenDigest) it is. Its error
// is returned.
func (s *Sessions) PutToken(ctx context.Context, digest, sessionID string) error {
	if !keys.IsTokenDigest(digest) {
		return fmt.Errorf("storage: PutToken takes the token's digest (keys.TokenDigest), not the token")
	}
	k, err := key(s.a.keys.Continuation(digest))
	if err != nil {
		return err
	}
	data, err := record.Marshal(KindContinuation, continuationRecord{SessionID: sessionID})
	if err != nil {
		return err
	}
	return redact(s.db().Put(ctx, k, data))
}

// ResolveToken returns the id of the session a continuation token names:
// the record under the token's digest, or, for a record an earlier build
// wrote under the plain token and no migration has rewritten yet, that
// one. A token the store does not have is an error matching
// kv.ErrNotFound; any other error is the store's (with the token
// redacted). It does not check the session: load it (Load), which honours
// a tombstone.
func (s *Sessions) ResolveToken(ctx context.Context, token string) (string, error) {
	if !s.caps().Get {
		return "", fmt.Errorf("storage: %q cannot resolve tokens (no Get): %w", s.a.b.name, kv.ErrNotFound)
	}
	id, err := s.resolveAt(ctx, keys.TokenDigest(token))
	if errors.Is(err, kv.ErrNotFound) && !keys.IsTokenDigest(token) {
		id, err = s.resolveAt(ctx, token)
	}
	return id, err
}

// resolveAt reads the continuation record whose key segment is seg.
func (s *Sessions) resolveAt(ctx context.Context, seg string) (string, error) {
	k, err := key(s.a.keys.Continuation(seg))
	if err != nil {
		return "", fmt.Errorf("%w: %w", kv.ErrNotFound, err)
	}
	data, err := s.db().Get(ctx, k)
	if err != nil {
		return "", redact(err)
	}
	var cr continuationRecord
	if _, err := record.Unmarshal(KindContinuation, k, data, &cr); err != nil {
		return "", err
	}
	if cr.SessionID == "" {
		return "", fmt.Errorf("%w: the continuation record at %q names no session", ErrBadRecord, keys.Redact(k))
	}
	return cr.SessionID, nil
}

// Delete deletes a session from the store for every host: it turns the
// head into a tombstone (tomb: the session id, the deleting host in Writer,
// the time in UpdatedAt), with compare-and-set so that a host committing
// at the same moment either lands before the tombstone or finds it, then
// removes the session's other keys: its batches and their parts, its
// metadata, its continuation token and its index entries (those named by
// the head, the metadata and extraIndexKeys, a host's own record of the
// entry it wrote). The tombstone stays: a host that still holds a copy and
// tries to commit, restore or resolve the token finds it and drops its
// copy. Deleting a deleted session succeeds.
//
// Without the CAS group the tombstone is a plain Put, which a host
// committing at the same moment may overwrite. Without Delete the other
// keys stay; readers ignore them because of the tombstone.
func (s *Sessions) Delete(ctx context.Context, tomb Head, digest string, extraIndexKeys ...string) error {
	id := tomb.ID
	tomb = Head{SessionMeta: SessionMeta{ID: id, UpdatedAt: tomb.UpdatedAt}, Writer: tomb.Writer, Deleted: true}
	var found Head
	for attempt := 0; ; attempt++ {
		h, ver, err := s.ReadHead(ctx, id)
		if err != nil && !errors.Is(err, kv.ErrNotFound) {
			return err
		}
		if h.Deleted {
			found = h
			break
		}
		found = h
		tomb.Batches, tomb.BatchID = h.Batches, h.BatchID
		_, err = s.putHead(ctx, tomb, ver)
		if err == nil {
			break
		}
		if !errors.Is(err, kv.ErrConflict) || attempt >= 8 {
			return err
		}
		// A host committed meanwhile: read the new head and try again.
	}
	if !s.caps().Delete {
		return nil
	}
	var dels []string
	// The continuation records: under the digests, and under the plain
	// tokens of an earlier build's records.
	tokens := []string{digest, found.Digest(), found.LegacyToken}
	indexes := append([]string(nil), extraIndexKeys...)
	if !found.UpdatedAt.IsZero() && !found.Deleted {
		if k, err := s.IndexKey(id, found.UpdatedAt); err == nil {
			indexes = append(indexes, k)
		}
	}
	if m, _, err := s.ReadMeta(ctx, id); err == nil {
		tokens = append(tokens, m.Digest(), m.LegacyToken)
		if k, err := s.IndexKey(id, m.UpdatedAt); err == nil {
			indexes = append(indexes, k)
		}
	} else if !errors.Is(err, kv.ErrNotFound) {
		return redact(err)
	}
	dels = append(dels, indexes...)
	for _, t := range tokens {
		if t == "" {
			continue
		}
		if k, err := s.a.keys.Continuation(t); err == nil {
			dels = append(dels, k)
		}
	}
	headKey, _ := s.a.keys.SessionHead(id)
	metaKey, _ := s.a.keys.SessionMeta(id)
	if s.caps().List {
		prefix, _ := s.a.keys.SessionPrefix(id)
		for e, err := range s.db().ListKeys(ctx, prefix) {
			if err != nil {
				return err
			}
			if e != headKey && e != metaKey {
				dels = append(dels, e)
			}
		}
	} else {
		for b := int64(1); b <= found.Batches; b++ {
			if k, err := s.a.keys.EventBatch(id, uint64(b)); err == nil {
				dels = append(dels, k)
			}
		}
	}
	// The metadata last, so an interrupted delete leaves it behind and a
	// retry finds the token and index entry it names.
	dels = append(dels, metaKey)
	seen := map[string]bool{}
	for _, k := range dels {
		if k == "" || seen[k] {
			continue
		}
		seen[k] = true
		if err := s.db().Delete(ctx, k); err != nil {
			return redact(err)
		}
	}
	return nil
}
