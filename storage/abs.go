package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/record"
)

// ABSample is one cumulative metric sample of one session in one
// experiment, stored after each completed or failed turn. Metrics (turns,
// failures, token usage, latency so far) belong to the A/B package; storage
// keeps them as a JSON document.
type ABSample struct {
	// Agent is the agent the session belongs to; AgentStore fills it in.
	Agent string `json:"agent"`
	// Experiment is the experiment's name (required).
	Experiment string `json:"experiment"`
	// Variant is the variant the session is enrolled in.
	Variant string `json:"variant"`
	// SessionID is the session's id (required).
	SessionID string `json:"sessionId"`
	// At is when the sample was taken (required); derived keys and
	// records keep it to the millisecond, in UTC.
	At time.Time `json:"at"`
	// Metrics is the cumulative metrics document (required).
	Metrics json.RawMessage `json:"metrics"`
}

// ABTable is a backend-native A/B table, given as Config.ABs. PutSample
// stores one sample; it is called after every turn of an enrolled session
// and must append, not rewrite a growing record. Methods are called
// concurrently.
//
// A table may also implement ABSnapshotter to keep the latest aggregate;
// otherwise the snapshot is stored over the core.
type ABTable interface {
	PutSample(ctx context.Context, s ABSample) error
}

// ABSnapshotter stores the latest A/B aggregate of an agent, so a host with
// no local sessions can serve the A/B figures. Last write wins.
type ABSnapshotter interface {
	// PutSnapshot replaces the agent's snapshot.
	PutSnapshot(ctx context.Context, agent string, snapshot json.RawMessage) error
	// GetSnapshot returns the agent's snapshot, or an error matching
	// kv.ErrNotFound when there is none.
	GetSnapshot(ctx context.Context, agent string) (json.RawMessage, error)
}

// ABs is one agent's A/B table. Derived over the core, each sample is a
// blind Put of its own key,
// agentkit/v1/{agent}/ab-samples/{experiment}/{sessionId}/{at}, and the
// snapshot lives at agentkit/v1/{agent}/ab-snapshot.
type ABs struct{ a *AgentStore }

// Mode says where samples go.
func (t *ABs) Mode() Mode { return t.a.b.absMode }

// PutSample stores one sample with the session mirror's semantics: a
// failure (of the store, or an invalid sample) is logged with its key,
// counted in Binding.DroppedMirrorWrites and dropped; the turn goes on.
func (t *ABs) PutSample(ctx context.Context, s ABSample) {
	s.Agent = t.a.Name()
	if err := checkSample(s); err != nil {
		t.a.b.drop(ctx, sampleLabel(t.a.keys, s), err)
		return
	}
	if err := t.a.b.abs.PutSample(ctx, s); err != nil {
		t.a.b.drop(ctx, sampleLabel(t.a.keys, s), err)
	}
}

// sampleLabel names a sample in logs: its key, or its fields when it has
// none.
func sampleLabel(k keys.Scope, s ABSample) string {
	if key, err := k.ABSample(s.Experiment, s.SessionID, s.At); err == nil {
		return key
	}
	return fmt.Sprintf("%sab-samples/ (experiment %q, session %q)", k.Prefix(), s.Experiment, s.SessionID)
}

func checkSample(s ABSample) error {
	switch {
	case s.Experiment == "":
		return errors.New("storage: the A/B sample has no Experiment")
	case s.SessionID == "":
		return errors.New("storage: the A/B sample has no SessionID")
	case s.At.IsZero():
		return errors.New("storage: the A/B sample has no At time")
	}
	return checkJSON("A/B sample's metrics", s.Metrics)
}

// PutSnapshot replaces the agent's A/B snapshot. Its error is returned.
func (t *ABs) PutSnapshot(ctx context.Context, snapshot json.RawMessage) error {
	if err := checkJSON("A/B snapshot", snapshot); err != nil {
		return err
	}
	return t.a.b.snaps.PutSnapshot(ctx, t.a.Name(), snapshot)
}

// GetSnapshot returns the agent's A/B snapshot, or an error matching
// kv.ErrNotFound when none was stored. Derived over a backend without Get,
// it fails with an error matching errors.ErrUnsupported.
func (t *ABs) GetSnapshot(ctx context.Context) (json.RawMessage, error) {
	if t.a.b.snapsMode == ModeDerived && !t.a.b.caps.Get {
		return nil, unsupported(t.a.b, "reading the A/B snapshot", "Get")
	}
	return t.a.b.snaps.GetSnapshot(ctx, t.a.Name())
}

// snapshotRecord is the stored form of a derived A/B snapshot.
type snapshotRecord struct {
	Agent    string          `json:"agent"`
	Snapshot json.RawMessage `json:"snapshot"`
}

// derivedABs stores samples and the snapshot over the core.
type derivedABs struct{ db *kv.DB }

// PutSample is one blind Put: never a read, never a rewrite of other keys.
func (d derivedABs) PutSample(ctx context.Context, s ABSample) error {
	k, err := keys.Agent(s.Agent)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	key, err := k.ABSample(s.Experiment, s.SessionID, s.At)
	if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	s.At = s.At.UTC().Truncate(time.Millisecond)
	data, err := record.Marshal(KindABSample, s)
	if err != nil {
		return err
	}
	return d.db.Put(ctx, key, data)
}

func (d derivedABs) PutSnapshot(ctx context.Context, agent string, snapshot json.RawMessage) error {
	key, err := snapshotKey(agent)
	if err != nil {
		return err
	}
	data, err := record.Marshal(KindABSnapshot, snapshotRecord{Agent: agent, Snapshot: snapshot})
	if err != nil {
		return err
	}
	return d.db.Put(ctx, key, data)
}

func (d derivedABs) GetSnapshot(ctx context.Context, agent string) (json.RawMessage, error) {
	key, err := snapshotKey(agent)
	if err != nil {
		return nil, err
	}
	data, err := d.db.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	var rec snapshotRecord
	if _, err := record.Unmarshal(KindABSnapshot, key, data, &rec); err != nil {
		return nil, err
	}
	return rec.Snapshot, nil
}

func snapshotKey(agent string) (string, error) {
	k, err := keys.Agent(agent)
	if err != nil {
		return "", fmt.Errorf("storage: %w", err)
	}
	return k.ABSnapshot()
}

var (
	_ ABTable       = derivedABs{}
	_ ABSnapshotter = derivedABs{}
)
