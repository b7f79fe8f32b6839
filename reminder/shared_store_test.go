package reminder

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"agentkit/internal/testenv/pgtest"
	"agentkit/keys"
	"agentkit/kv"
	_ "agentkit/kv/pgkv"
)

// exactlyOnce runs two schedulers, with real time, over two handles on one
// shared store: 100 reminders, all due at once, both hosts know them all,
// each must fire exactly once.
func exactlyOnce(t *testing.T, a, b *kv.DB, agent string) {
	ctx := context.Background()
	rec := newRecorder()
	opts := func(db *kv.DB, host string) Options {
		return Options{Dir: t.TempDir(), Records: recsOf(t, db, agent), HostID: host, Fire: rec.fire,
			SyncInterval: 50 * time.Millisecond, MaxConcurrent: 8}
	}
	sa := open(t, opts(a, "a"))
	var ids []string
	due := time.Now()
	for i := range 100 {
		r, err := sa.Create(ctx, fmt.Sprintf("s%d", i%5), due, "m")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	sb := open(t, opts(b, "b")) // hydrates all 100 from the store
	if n := len(sb.List("")); n != 100 {
		t.Fatalf("b hydrated %d reminders, want 100", n)
	}
	stopA, stopB := running(t, sa), running(t, sb)

	scope, err := keys.Agent(agent)
	if err != nil {
		t.Fatal(err)
	}
	// Wait until every stored record is final: from then on no claim can
	// succeed, so no further Fire can happen.
	deadline := time.Now().Add(60 * time.Second)
	for {
		final := 0
		for r, err := range recsOf(t, a, agent).List(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			if r.State.Final() {
				final++
			}
		}
		if final == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s only %d of %d reminders are final", final, len(ids))
		}
		time.Sleep(20 * time.Millisecond) // polling for a condition, not asserting time
	}
	stopA()
	stopB()
	checkOnce(t, rec, ids)
	for _, id := range ids {
		key, _ := scope.Reminder(id)
		_ = a.Delete(ctx, key)
	}
}

func TestSharedMemStoreExactlyOnce(t *testing.T) {
	name := "mem://reminder-shared-" + randomSuffix()
	a, err := kv.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := kv.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, a, b, "helper")
}

func TestPostgresExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	u := pgtest.TableURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Two handles (two connection pools), as two hosts would have.
	a, err := kv.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := kv.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if !a.Capabilities().CAS {
		t.Fatalf("the PostgreSQL store has no CAS group: %s", a.Capabilities())
	}
	exactlyOnce(t, a, b, "reminder-test-"+randomSuffix())
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
