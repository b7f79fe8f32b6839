package keys

import (
	"fmt"
	"strings"
	"time"
)

// Family names a key family of 02-keys.md.
type Family int

// The key families.
const (
	FamilyUnknown      Family = iota // the zero Family; Parse never returns it
	FamilySessionMeta                // sessions/{sessionId}/meta
	FamilyEventBatch                 // sessions/{sessionId}/events/{batch}
	FamilyContinuation               // continuations/{digest} (a plain token in records of earlier builds)
	FamilyReminder                   // reminders/{reminderId}
	FamilyEvalRun                    // eval-runs/{runId}
	FamilyABSample                   // ab-samples/{experiment}/{sessionId}/{at}
	FamilyABSnapshot                 // ab-snapshot
	FamilyAuthorKV                   // kv/{key}
	FamilyLedger                     // durable-session/…
	FamilyActor                      // actors/{actorId}/… (legacy layout)
	FamilySessionHead                // sessions/{sessionId}/head
	FamilyBatchPart                  // sessions/{sessionId}/parts/{batchId}/{part}
	FamilySessionIndex               // session-index/{inv}/{sessionId}
	FamilyMigration                  // migrations/{name}
	FamilyEvalCasePage               // eval-cases/{runId}/{pageId}
)

var familyNames = [...]string{
	FamilyUnknown:      "unknown",
	FamilySessionMeta:  "session metadata",
	FamilyEventBatch:   "session event batch",
	FamilyContinuation: "continuation token",
	FamilyReminder:     "reminder",
	FamilyEvalRun:      "eval run",
	FamilyABSample:     "A/B sample",
	FamilyABSnapshot:   "A/B snapshot",
	FamilyAuthorKV:     "author KV",
	FamilyLedger:       "durable-session ledger",
	FamilyActor:        "actor (legacy layout)",
	FamilySessionHead:  "session head",
	FamilyBatchPart:    "session event batch part",
	FamilySessionIndex: "session index",
	FamilyMigration:    "migration marker",
	FamilyEvalCasePage: "eval case page",
}

// String returns the family's name as 02-keys.md writes it.
func (f Family) String() string {
	if f < 0 || int(f) >= len(familyNames) {
		return fmt.Sprintf("Family(%d)", int(f))
	}
	return familyNames[f]
}

// Key is a key taken apart by Parse. Segments are left encoded, exactly as
// they appear in the key: pass them to Unsegment for the raw value (which
// fails with ErrDigest for a segment that was too long to keep).
type Key struct {
	// Family is the key's family.
	Family Family
	// Agent is the encoded agent name.
	Agent string
	// Session is the encoded session id of a session metadata key, a
	// session head, an event batch or part, a session-index entry or an
	// A/B sample.
	Session string
	// ID is the encoded continuation token, reminder id, eval run id (of a
	// run or of one of its case pages),
	// author key, actor id, or the batch id of an event batch part.
	ID string
	// Experiment is the encoded experiment name of an A/B sample.
	Experiment string
	// At is the time of an A/B sample, or the update time of a
	// session-index entry.
	At time.Time
	// Batch is the number of an event batch, or of an event batch part.
	Batch uint64
	// Rest is what follows "durable-session/" in a ledger key, or
	// "actors/{actorId}/" in a legacy actor key, or the encoded page id of
	// an eval case page.
	Rest string
}

