package actor

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentkit/actor/mergepatch"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// The key-value layout of earlier builds, under
// agentkit/v1/{agent}/actors/{actorId}/:
//
//	state             the state's JSON
//	messages/{seq}    one message, seq zero-padded to 20 digits
//	events/{seq}      one event, likewise
//	schedules/{id}    one scheduled task, as Task's JSON
//	migrated          the marker this build leaves (markerRecord)
//
// A message or event value that is a JSON object of Record's fields (at,
// type, data, and optionally seq) is read as that record; any other JSON
// value is the record's data. The seq always comes from the key.

// kindMarker is the migration marker's kind: its version is its "format"
// field (the marker's layout predates package record), under record's
// version rule.
var kindMarker = record.NewKind("actor migration marker", markerFormat)

const (
	markerName   = "migrated"
	markerFormat = 1

	markerMigrating = "migrating" // claimed; the key-value records are intact
	markerMigrated  = "migrated"  // the database is durable; the records are being or were removed
)

// markerRecord is the value of the migration marker.
type markerRecord struct {
	Format int       `json:"format"`
	State  string    `json:"state"`
	Host   string    `json:"host"`
	Dir    string    `json:"dir"`
	Class  string    `json:"class"`
	ID     string    `json:"id"`
	At     time.Time `json:"at"`
}

// MigratedError means an actor's key-value records were migrated (or are
// being migrated) into the database of another host, or of this host that
// lost it, so this host refuses to serve the actor rather than serve it
// empty. It matches ErrMigrated.
type MigratedError struct {
	Class, ID string
	Host      string // the host that migrated the actor
	Dir       string // its actors folder
	State     string // "migrating" or "migrated"
	Key       string // the marker's key
	Lost      bool   // this host migrated it and its database is missing
	Path      string // with Lost, the missing database
}

// Error names the host that holds the actor and what to do.
func (e *MigratedError) Error() string {
	switch {
	case e.Lost:
		return fmt.Sprintf("actor: %s/%s was migrated from the key-value store into %s by this host, and that file is missing; restore it from a backup (the key-value records were removed after the migration)", e.Class, e.ID, e.Path)
	case e.State == markerMigrating:
		return fmt.Sprintf("actor: %s/%s is being migrated from the key-value store by host %s (actors folder %s); serve it from that host. If that host is gone for good, delete the key %s: its key-value records are intact and another host then migrates them", e.Class, e.ID, e.Host, e.Dir, e.Key)
	default:
		return fmt.Sprintf("actor: %s/%s was migrated from the key-value store into the actor database of host %s (actors folder %s), which this host does not have; serve it from that host, or copy that host's actors folder here", e.Class, e.ID, e.Host, e.Dir)
	}
}

// Is makes errors.Is(err, ErrMigrated) true.
func (e *MigratedError) Is(target error) bool { return target == ErrMigrated }

// testHook, when set by a test, runs at each step of a migration; the
// crash tests kill the process there.
var testHook func(step string)

func hook(step string) {
	if testHook != nil {
		testHook(step)
	}
}

// legacyPrefix is the actor's prefix in the key-value layout.
func (r *Ref) legacyPrefix() (string, error) { return r.h.scope.Actor(r.id) }

func (r *Ref) mine(m *markerRecord) bool { return m.Host == r.h.opts.HostID && m.Dir == r.h.opts.Dir }

// readMarker returns the marker and its version (empty without the CAS
// group), or nil when there is none.
func (r *Ref) readMarker(ctx context.Context) (*markerRecord, kv.Version, string, error) {
	prefix, err := r.legacyPrefix()
	if err != nil {
		return nil, "", "", err
	}
	key := prefix + markerName
	store := r.h.opts.Store
	var b []byte
	var ver kv.Version
	if store.Capabilities().CAS {
		b, ver, err = store.GetWithVersion(ctx, key)
	} else {
		b, err = store.Get(ctx, key)
	}
	if errors.Is(err, kv.ErrNotFound) {
		return nil, "", key, nil
	}
	if err != nil {
		return nil, "", key, fmt.Errorf("actor: reading the migration marker %s: %w", key, err)
	}
	var m markerRecord
	if err := json.Unmarshal(b, &m); err != nil || m.Format < 1 {
		return nil, "", key, fmt.Errorf("actor: the migration marker %s holds %q, not a marker; restore it", key, clip(b))
	}
	if err := record.Check(kindMarker, key, m.Format); err != nil {
		return nil, "", key, fmt.Errorf("actor: the migration marker %s has format %d, and this agentkit reads format %d or older; upgrade agentkit: %w", key, m.Format, markerFormat, err)
	}
	return &m, ver, key, nil
}

