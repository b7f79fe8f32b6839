package actor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/actor/mergepatch"
)

func TestLogsAppendReadLastAndPage(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{Synchronous: "normal"})
	a := actorOf(t, defineStatus(t, h), "a")
	msgs, evs := a.Messages(), a.Events()
	for i := 1; i <= 25; i++ {
		rec, err := msgs.Append(ctx, "user", json.RawMessage(fmt.Sprintf(`{"n": %d}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Seq != int64(i) || rec.Type != "user" || string(rec.Data) != fmt.Sprintf(`{"n":%d}`, i) || rec.At.IsZero() {
			t.Fatalf("Append #%d = %+v", i, rec)
		}
	}
	if rec, err := evs.Append(ctx, "progress", nil); err != nil || rec.Seq != 1 || string(rec.Data) != "null" {
		t.Fatalf("the first event = %+v, %v; events number on their own", rec, err)
	}
	last, err := msgs.Last(ctx, 5)
	if err != nil || len(last) != 5 || last[0].Seq != 21 || last[4].Seq != 25 {
		t.Fatalf("Last(5) = %v, %v; want seq 21..25 oldest first", last, err)
	}
	if last, _ := msgs.Last(ctx, 100); len(last) != 25 || last[0].Seq != 1 {
		t.Fatalf("Last(100) of 25 = %d records", len(last))
	}
	var seen []int64
	for cursor, pages := int64(0), 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("still paging after %d pages of 10 over 25 records: the cursor does not advance (%v)", pages, seen)
		}
		page, err := msgs.After(ctx, cursor, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		if len(page) > 10 {
			t.Fatalf("a page of %d records, limit 10", len(page))
		}
		for _, r := range page {
			seen = append(seen, r.Seq)
		}
		cursor = page[len(page)-1].Seq
	}
	if len(seen) != 25 || seen[0] != 1 || seen[24] != 25 {
		t.Fatalf("paging saw %v", seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] != seen[i-1]+1 {
			t.Fatalf("paging skipped or repeated: %v", seen)
		}
	}
	if evs2, _ := evs.Last(ctx, 10); len(evs2) != 1 {
		t.Errorf("events hold %d records, want 1 (messages are a separate log)", len(evs2))
	}
	var se *mergepatch.SyntaxError
	if _, err := msgs.Append(ctx, "user", json.RawMessage(`{"n":`)); !errors.As(err, &se) {
		t.Errorf("Append of invalid JSON = %v", err)
	}
}

func TestLogPagesAreBounded(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{Synchronous: "normal"})
	a := actorOf(t, defineStatus(t, h), "a")
	e, err := a.acquireWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1500)
		INSERT INTO events (seq, at, type, data) SELECT i, 0, 't', 'null' FROM n`); err != nil {
		t.Fatal(err)
	}
	h.pool.release(e)
	for _, limit := range []int{0, -1, 5000} {
		page, err := a.Events().After(ctx, 0, limit)
		if err != nil || len(page) != MaxPage {
			t.Errorf("After(limit %d) = %d records, %v; want MaxPage", limit, len(page), err)
		}
	}
	if last, _ := a.Events().Last(ctx, 5000); len(last) != MaxPage || last[len(last)-1].Seq != 1500 {
		t.Errorf("Last(5000) = %d records", len(last))
	}
}

// viewSource gives one actor's logs from elsewhere.
type viewSource struct{ msgs, evs Log }

func (v viewSource) History(class, id string) (Log, Log, bool) {
	if id == "session-1" {
		return v.msgs, v.evs, true
	}
	return nil, nil, false
}

// memLog is a Log in memory, standing for a session's events.
type memLog struct {
	mu   sync.Mutex
	recs []Record
}

func (m *memLog) Append(ctx context.Context, typ string, data json.RawMessage) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := Record{Seq: int64(len(m.recs) + 1), At: time.Now(), Type: typ, Data: data}
	m.recs = append(m.recs, r)
	return r, nil
}

func (m *memLog) Last(ctx context.Context, n int) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recs[max(0, len(m.recs)-n):], nil
}

func (m *memLog) After(ctx context.Context, after int64, limit int) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recs[min(int(after), len(m.recs)):], nil
}

