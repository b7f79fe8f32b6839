package keys

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Root is the prefix of every key agentkit writes.
const Root = "agentkit/v1/"

// SeqDigits is the width of a zero-padded sequence number in a key (an event
// batch, a legacy actor message): wide enough for any uint64, so keys sort
// in numeric order.
const SeqDigits = 20

// The fixed parts of the key families, after "agentkit/v1/{agent}/".
const (
	sessionsDir      = "sessions/"
	sessionIndexDir  = "session-index/"
	metaName         = "meta"
	headName         = "head"
	eventsDir        = "events/"
	partsDir         = "parts/"
	continuationsDir = "continuations/"
	remindersDir     = "reminders/"
	evalRunsDir      = "eval-runs/"
	evalCasesDir     = "eval-cases/"
	abSamplesDir     = "ab-samples/"
	abSnapshotName   = "ab-snapshot"
	authorKVDir      = "kv/"
	ledgerDir        = "durable-session/"
	actorsDir        = "actors/"
	migrationsDir    = "migrations/"
)

// atLayout is RFC 3339 in UTC with milliseconds, as A/B sample keys use it.
const atLayout = "2006-01-02T15:04:05.000Z"

// Seq formats a sequence number as SeqDigits zero-padded digits.
func Seq(n uint64) string {
	s := strconv.FormatUint(n, 10)
	const zeros = "00000000000000000000"
	return zeros[:SeqDigits-len(s)] + s
}

// ParseSeq reads a sequence number written by Seq. Anything but exactly
// SeqDigits decimal digits is an error matching ErrMalformed.
func ParseSeq(s string) (uint64, error) {
	if len(s) != SeqDigits {
		return 0, fmt.Errorf("%w: sequence number %q is not %d digits", ErrMalformed, s, SeqDigits)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: sequence number %q is not all digits", ErrMalformed, s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: sequence number %q does not fit in 64 bits", ErrMalformed, s)
	}
	return n, nil
}

// FormatAt formats an A/B sample time as it appears, encoded, in the sample's
// key: RFC 3339 in UTC with milliseconds (2024-05-01T12:30:00.123Z, encoded
// 2024-05-01T12%3A30%3A00.123Z). Times are truncated to the millisecond.
// Years outside 0000-9999, which RFC 3339 cannot write, are an error.
func FormatAt(at time.Time) (string, error) {
	at = at.UTC()
	if y := at.Year(); y < 0 || y > 9999 {
		return "", fmt.Errorf("keys: the A/B sample time %s is outside the years 0000-9999 that RFC 3339 can write", at)
	}
	return encode(at.Format(atLayout)), nil
}

// ParseAt reverses FormatAt.
func ParseAt(seg string) (time.Time, error) {
	raw, err := Unsegment(seg)
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(atLayout, raw)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q is not an RFC 3339 UTC time with milliseconds", ErrMalformed, raw)
	}
	return t, nil
}

// Scope builds the keys of one agent: every key under
// "agentkit/v1/{agent}/". Get one from Agent. A Scope is a small value, safe
// to copy and to use from many goroutines.
//
// Key methods take the caller-controlled parts raw and encode them; they
// return an error only when such a part is empty. Prefix methods end in "/"
// and are meant for listing. The zero Scope is not usable: its key methods
// fail and its prefixes match no key.
type Scope struct {
	name   string // the raw agent name
	prefix string // Root + encoded name + "/"
}

// Agent returns the key scope of the agent named name. An empty name is an
// error matching ErrEmptySegment.
func Agent(name string) (Scope, error) {
	if name == "" {
		return Scope{}, fmt.Errorf("%w: the agent name is empty; give the agent a name", ErrEmptySegment)
	}
	return Scope{name: name, prefix: Root + encode(name) + "/"}, nil
}

// Name returns the raw agent name.
func (s Scope) Name() string { return s.name }

// Prefix returns "agentkit/v1/{agent}/": every key of the agent starts with
// it.
func (s Scope) Prefix() string { return s.base() }

// base is the agent's prefix; for the zero Scope, a prefix no key has (no
// valid key holds an empty segment), so listing with it finds nothing.
func (s Scope) base() string {
	if s.prefix == "" {
		return Root + "/"
	}
	return s.prefix
}

// seg encodes a caller-controlled part, naming it in the error.
func seg(what, raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("%w: the %s is empty; give a non-empty %s", ErrEmptySegment, what, what)
	}
	return encode(raw), nil
}

