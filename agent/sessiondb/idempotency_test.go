package sessiondb

import (
	"context"
	"errors"
	"testing"

	"agentkit/keys"
)

// TestKeyedTurnsFollowTheEvents: the idempotency index is derived from
// turn.started events however they arrive (Record, Append, ImportMirrored,
// Adopt) and goes with them (Delete, and Adopt moving a lost turn aside).
func TestKeyedTurnsFollowTheEvents(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	started := func(id string, seq int64, key string) Record {
		data := `{"type":"turn.started","idempotency":{"route":"continue","key":"` + key + `","hash":"h-` + key + `"}}`
		return Record{SessionID: id, Seq: seq, At: t0, Type: "turn.started", Data: []byte(data)}
	}
	fill(t, db, "a", 2)
	m, _ := db.Get(ctx, "a")
	m.LastSeq = 3
	if err := db.Record(ctx, m, started("a", 3, "k1")); err != nil {
		t.Fatal(err)
	}
	// An imported session brings its keys.
	if _, err := db.ImportMirrored(ctx, Meta{ID: "b", CreatedAt: t0, UpdatedAt: t0, TokenDigest: keys.TokenDigest("tok-b"), LastSeq: 2}, []Record{
		started("b", 1, "k2"),
		{SessionID: "b", Seq: 2, At: t0, Type: "turn.finished", Data: []byte(`{"idempotency":{"route":"continue","key":"not-a-start"}}`)},
	}, MirrorState{MirroredSeq: 2}); err != nil {
		t.Fatal(err)
	}
	// Events that are not JSON, or carry no key, index nothing.
	if err := db.Append(ctx, Record{SessionID: "a", Seq: 4, At: t0, Type: "turn.started", Data: []byte("not json")}, Record{SessionID: "a", Seq: 5, At: t0, Type: "turn.started", Data: []byte(`{"idempotency":{"key":5}}`)}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]KeyedTurn{
		"k1": {Route: "continue", Key: "k1", SessionID: "a", Seq: 3, Hash: "h-k1"},
		"k2": {Route: "continue", Key: "k2", SessionID: "b", Seq: 1, Hash: "h-k2"},
	} {
		got, err := db.KeyedTurn(ctx, "continue", key)
		if err != nil || got != want {
			t.Errorf("KeyedTurn(%s) = %+v, %v; want %+v", key, got, err, want)
		}
	}
	for _, c := range [][2]string{{"start", "k1"}, {"continue", "not-a-start"}, {"continue", "5"}} {
		if _, err := db.KeyedTurn(ctx, c[0], c[1]); !errors.Is(err, ErrNotFound) {
			t.Errorf("KeyedTurn(%s, %s): %v; want ErrNotFound", c[0], c[1], err)
		}
	}
	// A turn that lost the session head is moved aside (forked) and the
	// store's turn takes its place: the lost turn's key goes, the
	// winner's comes.
	mb, _ := db.Get(ctx, "b")
	mb.LastSeq = 1
	if _, err := db.Adopt(ctx, mb, []Record{started("b", 1, "k-winner")}, MirrorState{MirroredSeq: 1}, "host-w", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.KeyedTurn(ctx, "continue", "k2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the key of a forked turn: %v; want ErrNotFound", err)
	}
	if got, err := db.KeyedTurn(ctx, "continue", "k-winner"); err != nil || got.SessionID != "b" || got.Seq != 1 {
		t.Errorf("the adopted turn's key: %+v, %v", got, err)
	}
	if err := db.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.KeyedTurn(ctx, "continue", "k1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the key of a deleted session: %v; want ErrNotFound", err)
	}
	if _, err := db.KeyedTurn(ctx, "continue", "k-winner"); err != nil {
		t.Errorf("another session's key after a delete: %v", err)
	}
}
