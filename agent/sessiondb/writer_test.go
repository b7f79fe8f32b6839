package sessiondb

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestWritesWaitingTogetherShareOneCommit holds the writer inside one
// write while others queue, then lets it go: the queued writes commit in
// one transaction, and the one that fails is rolled back alone.
func TestWritesWaitingTogetherShareOneCommit(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	fill(t, db, "a", 0)
	entered, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := db.Write(ctx, func(tx *Tx) error {
			close(entered)
			<-release
			return tx.Append(Record{SessionID: "a", Seq: 1, At: t0, Type: "e", Data: []byte(`{"n":1}`)})
		})
		if err != nil {
			t.Error(err)
		}
	}()
	<-entered
	before := db.Commits()
	const queued = 8
	errs := make([]error, queued)
	var queuedWG sync.WaitGroup
	for i := range queued {
		queuedWG.Add(1)
		go func() {
			defer queuedWG.Done()
			errs[i] = db.Write(ctx, func(tx *Tx) error {
				if err := tx.Append(Record{SessionID: "a", Seq: int64(100 + i), At: t0, Type: "e", Data: []byte(`{}`)}); err != nil {
					return err
				}
				if i == 3 {
					return errors.New("this write fails after writing")
				}
				return nil
			})
		}()
	}
	// Wait until every write is queued behind the held one.
	deadline := time.Now().Add(10 * time.Second)
	for len(db.w.reqs) < queued {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d writes queued", len(db.w.reqs), queued)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	queuedWG.Wait()
	for i, err := range errs {
		if (err != nil) != (i == 3) {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if got := db.Commits() - before; got != 2 {
		t.Errorf("%d commits for the held write and %d queued ones; want 2 (the queued ones together)", got, queued)
	}
	recs, err := db.After(ctx, "a", 99, 100)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, r := range recs {
		seqs = append(seqs, r.Seq)
	}
	if fmt.Sprint(seqs) != "[100 101 102 104 105 106 107]" {
		t.Errorf("events after the group: %v; want every queued write's but the failed one's (103)", seqs)
	}
}

// TestAFailedWriteAloneIsRolledBack: a write that fails alone in its
// transaction leaves nothing, and the next write works.
func TestAFailedWriteAloneIsRolledBack(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	fill(t, db, "a", 0)
	err := db.Write(ctx, func(tx *Tx) error {
		if err := tx.Append(Record{SessionID: "a", Seq: 1, At: t0, Type: "e", Data: []byte(`{}`)}); err != nil {
			return err
		}
		panic("boom")
	})
	if err == nil {
		t.Fatal("a write that panicked returned no error")
	}
	if recs, _ := db.After(ctx, "a", 0, 10); len(recs) != 0 {
		t.Errorf("the failed write left %d events", len(recs))
	}
	if err := db.Append(ctx, Record{SessionID: "a", Seq: 1, At: t0, Type: "e", Data: []byte(`{}`)}); err != nil {
		t.Errorf("the next write: %v", err)
	}
	// A duplicate sequence number fails, and says which event.
	err = db.Append(ctx, Record{SessionID: "a", Seq: 1, At: t0, Type: "e", Data: []byte(`{}`)})
	if err == nil || !hasPrefix(err) {
		t.Errorf("a duplicate event: %v; want a sessiondb error", err)
	}
}

// TestACanceledWriteDoesNotRun: a write whose context ended before it
// started is not run; after Close every write is ErrClosed.
func TestACanceledWriteDoesNotRun(t *testing.T) {
	db := openTest(t)
	fill(t, db, "a", 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := db.Write(ctx, func(*Tx) error { ran = true; return nil })
	if !errors.Is(err, context.Canceled) || ran {
		t.Errorf("a canceled write: ran %v, %v; want not run, context.Canceled", ran, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Put(context.Background(), Meta{ID: "b"}); !errors.Is(err, ErrClosed) {
		t.Errorf("a write after Close: %v; want ErrClosed", err)
	}
}
