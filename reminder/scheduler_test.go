package reminder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/keys"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/record"
	"agentkit/storage"
)

// writerFunc adapts a function to io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// recorder is a Fire callback that counts calls per reminder.
type recorder struct {
	mu    sync.Mutex
	calls map[string]int
	seen  []Reminder
	fail  func(r Reminder) error // optional
}

func newRecorder() *recorder { return &recorder{calls: map[string]int{}} }

func (rec *recorder) fire(ctx context.Context, r Reminder) error {
	rec.mu.Lock()
	rec.calls[r.ID]++
	rec.seen = append(rec.seen, r)
	fail := rec.fail
	rec.mu.Unlock()
	if fail != nil {
		return fail(r)
	}
	return nil
}

func (rec *recorder) count(id string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.calls[id]
}

func (rec *recorder) total() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, c := range rec.calls {
		n += c
	}
	return n
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func open(t *testing.T, opts Options) *Scheduler {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// running starts Run and returns a stop function that waits for it.
func running(t *testing.T, s *Scheduler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop) // also when the test fails early
	return stop
}

func TestFiresOnceAtItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		s := open(t, Options{Dir: t.TempDir(), Fire: rec.fire})
		stop := running(t, s)
		defer stop()

		start := time.Now()
		r, err := s.Create(context.Background(), "sess-1", start.Add(time.Hour), "check the build")
		if err != nil {
			t.Fatal(err)
		}
		if r.State != StatePending || r.SessionID != "sess-1" || !r.At.Equal(start.Add(time.Hour)) || !strings.HasPrefix(r.ID, "rem_") {
			t.Fatalf("created %+v", r)
		}
		time.Sleep(time.Hour - time.Second)
		synctest.Wait()
		if n := rec.count(r.ID); n != 0 {
			t.Fatalf("fired %d times a second before its time", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := rec.count(r.ID); n != 1 {
			t.Fatalf("fired %d times at its time, want 1", n)
		}
		got := rec.seen[0]
		if got.SessionID != "sess-1" || got.Message != "check the build" || got.State != StateClaimed || got.Attempts != 1 {
			t.Errorf("Fire got %+v", got)
		}
		after, _ := s.Get(r.ID)
		if after.State != StateFired || !after.FiredAt.Equal(start.Add(time.Hour)) {
			t.Errorf("after firing: %+v", after)
		}
		time.Sleep(48 * time.Hour)
		synctest.Wait()
		if n := rec.count(r.ID); n != 1 {
			t.Errorf("fired %d times in all, want 1", n)
		}
	})
}

func TestPastTimeFiresAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		s := open(t, Options{Dir: t.TempDir(), Fire: rec.fire})
		r, err := s.Create(context.Background(), "s", time.Now().Add(-time.Hour), "overdue")
		if err != nil {
			t.Fatal(err)
		}
		stop := running(t, s)
		defer stop()
		synctest.Wait()
		if rec.count(r.ID) != 1 {
			t.Errorf("an overdue reminder fired %d times", rec.count(r.ID))
		}
	})
}

func TestFiresLateAfterRestart(t *testing.T) {
	for _, name := range []string{"same folder", "new host from the store"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memkv.New()
				dir := t.TempDir()
				rec := newRecorder()
				s := open(t, Options{Dir: dir, Records: recs(t, store), Fire: rec.fire})
				stop := running(t, s)
				r, err := s.Create(context.Background(), "s", time.Now().Add(time.Hour), "wake up")
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(30 * time.Minute)
				stop() // the host goes down before the reminder is due

				time.Sleep(5 * time.Hour)
				synctest.Wait()
				if rec.total() != 0 {
					t.Fatalf("fired while no scheduler ran")
				}
				if name != "same folder" {
					dir = t.TempDir()
				}
				s2 := open(t, Options{Dir: dir, Records: recs(t, store), Fire: rec.fire})
				if got, ok := s2.Get(r.ID); !ok || got.State != StatePending {
					t.Fatalf("after restart: %+v, %v; want the pending reminder", got, ok)
				}
				stop2 := running(t, s2)
				defer stop2()
				synctest.Wait()
				if n := rec.count(r.ID); n != 1 {
					t.Fatalf("fired %d times after the restart, want 1 (late)", n)
				}
				got, _ := s2.Get(r.ID)
				if got.State != StateFired || got.FiredAt.Sub(got.At) < 4*time.Hour {
					t.Errorf("after firing: %+v", got)
				}
				if stored := storedRecord(t, store, r.ID); stored.State != StateFired {
					t.Errorf("stored state %s, want fired", stored.State)
				}
			})
		})
	}
}