// Parse takes a key built by this package apart. A key outside Root, with a
// malformed segment, or of no known family is an error matching ErrMalformed.
func Parse(key string) (Key, error) {
	bad := func(why string) (Key, error) {
		return Key{}, fmt.Errorf("%w: key %q %s", ErrMalformed, key, why)
	}
	rest, ok := strings.CutPrefix(key, Root)
	if !ok {
		return bad("does not start with " + Root)
	}
	agent, rest, ok := strings.Cut(rest, "/")
	if !ok || !validSegment(agent) {
		return bad("has no valid agent segment")
	}
	k := Key{Agent: agent}
	parts := strings.Split(rest, "/")
	for _, p := range parts {
		if p == "" {
			return bad("has an empty segment")
		}
	}
	segs := func(idx ...int) bool {
		for _, i := range idx {
			if !validSegment(parts[i]) {
				return false
			}
		}
		return true
	}
	switch dir, n := parts[0]+"/", len(parts); {
	case dir == sessionsDir && n == 3 && parts[2] == metaName && segs(1):
		k.Family, k.Session = FamilySessionMeta, parts[1]
	case dir == sessionsDir && n == 3 && parts[2] == headName && segs(1):
		k.Family, k.Session = FamilySessionHead, parts[1]
	case dir == sessionsDir && n == 5 && parts[2]+"/" == partsDir && segs(1, 3):
		p, err := ParseSeq(parts[4])
		if err != nil {
			return bad("has a bad part number")
		}
		k.Family, k.Session, k.ID, k.Batch = FamilyBatchPart, parts[1], parts[3], p
	case dir == sessionIndexDir && n == 3 && segs(2):
		at, seg, ok := ParseSessionIndex(Root+agent+"/"+sessionIndexDir, key)
		if !ok {
			return bad("has a bad session-index time")
		}
		k.Family, k.Session, k.At = FamilySessionIndex, seg, at
	case dir == sessionsDir && n == 4 && parts[2]+"/" == eventsDir && segs(1):
		b, err := ParseSeq(parts[3])
		if err != nil {
			return bad("has a bad batch number")
		}
		k.Family, k.Session, k.Batch = FamilyEventBatch, parts[1], b
	case dir == continuationsDir && n == 2 && segs(1):
		k.Family, k.ID = FamilyContinuation, parts[1]
	case dir == migrationsDir && n == 2 && segs(1):
		k.Family, k.ID = FamilyMigration, parts[1]
	case dir == remindersDir && n == 2 && segs(1):
		k.Family, k.ID = FamilyReminder, parts[1]
	case dir == evalRunsDir && n == 2 && segs(1):
		k.Family, k.ID = FamilyEvalRun, parts[1]
	case dir == evalCasesDir && n == 3 && segs(1, 2):
		k.Family, k.ID, k.Rest = FamilyEvalCasePage, parts[1], parts[2]
	case dir == abSamplesDir && n == 4 && segs(1, 2):
		at, err := ParseAt(parts[3])
		if err != nil {
			return bad("has a bad sample time")
		}
		k.Family, k.Experiment, k.Session, k.At = FamilyABSample, parts[1], parts[2], at
	case rest == abSnapshotName:
		k.Family = FamilyABSnapshot
	case dir == authorKVDir && n == 2 && segs(1):
		k.Family, k.ID = FamilyAuthorKV, parts[1]
	case dir == ledgerDir && n >= 2:
		k.Family, k.Rest = FamilyLedger, rest[len(ledgerDir):]
	case dir == actorsDir && n >= 3 && segs(1):
		k.Family, k.ID, k.Rest = FamilyActor, parts[1], rest[len(actorsDir)+len(parts[1])+1:]
	default:
		return bad("belongs to no key family")
	}
	return k, nil
}

// Parse takes apart a key of this agent, as the package-level Parse does,
// and also fails when the key belongs to another agent.
func (s Scope) Parse(key string) (Key, error) {
	if s.prefix == "" {
		return Key{}, errZeroScope
	}
	if !strings.HasPrefix(key, s.prefix) {
		return Key{}, fmt.Errorf("%w: key %q is not under %s", ErrMalformed, key, s.prefix)
	}
	return Parse(key)
}

// validSegment reports whether seg is something Segment returns.
func validSegment(seg string) bool {
	if IsDigest(seg) {
		return true
	}
	_, err := Unsegment(seg)
	return err == nil
}

// Redacted replaces a continuation token in keys returned by Redact.
const Redacted = "REDACTED"

// Redact returns key with a continuation token replaced by Redacted, for
// logs and errors: a token is a bearer credential for its session. Keys of
// other families are returned unchanged.
func Redact(key string) string {
	k, err := Parse(key)
	if err != nil || k.Family != FamilyContinuation {
		return key
	}
	return strings.TrimSuffix(key, k.ID) + Redacted
}
