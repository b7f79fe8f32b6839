package storage

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"agentkit/keys"
	"agentkit/kv"
)

// Kind is a kind of record this package writes, with the newest format
// version ("v") this build reads and writes for it.
//
// The format version rule, the same for every kind: every stored record is
// a JSON object whose "v" field is its format version, an integer from 1.
// A writer writes the lowest version that describes the record exactly, so
// an older build keeps reading every record it can read correctly. A reader
// accepts every version from 1 up to its kind's Version and refuses a
// higher one with an error matching ErrNewerFormat that says to upgrade,
// never misreading it; a record without "v" is ErrBadRecord. A version is
// raised only when an older reader would misread the record (a field it
// ignores changes the meaning); fields an older reader may safely ignore are
// added without raising it.
type Kind struct {
	name    string
	version int
}

// The kinds of record, each written in one place of this package.
var (
	// KindSessionHead is sessions/{id}/head (sessions.go: Sessions.Commit,
	// Sessions.Delete).
	KindSessionHead = Kind{"session head", 1}
	// KindSessionMeta is sessions/{id}/meta and the session-index entries
	// (sessions.go: Sessions.PutMeta, Sessions.PutIndex).
	KindSessionMeta = Kind{"session metadata", 1}
	// KindEventBatch is sessions/{id}/events/{batch} (batches.go:
	// Sessions.Commit through writeBatch). Version 2 is a batch stored in
	// parts, which a version-1 reader would take for an empty batch.
	KindEventBatch = Kind{"event batch", 2}
	// KindContinuation is continuations/{token} (sessions.go:
	// Sessions.PutToken).
	KindContinuation = Kind{"continuation record", 1}
	// KindReminder is reminders/{id} (reminders.go: Reminders), also used
	// for the reminder package's local copies.
	KindReminder = Kind{"reminder", 1}
	// KindEvalRun is eval-runs/{runId} (evals.go: derivedEvals.PutRun;
	// update.go: EvalRuns.Update).
	KindEvalRun = Kind{"eval run", 1}
	// KindABSample is ab-samples/… (abs.go: derivedABs.PutSample).
	KindABSample = Kind{"A/B sample", 1}
	// KindABSnapshot is ab-snapshot (abs.go: derivedABs.PutSnapshot;
	// update.go: ABs.UpdateSnapshot).
	KindABSnapshot = Kind{"A/B snapshot", 1}
	// KindHostKV is kv/{key} (hostkv.go: HostKV.Put).
	KindHostKV = Kind{"host KV record", 1}
)

// String returns the kind's name.
func (k Kind) String() string { return k.name }

// Version returns the newest format version of the kind this build reads
// and writes.
func (k Kind) Version() int { return k.version }

// versioned is implemented by records that need a format version above 1.
type versioned interface{ formatVersion() int }

// MarshalRecord encodes rec as a record of kind k: rec's JSON object with
// the format version "v" in front. rec must encode as a JSON object and
// have no "v" field of its own; the version is 1 unless the record needs a
// newer one. Packages that keep a local copy of a stored record (the
// reminder scheduler) use it so that both copies share one codec.
func MarshalRecord(k Kind, rec any) ([]byte, error) {
	v := 1
	if r, ok := rec.(versioned); ok {
		v = r.formatVersion()
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("storage: encoding the %s: %w", k, err)
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("storage: encoding the %s: it is not a JSON object", k)
	}
	var b bytes.Buffer
	b.Grow(len(body) + 8)
	fmt.Fprintf(&b, `{"v":%d`, v)
	if len(body) > 2 {
		b.WriteByte(',')
	}
	b.Write(body[1:])
	return b.Bytes(), nil
}

// UnmarshalRecord checks the format version of a record of kind k (read
// from where: its key, or a file) and decodes it into rec. A version newer
// than k.Version is an error matching ErrNewerFormat; anything that is not
// a record of this package is ErrBadRecord. Both errors name where and the
// kind. It returns the record's version.
func UnmarshalRecord(k Kind, where string, data []byte, rec any) (int, error) {
	v, ok := leadingVersion(data)
	if !ok {
		var head struct {
			V *int `json:"v"`
		}
		if err := json.Unmarshal(data, &head); err != nil {
			return 0, fmt.Errorf("%w: the %s at %q is not a JSON object (%v); it was not written by agentkit, or it is damaged", ErrBadRecord, k, keys.Redact(where), err)
		}
		if head.V == nil {
			return 0, fmt.Errorf(`%w: the %s at %q has no format version ("v"); it was not written by agentkit`, ErrBadRecord, k, keys.Redact(where))
		}
		v = *head.V
	}
	switch {
	case v > k.version:
		return 0, fmt.Errorf("%w: the %s at %q has format version %d, and this build reads versions up to %d; upgrade agentkit on this host", ErrNewerFormat, k, keys.Redact(where), v, k.version)
	case v < 1:
		return 0, fmt.Errorf("%w: the %s at %q has format version %d; versions start at 1", ErrBadRecord, k, keys.Redact(where), v)
	}
	if err := json.Unmarshal(data, rec); err != nil {
		return 0, fmt.Errorf("%w: the %s at %q does not decode: %v", ErrBadRecord, k, keys.Redact(where), err)
	}
	return v, nil
}

// leadingVersion reads the format version of a record as MarshalRecord
// writes it, `{"v":N,` or `{"v":N}` at the start, without decoding the
// rest; ok is false for anything else (the caller then decodes it).
func leadingVersion(data []byte) (int, bool) {
	const prefix = `{"v":`
	if len(data) < len(prefix)+2 || string(data[:len(prefix)]) != prefix {
		return 0, false
	}
	v, i := 0, len(prefix)
	for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
		if i-len(prefix) >= 9 {
			return 0, false
		}
		v = v*10 + int(data[i]-'0')
	}
	if i == len(prefix) || i >= len(data) || (data[i] != ',' && data[i] != '}') {
		return 0, false
	}
	return v, true
}

// checkJSON rejects an empty or invalid JSON document before it is stored.
func checkJSON(what string, doc json.RawMessage) error {
	if len(doc) == 0 {
		return fmt.Errorf("storage: the %s is empty; pass a JSON document", what)
	}
	if !json.Valid(doc) {
		return fmt.Errorf("storage: the %s is not valid JSON", what)
	}
	return nil
}

// redact hides a continuation token in the key of a *kv.Error (a token is
// a bearer credential for its session), so the errors this package returns
// can be logged. Call it on errors straight from the store, before adding
// context.
func redact(err error) error {
	ke, ok := err.(*kv.Error)
	if !ok {
		return err
	}
	if shown := keys.Redact(ke.Key); shown != ke.Key {
		c := *ke
		c.Key = shown
		if ke.Err != nil {
			c.Err = redactedErr{msg: strings.ReplaceAll(ke.Err.Error(), ke.Key, shown), err: ke.Err}
		}
		return &c
	}
	return err
}

// redactedErr is an error whose message was redacted; errors.Is and
// errors.As still see the original.
type redactedErr struct {
	msg string
	err error
}

func (e redactedErr) Error() string { return e.msg }
func (e redactedErr) Unwrap() error { return e.err }