func TestHistorySourceSuppliesLogs(t *testing.T) {
	ctx := context.Background()
	src := viewSource{msgs: &memLog{}, evs: &memLog{}}
	h := openHost(t, Options{History: src})
	c := defineStatus(t, h)
	s := actorOf(t, c, "session-1")
	if _, err := s.Messages().Append(ctx, "user", json.RawMessage(`"hi"`)); err != nil {
		t.Fatal(err)
	}
	if got, _ := src.msgs.Last(ctx, 10); len(got) != 1 {
		t.Fatalf("the source holds %d messages, want 1", len(got))
	}
	if s.HasDatabase() {
		t.Error("a view's append created the actor's database")
	}
	if ev, _ := s.Events().Last(ctx, 10); len(ev) != 0 {
		t.Error("events of the view are not the source's")
	}
	other := actorOf(t, c, "other")
	if _, err := other.Messages().Append(ctx, "user", json.RawMessage(`"x"`)); err != nil {
		t.Fatal(err)
	}
	if !other.HasDatabase() {
		t.Error("an actor the source declines keeps its logs in its database, but none was made")
	}
}

// TestPoolBoundsOpenDatabases: however many actors are used, at most
// MaxOpen databases (and their file descriptors) are open, and every
// actor's data stays reachable.
func TestPoolBoundsOpenDatabases(t *testing.T) {
	ctx := context.Background()
	const maxOpen, actors = 3, 40
	h := openHost(t, Options{MaxOpen: maxOpen, Synchronous: "normal"})
	c := defineStatus(t, h)
	fds0 := openFDs(t)
	for i := range actors {
		a := actorOf(t, c, fmt.Sprint("a", i))
		if _, err := a.SetState(ctx, fmt.Appendf(nil, `{"at":%d}`, i)); err != nil {
			t.Fatal(err)
		}
		if n := h.OpenDatabases(); n > maxOpen {
			t.Fatalf("%d databases open, MaxOpen %d", n, maxOpen)
		}
	}
	if grew := openFDs(t) - fds0; grew > maxOpen*3+2 {
		t.Errorf("%d more file descriptors after using %d actors with MaxOpen %d", grew, actors, maxOpen)
	}
	for i := range actors {
		st, err := actorOf(t, c, fmt.Sprint("a", i)).State(ctx)
		if err != nil || st.At != int64(i) {
			t.Fatalf("actor %d: %+v, %v", i, st, err)
		}
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting file descriptors: %v", err)
	}
	return len(ents)
}

// TestPoolWaitsForAPlace: when every place is in use, a caller waits for
// one to be released instead of opening more.
func TestPoolWaitsForAPlace(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{MaxOpen: 1})
	c := defineStatus(t, h)
	a, b := actorOf(t, c, "a"), actorOf(t, c, "b")
	e, err := a.acquireWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.SetState(short, []byte(`{}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a write with the only place in use = %v; want it to wait until its deadline", err)
	}
	done := make(chan error, 1)
	go func() { _, err := b.SetState(ctx, []byte(`{"status":"b"}`)); done <- err }()
	h.pool.release(e)
	if err := <-done; err != nil {
		t.Fatalf("after the place was released: %v", err)
	}
	if n := h.OpenDatabases(); n != 1 {
		t.Errorf("%d databases open, MaxOpen 1", n)
	}
}

// TestIdleDatabasesClose: a database unused for IdleTimeout is closed.
func TestIdleDatabasesClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		h, err := Open(Options{Dir: filepath.Join(t.TempDir(), "actors"), IdleTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		c := defineStatus(t, h)
		if _, err := actorOf(t, c, "a").SetState(ctx, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Second)
		if _, err := actorOf(t, c, "b").SetState(ctx, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := h.OpenDatabases(); n != 2 {
			t.Fatalf("%d databases open, want both", n)
		}
		time.Sleep(30 * time.Second) // a idle 80s, b 30s
		synctest.Wait()
		if n := h.OpenDatabases(); n != 1 {
			t.Fatalf("%d databases open after a was idle past the timeout, want 1", n)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := h.OpenDatabases(); n != 0 {
			t.Fatalf("%d databases open after both were idle, want 0", n)
		}
		if st, err := actorOf(t, c, "a").State(ctx); err != nil || st.Status != "idle" {
			t.Fatalf("reopening after the idle close: %+v, %v", st, err)
		}
	})
}