// writeMarker writes the marker in state, conditionally on ver when the
// store has the CAS group (empty ver: only if absent). It returns the new
// version.
func (r *Ref) writeMarker(ctx context.Context, key, state string, ver kv.Version) (kv.Version, error) {
	b, _ := json.Marshal(markerRecord{Format: markerFormat, State: state, Host: r.h.opts.HostID,
		Dir: r.h.opts.Dir, Class: r.class, ID: r.id, At: time.Now().UTC()})
	store := r.h.opts.Store
	var err error
	switch {
	case !store.Capabilities().CAS:
		err = store.Put(ctx, key, b)
	case ver == "":
		ver, err = store.PutIfAbsent(ctx, key, b)
	default:
		ver, err = store.PutIfVersion(ctx, key, b, ver)
	}
	if err != nil {
		return "", fmt.Errorf("actor: writing the migration marker %s: %w", key, err)
	}
	return ver, nil
}

func (r *Ref) migratedError(m *markerRecord, key string) *MigratedError {
	e := &MigratedError{Class: r.class, ID: r.id, Host: m.Host, Dir: m.Dir, State: m.State, Key: key}
	if r.mine(m) && m.State == markerMigrated {
		e.Lost, e.Path = true, r.systemPath()
	}
	return e
}

// checkMarkerForRead refuses to read an actor without a database whose
// key-value records were migrated: they are gone, and serving the initial
// state instead would lie. A migration still in progress leaves them
// intact and readable.
func (r *Ref) checkMarkerForRead(ctx context.Context) error {
	m, _, key, err := r.readMarker(ctx)
	if err != nil || m == nil || m.State == markerMigrating {
		return err
	}
	return r.migratedError(m, key)
}

// migrate copies the actor's key-value records into a new database. It
// returns false when there are none to copy (the caller creates an empty
// database) and fs.ErrExist when another creator made the database first.
//
// The steps: claim the marker ("migrating", naming this host); read the
// records; record the due scheduled tasks in the host's index; build the
// database with every record and the list of their keys; move it into
// place and sync. finishMigration then marks the migration done and
// deletes the keys. A crash before the move leaves the records intact and
// the claim this host's own, so the next write redoes it; a crash after
// it leaves a complete database whose meta says what is left to do.
func (r *Ref) migrate(ctx context.Context) (bool, error) {
	prefix, err := r.legacyPrefix()
	if err != nil {
		return false, err
	}
	m, _, key, err := r.readMarker(ctx)
	if err != nil {
		return false, err
	}
	if m != nil && (!r.mine(m) || m.State == markerMigrated) {
		return false, r.migratedError(m, key)
	}
	if m == nil {
		any, err := r.hasLegacy(ctx, prefix)
		if err != nil || !any {
			return false, err
		}
		if _, err := r.writeMarker(ctx, key, markerMigrating, ""); err != nil {
			if errors.Is(err, kv.ErrConflict) {
				// Another host claimed it between our read and write.
				if m, _, key, err2 := r.readMarker(ctx); err2 == nil && m != nil {
					return false, r.migratedError(m, key)
				}
			}
			return false, err
		}
	}
	hook("claimed")
	snap, err := r.loadLegacy(ctx, prefix)
	if err != nil {
		return false, err
	}
	if due, ok := snap.firstDue(); ok {
		if err := r.h.indexAdd(ctx, r.class, r.id, due); err != nil {
			return false, err
		}
	}
	meta := dbMeta{class: r.class, actor: r.id, migratedFrom: prefix, migration: migrationCopied}
	err = createDB(ctx, r.systemPath(), meta, snap.fill(ctx))
	if err != nil {
		return true, err
	}
	hook("created")
	return true, nil
}