// recs returns the reminder records of the agent "helper" in store.
func recs(t *testing.T, store *kv.DB) *storage.Reminders {
	t.Helper()
	return recsOf(t, store, "helper")
}

// recsOf returns the reminder records of an agent in store.
func recsOf(t *testing.T, store *kv.DB, agent string) *storage.Reminders {
	t.Helper()
	b, err := storage.Define(storage.Config{Backend: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := b.Agent(agent)
	if err != nil {
		t.Fatal(err)
	}
	return a.Reminders()
}

func storedRecord(t *testing.T, store *kv.DB, id string) Reminder {
	t.Helper()
	r, _, err := recs(t, store).Read(context.Background(), id)
	if err != nil {
		t.Fatalf("stored record of %s: %v", id, err)
	}
	return r
}

func putStored(t *testing.T, store *kv.DB, r Reminder) {
	t.Helper()
	if err := recs(t, store).Put(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

func TestDeadHostClaimReclaimedAfterLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		now := time.Now()
		// A host claimed this reminder and died before recording the outcome.
		putStored(t, store, Reminder{
			ID: "rem_dead", SessionID: "s", At: now.Add(-time.Minute), Message: "m",
			State: StateClaimed, ClaimedBy: "dead-host", ClaimedAt: now, Attempts: 1, Rev: 2,
			CreatedAt: now.Add(-time.Hour),
		})
		rec := newRecorder()
		s := open(t, Options{Dir: t.TempDir(), Records: recs(t, store), Fire: rec.fire, Lease: 10 * time.Minute})
		stop := running(t, s)
		defer stop()
		time.Sleep(10*time.Minute - time.Second)
		synctest.Wait()
		if rec.count("rem_dead") != 0 {
			t.Fatal("reclaimed before the lease ran out")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := rec.count("rem_dead"); n != 1 {
			t.Fatalf("fired %d times after the lease, want 1", n)
		}
		got := storedRecord(t, store, "rem_dead")
		if got.State != StateFired || got.ClaimedBy != s.HostID() || got.Attempts != 2 {
			t.Errorf("stored after reclaim: %+v", got)
		}
	})
}

func TestLongFireKeepsItsClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		rec := newRecorder()
		rec.fail = func(Reminder) error {
			time.Sleep(17 * time.Minute) // a long turn: over three leases
			return nil
		}
		opts := Options{Records: recs(t, store), Fire: rec.fire, Lease: 5 * time.Minute, SyncInterval: time.Minute}
		opts.Dir, opts.HostID = t.TempDir(), "a"
		a := open(t, opts)
		opts.Dir, opts.HostID = t.TempDir(), "b"
		b := open(t, opts)
		r, err := a.Create(context.Background(), "s", time.Now().Add(time.Minute), "slow")
		if err != nil {
			t.Fatal(err)
		}
		stopA, stopB := running(t, a), running(t, b)
		time.Sleep(time.Hour)
		synctest.Wait()
		stopA()
		stopB()
		if n := rec.count(r.ID); n != 1 {
			t.Errorf("a Fire lasting three leases ran %d times, want 1 (the claim is renewed)", n)
		}
		if got := storedRecord(t, store, r.ID); got.State != StateFired || got.Rev < 6 {
			t.Errorf("stored: %+v; want fired after several renewals", got)
		}
	})
}

func TestTwoSchedulersFireEachOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		name := "mem://reminder-two-schedulers-" + randomSuffix()
		db, err := kv.Open(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		db2, err := kv.Open(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		a := open(t, Options{Dir: t.TempDir(), Records: recs(t, db), Fire: rec.fire, HostID: "a", SyncInterval: 10 * time.Second})
		b := open(t, Options{Dir: t.TempDir(), Records: recs(t, db2), Fire: rec.fire, HostID: "b", SyncInterval: 10 * time.Second})
		stopA, stopB := running(t, a), running(t, b)
		due := time.Now().Add(time.Minute)
		var ids []string
		for i := range 100 {
			s := a
			if i%2 == 1 {
				s = b
			}
			r, err := s.Create(context.Background(), fmt.Sprintf("s%d", i%7), due.Add(time.Duration(i%3)*time.Second), "m")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.ID)
		}
		time.Sleep(30 * time.Second) // both hosts hydrate every reminder
		synctest.Wait()
		if len(a.List("")) != 100 || len(b.List("")) != 100 {
			t.Errorf("before the due time: a knows %d, b knows %d; want 100 each", len(a.List("")), len(b.List("")))
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		stopA()
		stopB()
		checkOnce(t, rec, ids)
		for _, id := range ids {
			if got := storedRecord(t, db, id); got.State != StateFired {
				t.Errorf("%s stored as %s", id, got.State)
			}
		}
	})
}

