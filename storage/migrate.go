package storage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// MigrationTokenDigests names the migration that rewrites the continuation
// tokens earlier builds stored in plain (migrations/token-digests).
const MigrationTokenDigests = "token-digests"

// KindMigration is migrations/{name}: that a one-time migration finished.
var KindMigration = record.NewKind("migration marker", 1)

// migrationRecord is the value of migrations/{name}.
type migrationRecord struct {
	Name string    `json:"name"`
	At   time.Time `json:"at"`
	Host string    `json:"host,omitempty"`
	// Rewritten counts the records the finishing run rewrote.
	Rewritten int `json:"rewritten"`
}

// MigrationLedgerSessionIndex names the one-time build of the session
// index for the sessions of serving mode ledger
// (migrations/ledger-session-index).
const MigrationLedgerSessionIndex = "ledger-session-index"

// Migrated reports whether the migration name has finished: its marker,
// migrations/{name}, is stored.
func (s *Sessions) Migrated(ctx context.Context, name string) (bool, error) {
	marker, err := key(s.a.keys.Migration(name))
	if err != nil {
		return false, err
	}
	if _, err := s.db().Get(ctx, marker); err == nil {
		return true, nil
	} else if !errors.Is(err, kv.ErrNotFound) {
		return false, fmt.Errorf("storage: reading the marker of migration %s: %w", name, err)
	}
	return false, nil
}

// MarkMigrated writes the marker of migration name, which host finished
// after rewriting (or writing) rewritten records.
func (s *Sessions) MarkMigrated(ctx context.Context, name, host string, rewritten int) error {
	marker, err := key(s.a.keys.Migration(name))
	if err != nil {
		return err
	}
	data, err := record.Marshal(KindMigration, migrationRecord{Name: name, At: time.Now().UTC(), Host: host, Rewritten: rewritten})
	if err != nil {
		return err
	}
	if err := s.db().Put(ctx, marker, data); err != nil {
		return fmt.Errorf("storage: writing the marker of migration %s: %w", name, err)
	}
	return nil
}

// TokenMigration is what MigrateTokens did.
type TokenMigration struct {
	// Done is set when the migration had finished before (its marker was
	// there): nothing was read.
	Done bool
	// Continuations, Heads, Metas and IndexEntries count the records
	// rewritten.
	Continuations, Heads, Metas, IndexEntries int
}

// Rewritten is the number of records rewritten.
func (m TokenMigration) Rewritten() int {
	return m.Continuations + m.Heads + m.Metas + m.IndexEntries
}

// MigrateTokens rewrites, once, the agent's records that an earlier build
// wrote with a plain continuation token: each continuations/{token} record
// moves to continuations/{digest} (written, then the old key deleted), and
// session heads (by compare-and-set, read again on a conflict), metadata
// and session-index entries get the token's digest in place of the token.
// When every record is done it writes the migration's marker
// (migrations/token-digests), which later runs find first and stop at, so
// a host pays for the migration once. It is idempotent and resumable: a
// run interrupted midway leaves records that are either rewritten or not,
// and the next run rewrites the rest; hosts running it at once do the same
// writes. host names the host in the marker; more, when set, runs before
// the marker is written (the session ledger's rewrite of its records, in
// serving mode ledger), and its error stops the migration as the
// record layer's do.
//
// A store without Get, List or Delete cannot be migrated (its records
// cannot be read or the old keys removed): the migration is skipped and
// reported as not done.
func (s *Sessions) MigrateTokens(ctx context.Context, host string, more func(context.Context) error) (TokenMigration, error) {
	var m TokenMigration
	caps := s.caps()
	if !caps.Get || !caps.List || !caps.Delete {
		return m, nil
	}
	if done, err := s.Migrated(ctx, MigrationTokenDigests); err != nil || done {
		m.Done = done
		return m, err
	}
	if err := s.migrateContinuations(ctx, &m); err != nil {
		return m, err
	}
	if err := s.migrateSessions(ctx, &m); err != nil {
		return m, err
	}
	if err := s.migrateIndex(ctx, &m); err != nil {
		return m, err
	}
	if more != nil {
		if err := more(ctx); err != nil {
			return m, err
		}
	}
	return m, s.MarkMigrated(ctx, MigrationTokenDigests, host, m.Rewritten())
}

