package storage

import (
	"encoding/json"
	"fmt"
	"strings"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// Kind is a kind of record this package writes, with the newest format
// version ("v") this build reads and writes of it. Every record follows
// the version rule of package record, which encodes and decodes them all.
type Kind = record.Kind

// The kinds of record, each written in one place of this package.
var (
	// KindSessionHead is sessions/{id}/head (sessions.go: Sessions.Commit,
	// Sessions.Delete). Version 2 carries the token's digest in place of
	// the plain token, which a version-1 reader would take for none;
	// version 3 is a head marked moved to the session ledger.
	KindSessionHead = record.NewKind("session head", 3)
	// KindSessionMeta is sessions/{id}/meta and the session-index entries
	// (sessions.go: Sessions.PutMeta, Sessions.PutIndex); version 2 as
	// the head's.
	KindSessionMeta = record.NewKind("session metadata", 2)
	// KindEventBatch is sessions/{id}/events/{batch} (batches.go:
	// Sessions.Commit through writeBatch). Version 2 is a batch stored in
	// parts, which a version-1 reader would take for an empty batch.
	KindEventBatch = record.NewKind("event batch", 2)
	// KindContinuation is continuations/{digest} (sessions.go:
	// Sessions.PutToken).
	KindContinuation = record.NewKind("continuation record", 1)
	// KindReminder is reminders/{id} (reminders.go: Reminders), also used
	// for the reminder package's local copies.
	KindReminder = record.NewKind("reminder", 1)
	// KindEvalRun is eval-runs/{runId} (evalpages.go: derivedEvals.PutRun
	// and update). Version 2 is a run whose case results are in pages.
	KindEvalRun = record.NewKind("eval run", 2)
	// KindEvalCasePage is eval-cases/{runId}/{pageId} (evalpages.go), one
	// page of a version 2 run's case results.
	KindEvalCasePage = record.NewKind("eval case page", 1)
	// KindABSample is ab-samples/… (abs.go: derivedABs.PutSample).
	KindABSample = record.NewKind("A/B sample", 1)
	// KindABSnapshot is ab-snapshot (abs.go: derivedABs.PutSnapshot;
	// update.go: ABs.UpdateSnapshot).
	KindABSnapshot = record.NewKind("A/B snapshot", 1)
	// KindHostKV is kv/{key} (hostkv.go: HostKV.Put).
	KindHostKV = record.NewKind("host KV record", 1)
)

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