// finishMigration completes a migration whose database is durable: the
// marker says "migrated", then the copied keys are deleted, then the
// database records that nothing is left to do. Each step is redone after a
// crash. e.mu is held.
func (r *Ref) finishMigration(ctx context.Context, e *entry) error {
	if e.meta.migration != migrationCopied || r.h.opts.Store == nil {
		return nil
	}
	m, ver, key, err := r.readMarker(ctx)
	if err != nil {
		return err
	}
	if m != nil && !r.mine(m) {
		return r.migratedError(m, key)
	}
	if m == nil || m.State != markerMigrated {
		if _, err := r.writeMarker(ctx, key, markerMigrated, ver); err != nil {
			return err
		}
	}
	hook("marked")
	rows, err := e.db.QueryContext(ctx, "SELECT key FROM legacy_keys ORDER BY key")
	if err != nil {
		return fmt.Errorf("actor: reading the migrated keys: %w", err)
	}
	var ks []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return fmt.Errorf("actor: reading the migrated keys: %w", err)
		}
		ks = append(ks, k)
	}
	rows.Close()
	for i, k := range ks {
		if err := r.h.opts.Store.Delete(ctx, k); err != nil {
			return fmt.Errorf("actor: deleting the migrated key %s: %w", k, err)
		}
		if i == 0 {
			hook("deleted-one")
		}
	}
	hook("deleted")
	err = inTx(ctx, e.db, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "DELETE FROM legacy_keys"); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "UPDATE meta SET migration = ? WHERE id = 1", migrationDone)
		return err
	})
	if err != nil {
		return fmt.Errorf("actor: recording the end of the migration: %w", err)
	}
	e.meta.migration = migrationDone
	hook("done")
	return nil
}

// hasLegacy reports whether the actor has a record (not the marker) in
// the key-value layout.
func (r *Ref) hasLegacy(ctx context.Context, prefix string) (bool, error) {
	for k, err := range r.h.opts.Store.ListKeys(ctx, prefix) {
		if err != nil {
			return false, fmt.Errorf("actor: listing %s: %w", prefix, err)
		}
		if k != prefix+markerName {
			return true, nil
		}
	}
	return false, nil
}

// snapshot is an actor's key-value records.
type snapshot struct {
	state            []byte
	messages, events []Record
	schedules        []Task
	keys             []string // every key copied
}

func (s *snapshot) firstDue() (time.Time, bool) {
	var first time.Time
	for _, t := range s.schedules {
		if !t.Failed && (first.IsZero() || t.Due.Before(first)) {
			first = t.Due
		}
	}
	return first, !first.IsZero()
}