func checkOnce(t *testing.T, rec *recorder, ids []string) {
	t.Helper()
	hosts := map[string]int{}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, id := range ids {
		if n := rec.calls[id]; n != 1 {
			t.Errorf("reminder %s fired %d times, want 1", id, n)
		}
	}
	if len(rec.calls) != len(ids) {
		t.Errorf("Fire saw %d reminders, want %d", len(rec.calls), len(ids))
	}
	for _, r := range rec.seen {
		hosts[r.ClaimedBy]++
	}
	t.Logf("fires per host: %v", hosts)
}

func TestDeleteCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		rec := newRecorder()
		a := open(t, Options{Dir: t.TempDir(), Records: recs(t, store), Fire: rec.fire, HostID: "a"})
		b := open(t, Options{Dir: t.TempDir(), Records: recs(t, store), Fire: rec.fire, HostID: "b"})
		stopA, stopB := running(t, a), running(t, b)
		defer stopA()
		defer stopB()
		r1, _ := a.Create(context.Background(), "s", time.Now().Add(time.Hour), "one")
		r2, _ := a.Create(context.Background(), "s", time.Now().Add(time.Hour), "two")
		time.Sleep(2 * time.Minute) // b hydrates both
		synctest.Wait()
		if _, ok := b.Get(r1.ID); !ok {
			t.Fatal("b did not hydrate the reminder")
		}
		if err := a.Delete(context.Background(), r1.ID); err != nil {
			t.Fatal(err)
		}
		// Deleted on a, still listed on b until its next sync; b must not
		// fire it either way.
		if err := b.Delete(context.Background(), r2.ID); err != nil {
			t.Fatal(err)
		}
		if _, ok := a.Get(r1.ID); ok {
			t.Error("a still lists the reminder it deleted")
		}
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if rec.total() != 0 {
			t.Errorf("deleted reminders fired: %v", rec.calls)
		}
		if len(a.List("")) != 0 || len(b.List("")) != 0 {
			t.Errorf("after deletes: a lists %v, b lists %v", a.List(""), b.List(""))
		}
		if err := a.Delete(context.Background(), "rem_unknown"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Delete(unknown) = %v, want ErrNotFound", err)
		}
		local := open(t, Options{Dir: t.TempDir(), Fire: rec.fire})
		if err := local.Delete(context.Background(), "rem_unknown"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Delete(unknown) without a store = %v, want ErrNotFound", err)
		}
	})
}

func TestListAndForSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := open(t, Options{Dir: t.TempDir(), Fire: newRecorder().fire})
		now := time.Now()
		ctx := context.Background()
		late, _ := s.Create(ctx, "x", now.Add(3*time.Hour), "late")
		early, _ := s.Create(ctx, "x", now.Add(time.Hour), "early")
		id, err := s.ForSession("y").Schedule(ctx, now.Add(2*time.Hour), "via tool")
		if err != nil {
			t.Fatal(err)
		}
		all := s.List("")
		if len(all) != 3 || all[0].ID != early.ID || all[1].ID != id || all[2].ID != late.ID {
			t.Errorf("List(all) = %v", all)
		}
		if x := s.List("x"); len(x) != 2 || x[0].ID != early.ID || x[1].ID != late.ID {
			t.Errorf("List(x) = %v", x)
		}
		if y := s.List("y"); len(y) != 1 || y[0].SessionID != "y" || y[0].Message != "via tool" {
			t.Errorf("List(y) = %v", y)
		}
		if z := s.List("z"); len(z) != 0 {
			t.Errorf("List(z) = %v", z)
		}
	})
}