// errZeroScope is returned by every key method of the zero Scope.
var errZeroScope = errors.New("keys: the Scope is the zero value; build it with keys.Agent(name)")

// join builds prefix + the encoded parts separated by "/" + tail.
func (s Scope) join(dir, tail string, parts ...[2]string) (string, error) {
	if s.prefix == "" {
		return "", errZeroScope
	}
	key := s.prefix + dir
	for i, p := range parts {
		e, err := seg(p[0], p[1])
		if err != nil {
			return "", err
		}
		if i > 0 {
			key += "/"
		}
		key += e
	}
	return key + tail, nil
}

func part(what, raw string) [2]string { return [2]string{what, raw} }

// SessionsPrefix returns "agentkit/v1/{agent}/sessions/": every session's
// metadata and events.
func (s Scope) SessionsPrefix() string { return s.base() + sessionsDir }

// SessionPrefix returns "agentkit/v1/{agent}/sessions/{sessionId}/": the
// metadata and events of one session.
func (s Scope) SessionPrefix(sessionID string) (string, error) {
	return s.join(sessionsDir, "/", part("session id", sessionID))
}

// SessionMeta returns "agentkit/v1/{agent}/sessions/{sessionId}/meta".
func (s Scope) SessionMeta(sessionID string) (string, error) {
	return s.join(sessionsDir, "/"+metaName, part("session id", sessionID))
}

// SessionHead returns "agentkit/v1/{agent}/sessions/{sessionId}/head": the
// session head, one small versioned record naming the session's last event
// batch and the host that wrote it, or saying the session was deleted.
// Writers change it with compare-and-set, so a host with an older copy
// cannot overwrite newer batches (package storage).
func (s Scope) SessionHead(sessionID string) (string, error) {
	return s.join(sessionsDir, "/"+headName, part("session id", sessionID))
}

// EventsPrefix returns "agentkit/v1/{agent}/sessions/{sessionId}/events/":
// every event batch of one session, listed in batch order.
func (s Scope) EventsPrefix(sessionID string) (string, error) {
	return s.join(sessionsDir, "/"+eventsDir, part("session id", sessionID))
}

// EventBatch returns
// "agentkit/v1/{agent}/sessions/{sessionId}/events/{batch}", the batch
// number zero-padded to SeqDigits digits.
func (s Scope) EventBatch(sessionID string, batch uint64) (string, error) {
	return s.join(sessionsDir, "/"+eventsDir+Seq(batch), part("session id", sessionID))
}

// BatchPartsPrefix returns
// "agentkit/v1/{agent}/sessions/{sessionId}/parts/{batchId}/": the pieces
// of one event batch too large for one value. batchID is the batch's own
// random id (the runtime's are 32 hex digits), not its number, so two
// hosts racing for one batch number never write the same part keys.
func (s Scope) BatchPartsPrefix(sessionID, batchID string) (string, error) {
	sp, err := s.SessionPrefix(sessionID)
	if err != nil {
		return "", err
	}
	b, err := seg("batch id", batchID)
	if err != nil {
		return "", err
	}
	return sp + partsDir + b + "/", nil
}

// BatchPart returns
// "agentkit/v1/{agent}/sessions/{sessionId}/parts/{batchId}/{part}", the
// part number (from 1) zero-padded to SeqDigits digits. Its value is raw
// bytes, a slice of the batch's events, not JSON.
func (s Scope) BatchPart(sessionID, batchID string, n uint64) (string, error) {
	p, err := s.BatchPartsPrefix(sessionID, batchID)
	if err != nil {
		return "", err
	}
	return p + Seq(n), nil
}

// SessionIndexPrefix returns "agentkit/v1/{agent}/session-index/": the
// newest-first index of sessions that restore reads, so start-up cost grows
// with the restore caps and not with the number of sessions and events in
// the store. This family extends 02-keys.md.
func (s Scope) SessionIndexPrefix() string { return s.base() + sessionIndexDir }