// migrateContinuations moves every continuations/{token} record to
// continuations/{digest}.
func (s *Sessions) migrateContinuations(ctx context.Context, m *TokenMigration) error {
	db := s.db()
	prefix := s.a.keys.ContinuationsPrefix()
	var plain []string
	for k, err := range db.ListKeys(ctx, prefix) {
		if err != nil {
			return fmt.Errorf("storage: listing continuation records: %w", redact(err))
		}
		if seg := strings.TrimPrefix(k, prefix); !keys.IsTokenDigest(seg) {
			plain = append(plain, k)
		}
	}
	for _, k := range plain {
		token, err := keys.Unsegment(strings.TrimPrefix(k, prefix))
		if err != nil {
			continue // a digest-shortened segment: not a token agentkit issued
		}
		data, err := db.Get(ctx, k)
		if errors.Is(err, kv.ErrNotFound) {
			continue // moved by another run meanwhile
		}
		if err != nil {
			return fmt.Errorf("storage: reading a continuation record: %w", redact(err))
		}
		to, err := key(s.a.keys.Continuation(keys.TokenDigest(token)))
		if err != nil {
			return err
		}
		if err := db.Put(ctx, to, data); err != nil {
			return fmt.Errorf("storage: writing a continuation record under its digest: %w", err)
		}
		if err := db.Delete(ctx, k); err != nil && !errors.Is(err, kv.ErrNotFound) {
			return fmt.Errorf("storage: removing a plain continuation record: %w", redact(err))
		}
		m.Continuations++
	}
	return nil
}

// migrateSessions rewrites the heads and metadata records that carry a
// plain token.
func (s *Sessions) migrateSessions(ctx context.Context, m *TokenMigration) error {
	db := s.db()
	var ids []string
	for k, err := range db.ListKeys(ctx, s.a.keys.SessionsPrefix()) {
		if err != nil {
			return fmt.Errorf("storage: listing sessions: %w", err)
		}
		pk, err := keys.Parse(k)
		if err != nil || pk.Family != keys.FamilySessionHead && pk.Family != keys.FamilySessionMeta {
			continue
		}
		id, err := keys.Unsegment(pk.Session)
		if err != nil {
			continue
		}
		if pk.Family == keys.FamilySessionHead {
			if err := s.migrateHead(ctx, id, m); err != nil {
				return err
			}
			continue
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		meta, _, err := s.ReadMeta(ctx, id)
		if errors.Is(err, kv.ErrNotFound) || IsRecordError(err) {
			continue
		}
		if err != nil {
			return err
		}
		if meta.LegacyToken == "" {
			continue
		}
		if err := s.PutMeta(ctx, meta); err != nil {
			return err
		}
		m.Metas++
	}
	return nil
}

// migrateHead rewrites a session head that carries a plain token, by
// compare-and-set: a host that commits meanwhile writes the digest itself
// (or, an earlier build, the token again, and the head is read again).
func (s *Sessions) migrateHead(ctx context.Context, id string, m *TokenMigration) error {
	for range 8 {
		h, ver, err := s.ReadHead(ctx, id)
		if errors.Is(err, kv.ErrNotFound) || IsRecordError(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if h.LegacyToken == "" {
			return nil
		}
		_, err = s.putHead(ctx, h, ver)
		if err == nil {
			m.Heads++
			return nil
		}
		if !errors.Is(err, kv.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("storage: session %q: its head kept changing while its token was migrated; start again to finish", id)
}

// migrateIndex rewrites the session-index entries that carry a plain
// token. An entry removed meanwhile and written back is stale and
// harmless: readers check the session itself.
func (s *Sessions) migrateIndex(ctx context.Context, m *TokenMigration) error {
	db := s.db()
	for e, err := range s.ListIndex(ctx) {
		if IsRecordError(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("storage: listing the session index: %w", err)
		}
		if e.Meta.LegacyToken == "" {
			continue
		}
		data, err := record.Marshal(KindSessionMeta, e.Meta.stored())
		if err != nil {
			return err
		}
		if err := db.Put(ctx, e.Key, data); err != nil {
			return err
		}
		m.IndexEntries++
	}
	return nil
}