// fill inserts the snapshot into a new database.
func (s *snapshot) fill(ctx context.Context) func(tx *sql.Tx) error {
	return func(tx *sql.Tx) error {
		if s.state != nil {
			if err := storeState(ctx, tx, s.state); err != nil {
				return err
			}
		}
		for table, recs := range map[string][]Record{"messages": s.messages, "events": s.events} {
			for _, rec := range recs {
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (seq, at, type, data) VALUES (?, ?, ?, ?)`,
					rec.Seq, rec.At.UnixNano(), rec.Type, []byte(rec.Data)); err != nil {
					return fmt.Errorf("actor: copying %s %d: %w", table, rec.Seq, err)
				}
			}
		}
		for _, t := range s.schedules {
			if err := insertTask(ctx, tx, t); err != nil {
				return err
			}
		}
		for _, k := range s.keys {
			if _, err := tx.ExecContext(ctx, `INSERT INTO legacy_keys (key) VALUES (?)`, k); err != nil {
				return fmt.Errorf("actor: copying the key list: %w", err)
			}
		}
		return nil
	}
}

// loadLegacy reads every record of the actor in the key-value layout. A
// value that is not what its key says is an error naming the key: the
// migration never drops a record. Keys it does not know are left alone.
func (r *Ref) loadLegacy(ctx context.Context, prefix string) (*snapshot, error) {
	s := &snapshot{}
	for e, err := range r.h.opts.Store.List(ctx, prefix) {
		if err != nil {
			return nil, fmt.Errorf("actor: listing %s: %w", prefix, err)
		}
		rest := strings.TrimPrefix(e.Key, prefix)
		switch {
		case rest == markerName:
			continue
		case rest == "state":
			v, err := legacyJSON(e)
			if err != nil {
				return nil, err
			}
			s.state = v
		case strings.HasPrefix(rest, "messages/") || strings.HasPrefix(rest, "events/"):
			dir, seg, _ := strings.Cut(rest, "/")
			rec, err := legacyRecord(e, seg)
			if err != nil {
				return nil, err
			}
			if dir == "messages" {
				s.messages = append(s.messages, rec)
			} else {
				s.events = append(s.events, rec)
			}
		case strings.HasPrefix(rest, "schedules/"):
			t, err := legacyTask(e, strings.TrimPrefix(rest, "schedules/"), r.class, r.id)
			if err != nil {
				return nil, err
			}
			s.schedules = append(s.schedules, t)
		default:
			r.h.log.Warn("actor: leaving an unknown key of the key-value actor layout in place", "key", e.Key)
			continue
		}
		s.keys = append(s.keys, e.Key)
	}
	return s, nil
}

func legacyJSON(e kv.Entry) ([]byte, error) {
	v, err := mergepatch.Compact(e.Value, "value of "+e.Key)
	if err != nil {
		return nil, fmt.Errorf("actor: the key-value record %s is not JSON; fix or delete it, then write to the actor again: %w", e.Key, err)
	}
	return v, nil
}

func legacyRecord(e kv.Entry, seg string) (Record, error) {
	seq, err := keys.ParseSeq(seg)
	if err != nil || seq > 1<<63-1 {
		return Record{}, fmt.Errorf("actor: the key-value record %s has no valid sequence number; fix or delete it, then write to the actor again", e.Key)
	}
	v, err := legacyJSON(e)
	if err != nil {
		return Record{}, err
	}
	rec := Record{Seq: int64(seq), Data: v}
	var env struct {
		Seq  *int64          `json:"seq"`
		At   *time.Time      `json:"at"`
		Type *string         `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.DisallowUnknownFields()
	if bytes.HasPrefix(v, []byte("{")) && dec.Decode(&env) == nil && env.Data != nil && env.At != nil {
		rec.Data, rec.At = env.Data, env.At.UTC()
		if env.Type != nil {
			rec.Type = *env.Type
		}
	}
	return rec, nil
}

func legacyTask(e kv.Entry, seg, class, id string) (Task, error) {
	var t Task
	if err := json.Unmarshal(e.Value, &t); err != nil || t.Handler == "" || (t.Due.IsZero() && t.Cron == "") {
		return Task{}, fmt.Errorf("actor: the key-value record %s is not a scheduled task (a JSON object with handler and due or cron); fix or delete it, then write to the actor again", e.Key)
	}
	if t.ID == "" {
		raw, err := keys.Unsegment(seg)
		if err != nil {
			return Task{}, fmt.Errorf("actor: the key-value record %s has no id; add one or delete it", e.Key)
		}
		t.ID = raw
	}
	if t.Due.IsZero() {
		w, err := parseCron(t.Cron)
		if err != nil {
			return Task{}, fmt.Errorf("actor: the key-value record %s: %w", e.Key, err)
		}
		t.Due = w.Next(time.Now())
	}
	if t.Kind == "" {
		t.Kind = KindAt
		if t.Cron != "" {
			t.Kind = KindCron
		}
	}
	if len(t.Payload) == 0 {
		t.Payload = json.RawMessage("null")
	}
	if t.Created.IsZero() {
		t.Created = time.Now().UTC()
	}
	t.Class, t.Actor = class, id
	return t, nil
}

// legacyState reads the state of the key-value layout; nil when absent.
func (r *Ref) legacyState(ctx context.Context) ([]byte, error) {
	prefix, err := r.legacyPrefix()
	if err != nil {
		return nil, err
	}
	key := prefix + "state"
	b, err := r.h.opts.Store.Get(ctx, key)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("actor: reading %s: %w", key, err)
	}
	return legacyJSON(kv.Entry{Key: key, Value: b})
}

// legacyRecords reads one log of the key-value layout, in seq order.
func (r *Ref) legacyRecords(ctx context.Context, dir string) ([]Record, error) {
	prefix, err := r.legacyPrefix()
	if err != nil {
		return nil, err
	}
	var recs []Record
	for e, err := range r.h.opts.Store.List(ctx, prefix+dir) {
		if err != nil {
			return nil, fmt.Errorf("actor: listing %s: %w", prefix+dir, err)
		}
		rec, err := legacyRecord(e, strings.TrimPrefix(e.Key, prefix+dir))
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// legacyTasks reads the scheduled tasks of the key-value layout.
func (r *Ref) legacyTasks(ctx context.Context) ([]Task, error) {
	prefix, err := r.legacyPrefix()
	if err != nil {
		return nil, err
	}
	var ts []Task
	for e, err := range r.h.opts.Store.List(ctx, prefix+"schedules/") {
		if err != nil {
			return nil, fmt.Errorf("actor: listing %s: %w", prefix+"schedules/", err)
		}
		t, err := legacyTask(e, strings.TrimPrefix(e.Key, prefix+"schedules/"), r.class, r.id)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

func clip(b []byte) string {
	if len(b) > 60 {
		return string(b[:60]) + "…"
	}
	return string(b)
}