// SessionIndex returns
// "agentkit/v1/{agent}/session-index/{inv}/{sessionId}" for a session last
// updated at updated, where {inv} is math.MaxInt64 minus updated's Unix
// nanoseconds, zero-padded to SeqDigits digits: ascending key order is
// newest first. Times before 1970 are not supported.
func (s Scope) SessionIndex(updated time.Time, sessionID string) (string, error) {
	ns := updated.UnixNano()
	if ns < 0 {
		return "", fmt.Errorf("keys: session index time %s is before 1970", updated.UTC().Format(time.RFC3339))
	}
	return s.join(sessionIndexDir+Seq(uint64(math.MaxInt64-ns))+"/", "", part("session id", sessionID))
}

// ParseSessionIndex returns the update time and the still-encoded session
// id of a key made by SessionIndex under prefix (SessionIndexPrefix). ok is
// false for any other key.
func ParseSessionIndex(prefix, key string) (updated time.Time, sessionSegment string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return time.Time{}, "", false
	}
	inv, seg, ok := strings.Cut(rest, "/")
	if !ok || seg == "" || strings.Contains(seg, "/") {
		return time.Time{}, "", false
	}
	n, err := ParseSeq(inv)
	if err != nil || n > math.MaxInt64 {
		return time.Time{}, "", false
	}
	return time.Unix(0, math.MaxInt64-int64(n)).UTC(), seg, true
}

// ContinuationsPrefix returns "agentkit/v1/{agent}/continuations/".
func (s Scope) ContinuationsPrefix() string { return s.base() + continuationsDir }

// Continuation returns "agentkit/v1/{agent}/continuations/{digest}",
// whose value names the session of the token whose TokenDigest digest is.
// (Records an earlier build wrote under the plain token have the token as
// the segment; a migration rewrites them.)
func (s Scope) Continuation(digest string) (string, error) {
	return s.join(continuationsDir, "", part("continuation token", digest))
}

// Migration returns "agentkit/v1/{agent}/migrations/{name}": the record
// that a one-time migration of the agent's records finished.
func (s Scope) Migration(name string) (string, error) {
	return s.join(migrationsDir, "", part("migration name", name))
}

// RemindersPrefix returns "agentkit/v1/{agent}/reminders/".
func (s Scope) RemindersPrefix() string { return s.base() + remindersDir }

// Reminder returns "agentkit/v1/{agent}/reminders/{reminderId}".
func (s Scope) Reminder(reminderID string) (string, error) {
	return s.join(remindersDir, "", part("reminder id", reminderID))
}

// EvalRunsPrefix returns "agentkit/v1/{agent}/eval-runs/".
func (s Scope) EvalRunsPrefix() string { return s.base() + evalRunsDir }

// EvalRun returns "agentkit/v1/{agent}/eval-runs/{runId}", the derived eval
// table's record of one run.
func (s Scope) EvalRun(runID string) (string, error) {
	return s.join(evalRunsDir, "", part("eval run id", runID))
}

// EvalCasesPrefix returns "agentkit/v1/{agent}/eval-cases/{runId}/": the
// pages of a run's case results, when its record is too large for one
// value.
func (s Scope) EvalCasesPrefix(runID string) (string, error) {
	return s.join(evalCasesDir, "/", part("eval run id", runID))
}

// EvalCasePage returns "agentkit/v1/{agent}/eval-cases/{runId}/{pageId}",
// one page of a run's case results, which the run's record names.
func (s Scope) EvalCasePage(runID, pageID string) (string, error) {
	return s.join(evalCasesDir, "", part("eval run id", runID), part("page id", pageID))
}

// ABSamplesPrefix returns "agentkit/v1/{agent}/ab-samples/": the samples of
// every experiment.
func (s Scope) ABSamplesPrefix() string { return s.base() + abSamplesDir }

// ABExperimentPrefix returns
// "agentkit/v1/{agent}/ab-samples/{experiment}/": every sample of one
// experiment.
func (s Scope) ABExperimentPrefix(experiment string) (string, error) {
	return s.join(abSamplesDir, "/", part("experiment name", experiment))
}

// ABSessionPrefix returns
// "agentkit/v1/{agent}/ab-samples/{experiment}/{sessionId}/": the samples of
// one session in one experiment, in time order.
func (s Scope) ABSessionPrefix(experiment, sessionID string) (string, error) {
	return s.join(abSamplesDir, "/", part("experiment name", experiment), part("session id", sessionID))
}