func TestCreateValidation(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), Fire: newRecorder().fire})
	ctx := context.Background()
	now := time.Now()
	for _, c := range []struct {
		session, msg string
		at           time.Time
		want         string
	}{
		{"", "m", now, "session id"},
		{"s", "", now, "message is empty"},
		{"s", "m", time.Time{}, "time is missing"},
		{"s", strings.Repeat("x", MaxMessageBytes+1), now, "limit"},
		{"s", "bad \xff", now, "UTF-8"},
	} {
		_, err := s.Create(ctx, c.session, c.at, c.msg)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Create(%q, %v, %.10q) = %v, want ErrInvalid about %s", c.session, c.at, c.msg, err, c.want)
		}
	}
	if len(s.List("")) != 0 {
		t.Errorf("invalid creates left reminders behind")
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Open(ctx, Options{Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "Fire") {
		t.Errorf("Open without Fire: %v", err)
	}
	fire := newRecorder().fire
	if _, err := Open(ctx, Options{Fire: fire}); err == nil || !strings.Contains(err.Error(), "Dir") {
		t.Errorf("Open without Dir: %v", err)
	}
	mem := memkv.NewStore()
	mixed, err := kv.New("mixed", kv.Funcs{
		Put: mem.Put, Get: mem.Get, Delete: mem.Delete, List: mem.List,
		CAS: kv.CASFuncs{GetWithVersion: mem.GetWithVersion, PutIfAbsent: mem.PutIfAbsent,
			PutIfVersion: mem.PutIfVersion, ListKeys: mem.ListKeys, ProcessLocal: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, Options{Dir: t.TempDir(), Fire: fire, Records: recs(t, mixed)}); err == nil || !strings.Contains(err.Error(), "in-memory compare-and-set") {
		t.Errorf("Open with a process-local CAS beside a durable store: %v", err)
	}
	synctest.Test(t, func(t *testing.T) {
		s := open(t, Options{Dir: t.TempDir(), Fire: fire})
		stop := running(t, s)
		defer stop()
		synctest.Wait() // the first Run is waiting
		if err := s.Run(ctx); err == nil {
			t.Errorf("a second Run started")
		}
	})
}

func TestRetriesThenFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := newRecorder()
		rec.fail = func(r Reminder) error {
			if r.Message == "flaky" && r.Attempts == 3 {
				return nil
			}
			return fmt.Errorf("session %s is gone", r.SessionID)
		}
		s := open(t, Options{Dir: t.TempDir(), Fire: rec.fire, RetryDelay: time.Minute, MaxAttempts: 3})
		stop := running(t, s)
		defer stop()
		start := time.Now()
		flaky, _ := s.Create(context.Background(), "s", start, "flaky")
		broken, _ := s.Create(context.Background(), "s", start, "broken")
		synctest.Wait()
		if rec.count(flaky.ID) != 1 || rec.count(broken.ID) != 1 {
			t.Fatalf("first attempts: %v", rec.calls)
		}
		got, _ := s.Get(broken.ID)
		if got.State != StatePending || !got.RetryAt.Equal(start.Add(time.Minute)) || !strings.Contains(got.LastError, "is gone") {
			t.Errorf("after one failure: %+v", got)
		}
		time.Sleep(time.Minute) // second attempt; the next waits 2 minutes
		synctest.Wait()
		if rec.count(broken.ID) != 2 {
			t.Fatalf("after a minute: %d attempts", rec.count(broken.ID))
		}
		time.Sleep(2*time.Minute - time.Second)
		synctest.Wait()
		if rec.count(broken.ID) != 2 {
			t.Fatalf("the third attempt came early")
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if rec.count(flaky.ID) != 3 || rec.count(broken.ID) != 3 {
			t.Fatalf("attempts: %v, want 3 each", rec.calls)
		}
		if got, _ := s.Get(flaky.ID); got.State != StateFired || got.LastError != "" {
			t.Errorf("flaky: %+v", got)
		}
		if got, _ := s.Get(broken.ID); got.State != StateFailed || got.Attempts != 3 || !strings.Contains(got.LastError, "is gone") {
			t.Errorf("broken: %+v", got)
		}
	})
}

func TestShutdownReturnsTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		dir := t.TempDir()
		started := make(chan struct{})
		rec := newRecorder()
		rec.fail = func(Reminder) error {
			close(started)
			time.Sleep(time.Hour) // interrupted by the shutdown below
			return errors.New("interrupted")
		}
		s := open(t, Options{Dir: dir, Records: recs(t, store), Fire: func(ctx context.Context, r Reminder) error {
			if err := rec.fire(ctx, r); err != nil {
				return err
			}
			return nil
		}})
		// Fire that honours ctx instead of sleeping.
		s.opts.Fire = func(ctx context.Context, r Reminder) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}
		r, _ := s.Create(context.Background(), "s", time.Now(), "m")
		stop := running(t, s)
		<-started
		stop()
		got := storedRecord(t, store, r.ID)
		if got.State != StatePending || got.Attempts != 0 {
			t.Errorf("after shutdown mid-fire: %+v; want pending with the attempt given back", got)
		}
		rec2 := newRecorder()
		s2 := open(t, Options{Dir: dir, Records: recs(t, store), Fire: rec2.fire})
		stop2 := running(t, s2)
		defer stop2()
		synctest.Wait()
		if rec2.count(r.ID) != 1 {
			t.Errorf("after restart: fired %d times, want 1", rec2.count(r.ID))
		}
	})
}

