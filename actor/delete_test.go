package actor

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// Delete removes the actor's folder, both databases, its schedule index
// entry and its key-value records with the marker; the actor then reads as
// new, and other actors keep theirs.
func TestDeleteRemovesEverythingOfTheActor(t *testing.T) {
	ctx := context.Background()
	store, err := kv.New("mem", memkv.New())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "actors")
	h, c := legacyHost(t, store, dir, "host-a")
	seedLegacy(t, store, "gone", 3, time.Now().Add(time.Hour))
	seedLegacy(t, store, "kept", 3, time.Now().Add(time.Hour))
	gone, kept := actorOf(t, c, "gone"), actorOf(t, c, "kept")
	if _, err := gone.SetState(ctx, []byte(`{"n":1}`)); err != nil { // migrates
		t.Fatal(err)
	}
	if _, err := kept.SetState(ctx, []byte(`{"n":2}`)); err != nil {
		t.Fatal(err)
	}
	db, err := gone.SQL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (x)`); err != nil {
		t.Fatal(err)
	}
	// An unmigrated legacy actor is deleted from the store too.
	seedLegacy(t, store, "never-written", 1, time.Now().Add(time.Hour))

	for _, a := range []*Actor[json.RawMessage]{gone, actorOf(t, c, "never-written")} {
		if err := a.Delete(ctx); err != nil {
			t.Fatalf("Delete %s: %v", a.ID(), err)
		}
		if got := storeKeys(t, store, legacyKey(t, a.ID(), "")); len(got) != 0 {
			t.Fatalf("after deleting %s, the store still has %q", a.ID(), got)
		}
		if st, err := a.State(ctx); err != nil || string(st) != `{}` {
			t.Fatalf("%s after the delete: %s, %v; want the initial state", a.ID(), st, err)
		}
	}
	for _, f := range files(t, dir) {
		if filepath.Dir(f) == filepath.Join("session", "gone") {
			t.Fatalf("the deleted actor's %s is still there", f)
		}
	}
	if _, err := db.ExecContext(ctx, `SELECT 1`); err == nil {
		t.Fatal("the deleted actor's SQL database is still open")
	}
	due, err := h.indexFirst(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range due {
		ids = append(ids, d.id)
	}
	if !slices.Equal(ids, []string{"kept"}) {
		t.Fatalf("schedule index holds %q; want only kept", ids)
	}
	if st, err := kept.State(ctx); err != nil || string(st) != `{"status":"waiting","lastReply":"old","at":12345678901234567890,"n":2}` {
		t.Fatalf("the other actor: %s, %v", st, err)
	}
	// Writing again makes a fresh actor.
	if st, err := gone.SetState(ctx, []byte(`{"again":true}`)); err != nil || string(st) != `{"again":true}` {
		t.Fatalf("write after the delete: %s, %v", st, err)
	}
}

// Delete waits for a call that holds the actor's database (or for its
// context to end), and a call made meanwhile opens the actor afresh once
// the delete is done.
func TestDeleteWaitsForCallsInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		h := openHost(t, Options{})
		c := defineStatus(t, h)
		a := actorOf(t, c, "busy")
		if _, err := a.SetState(ctx, []byte(`{"status":"x"}`)); err != nil {
			t.Fatal(err)
		}
		e, err := a.acquireWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Delete(ctx) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Delete returned (%v) while a call held the database", err)
		default:
		}
		if !a.HasDatabase() {
			t.Fatal("the database went away while a call held it")
		}
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := a.Delete(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a second Delete while the database is held: %v; want it to wait until its context ends", err)
		}
		h.pool.release(e)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if a.HasDatabase() {
			t.Fatal("the database is still there after the delete")
		}
		if st, err := a.State(ctx); err != nil || st.Status != "idle" {
			t.Fatalf("state after the delete: %+v, %v", st, err)
		}
		if n := h.OpenDatabases(); n != 0 {
			t.Fatalf("%d databases open after the delete and a read", n)
		}
	})
}