// ABSample returns
// "agentkit/v1/{agent}/ab-samples/{experiment}/{sessionId}/{at}", where at is
// formatted by FormatAt. Two samples of one session and experiment in the
// same millisecond share a key.
func (s Scope) ABSample(experiment, sessionID string, at time.Time) (string, error) {
	a, err := FormatAt(at)
	if err != nil {
		return "", err
	}
	return s.join(abSamplesDir, "/"+a, part("experiment name", experiment), part("session id", sessionID))
}

// ABSnapshot returns "agentkit/v1/{agent}/ab-snapshot", the latest A/B
// aggregate. It fails only for the zero Scope.
func (s Scope) ABSnapshot() (string, error) {
	if s.prefix == "" {
		return "", errZeroScope
	}
	return s.prefix + abSnapshotName, nil
}

// AuthorKVPrefix returns "agentkit/v1/{agent}/kv/" followed by the encoding
// of an author's key prefix (nothing for ""). Because Segment encodes byte
// by byte, it is a prefix of AuthorKV(key) for every key that starts with
// authorPrefix, except keys long enough to be stored as a digest: those sit
// under AuthorKVDigestPrefix and must be matched by the raw key kept in their
// record. When authorPrefix is itself a prefix of "sha256", the returned
// prefix also matches those digest keys: a listing skips segments for which
// IsDigest is true and handles them with the digests. An authorPrefix whose
// encoding is longer than MaxSegment can match only digests; ok is then
// false.
func (s Scope) AuthorKVPrefix(authorPrefix string) (prefix string, ok bool) {
	n := encodedLen(authorPrefix)
	if n > MaxSegment {
		return "", false
	}
	return s.base() + authorKVDir + percentEncode(authorPrefix, n), true
}

// AuthorKVDigestPrefix returns "agentkit/v1/{agent}/kv/sha256:", under which
// every author key too long to encode is stored. No other author key starts
// with it, because an encoded key never contains ":".
func (s Scope) AuthorKVDigestPrefix() string { return s.base() + authorKVDir + DigestPrefix }

// AuthorKV returns "agentkit/v1/{agent}/kv/{key}": the author's whole key
// is one segment, so "alert-memory/abc" is stored as
// ".../kv/alert-memory%2Fabc".
func (s Scope) AuthorKV(key string) (string, error) {
	return s.join(authorKVDir, "", part("host KV key", key))
}

// LedgerPrefix returns "agentkit/v1/{agent}/durable-session/", the family
// of the session ledger (package ledger, serving mode ledger), which lays
// out the keys below it: ctl/{sessionId} (the control records),
// data/{sessionId}/... (payloads, committed turns, large outputs) and
// dlq/{sessionId}/... (dead letters).
func (s Scope) LedgerPrefix() string { return s.base() + ledgerDir }

// LedgerSession returns
// "agentkit/v1/{agent}/durable-session/{sessionId}/". The ledger writes no
// key under it: its keys put the record kind before the session id
// (ctl/{sessionId}, data/{sessionId}/, dlq/{sessionId}/; see LedgerPrefix)
// so that one prefix scan reads one kind of record. A key under it still
// parses as FamilyLedger.
func (s Scope) LedgerSession(sessionID string) (string, error) {
	return s.join(ledgerDir, "/", part("session id", sessionID))
}

// ActorsPrefix returns "agentkit/v1/{agent}/actors/", the root of the legacy
// key-value layout of actor stores (07-actor.md).
func (s Scope) ActorsPrefix() string { return s.base() + actorsDir }

// Actor returns "agentkit/v1/{agent}/actors/{actorId}/", the prefix of one
// actor's legacy records (state, messages/{seq}, events/{seq},
// schedules/{id}).
func (s Scope) Actor(actorID string) (string, error) {
	return s.join(actorsDir, "/", part("actor id", actorID))
}

// ProbePrefix is "agentkit/v1/probe:coordination/", the prefix of the keys
// the start-up probe of the compare-and-set checks writes and deletes
// (storage.ProbeCoordination). It lies outside every agent's keys: its
// first segment holds a ':', which an encoded agent name never does (a
// digest segment starts with "sha256:").
const ProbePrefix = Root + "probe:coordination/"

// CoordinationProbe returns ProbePrefix + the encoded nonce, the key of one
// start-up probe. An empty nonce is an error matching ErrEmptySegment.
func CoordinationProbe(nonce string) (string, error) {
	e, err := seg("probe nonce", nonce)
	if err != nil {
		return "", err
	}
	return ProbePrefix + e, nil
}