// flakyStore wraps a memory store whose conditional writes and puts can be
// made to fail.
type flakyStore struct {
	mem  *memkv.Store
	mu   sync.Mutex
	down bool
}

func (f *flakyStore) isDown() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

func (f *flakyStore) setDown(v bool) {
	f.mu.Lock()
	f.down = v
	f.mu.Unlock()
}

var errDown = errors.New("store unreachable")

func (f *flakyStore) db(t *testing.T) *kv.DB {
	m := f.mem
	db, err := kv.New("flaky", kv.Funcs{
		Put: func(ctx context.Context, k string, v []byte) error {
			if f.isDown() {
				return errDown
			}
			return m.Put(ctx, k, v)
		},
		Get: m.Get, Delete: m.Delete, List: m.List,
		CAS: kv.CASFuncs{
			GetWithVersion: m.GetWithVersion, PutIfAbsent: m.PutIfAbsent, ListKeys: m.ListKeys,
			PutIfVersion: func(ctx context.Context, k string, v []byte, e kv.Version) (kv.Version, error) {
				if f.isDown() {
					return "", errDown
				}
				return m.PutIfVersion(ctx, k, v, e)
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func TestOutcomePushedWhenTheStoreComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &flakyStore{mem: memkv.NewStore()}
		store := fs.db(t)
		var s *Scheduler
		rec := newRecorder()
		rec.fail = func(Reminder) error {
			fs.setDown(true) // the store fails while the turn runs
			return nil
		}
		s = open(t, Options{Dir: t.TempDir(), Records: recs(t, store), Fire: rec.fire, SyncInterval: time.Minute})
		r, _ := s.Create(context.Background(), "s", time.Now(), "m")
		stop := running(t, s)
		defer stop()
		synctest.Wait()
		if got := storedRecord(t, store, r.ID); got.State != StateClaimed {
			t.Fatalf("stored while down: %s, want claimed", got.State)
		}
		if got, _ := s.Get(r.ID); got.State != StateFired {
			t.Fatalf("local: %s, want fired", got.State)
		}
		fs.setDown(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := storedRecord(t, store, r.ID); got.State != StateFired {
			t.Errorf("stored after the store came back: %s, want fired", got.State)
		}
		time.Sleep(time.Hour) // past the lease: nobody fires it again
		synctest.Wait()
		if rec.count(r.ID) != 1 {
			t.Errorf("fired %d times", rec.count(r.ID))
		}
	})
}

func TestCreateFailsWhenTheStoreDoes(t *testing.T) {
	fs := &flakyStore{mem: memkv.NewStore(), down: true}
	db, err := kv.New("down", kv.Funcs{Put: func(context.Context, string, []byte) error { return errDown }, Get: fs.mem.Get, List: fs.mem.List})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, Options{Dir: t.TempDir(), Records: recs(t, db), Fire: newRecorder().fire})
	if _, err := s.Create(context.Background(), "s", time.Now(), "m"); !errors.Is(err, errDown) {
		t.Fatalf("Create with the store down = %v, want the store's error", err)
	}
	if n := len(s.List("")); n != 0 {
		t.Errorf("%d reminders kept locally after a failed Create", n)
	}
}

func TestPlainStoreSingleHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memkv.NewStore()
		plain, err := kv.New("plain", kv.Funcs{Put: mem.Put, Get: mem.Get, Delete: mem.Delete, List: mem.List})
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder()
		dir := t.TempDir()
		s := open(t, Options{Dir: dir, Records: recs(t, plain), Fire: rec.fire})
		if s.Coordinated() {
			t.Error("a store without CAS reported coordinated firing")
		}
		r, _ := s.Create(context.Background(), "s", time.Now().Add(time.Minute), "m")
		stop := running(t, s)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		stop()
		if rec.count(r.ID) != 1 {
			t.Fatalf("fired %d times", rec.count(r.ID))
		}
		if got := storedRecord(t, plain, r.ID); got.State != StateFired {
			t.Errorf("mirrored state %s, want fired", got.State)
		}
		// A restart on a fresh folder hydrates the fired state and does not
		// fire again.
		s2 := open(t, Options{Dir: t.TempDir(), Records: recs(t, plain), Fire: rec.fire})
		stop2 := running(t, s2)
		time.Sleep(time.Hour)
		synctest.Wait()
		stop2()
		if rec.count(r.ID) != 1 {
			t.Errorf("fired %d times after the restart", rec.count(r.ID))
		}
	})
}

func TestRetentionSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memkv.New()
		rec := newRecorder()
		s := open(t, Options{Dir: t.TempDir(), Records: recs(t, store), Fire: rec.fire, Retention: 24 * time.Hour, SyncInterval: time.Hour})
		r, _ := s.Create(context.Background(), "s", time.Now(), "m")
		stop := running(t, s)
		defer stop()
		synctest.Wait()
		time.Sleep(23 * time.Hour)
		synctest.Wait()
		if _, ok := s.Get(r.ID); !ok {
			t.Fatal("removed before the retention passed")
		}
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		if _, ok := s.Get(r.ID); ok {
			t.Error("still listed after the retention")
		}
		if _, _, err := recs(t, store).Read(context.Background(), r.ID); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("still stored after the retention: %v", err)
		}
	})
}

func TestBadRecordsSkipped(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "junk.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	newer := []byte(`{"v":2,"id":"rem_local_future","sessionId":"s","state":"pending","at":"2026-01-01T00:00:00Z"}`)
	if err := os.WriteFile(filepath.Join(dir, "rem_local_future.json"), newer, 0o644); err != nil {
		t.Fatal(err)
	}
	store := memkv.New()
	scope, _ := keys.Agent("helper")
	future, _ := record.Marshal(storage.KindReminder, Reminder{ID: "rem_future", SessionID: "s", State: StatePending, At: time.Now()})
	future = []byte(strings.Replace(string(future), `"v":1`, `"v":2`, 1))
	fkey, _ := scope.Reminder("rem_future")
	_ = store.Put(context.Background(), fkey, future)
	key, _ := scope.Reminder("rem_other")
	mismatch, _ := record.Marshal(storage.KindReminder, Reminder{ID: "rem_mismatch", SessionID: "s", State: StatePending, At: time.Now()})
	_ = store.Put(context.Background(), key, mismatch)
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	s := open(t, Options{Dir: dir, Records: recs(t, store), Fire: newRecorder().fire, Logger: logger})
	if n := len(s.List("")); n != 0 {
		t.Errorf("bad records were loaded: %v", s.List(""))
	}
	if _, err := os.Stat(filepath.Join(dir, "junk.json")); err != nil {
		t.Errorf("the unreadable local file was removed: %v", err)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	for _, want := range []string{"rem_local_future.json", "upgrade agentkit", "rem_other", "belongs elsewhere"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not mention %q:\n%s", want, out)
		}
	}
}

func TestFileName(t *testing.T) {
	if got := fileName("rem_0123abc"); got != "rem_0123abc.json" {
		t.Errorf("fileName(plain) = %q", got)
	}
	a, b := fileName("../../etc/passwd"), fileName("a/b")
	if strings.ContainsAny(a+b, "/\\") || a == b || !strings.HasPrefix(a, "sha256-") {
		t.Errorf("fileName of unsafe ids: %q, %q", a, b)
	}
}

func TestLocalRemindersMoveToANewStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		rec := newRecorder()
		local := open(t, Options{Dir: dir, Fire: rec.fire})
		r, err := local.Create(context.Background(), "s", time.Now().Add(time.Hour), "m")
		if err != nil {
			t.Fatal(err)
		}
		// The operator configures a store; the reminder made without one
		// is written to it rather than taken for deleted.
		store := memkv.New()
		s := open(t, Options{Dir: dir, Records: recs(t, store), Fire: rec.fire})
		if got := storedRecord(t, store, r.ID); got.State != StatePending || got.Message != "m" {
			t.Fatalf("stored after the move: %+v", got)
		}
		stop := running(t, s)
		defer stop()
		time.Sleep(2 * time.Hour)
		synctest.Wait()
		if rec.count(r.ID) != 1 {
			t.Errorf("fired %d times, want 1", rec.count(r.ID))
		}
		if got := storedRecord(t, store, r.ID); got.State != StateFired {
			t.Errorf("stored state %s, want fired", got.State)
		}
	})
}
