package actor

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// runs records handler calls.
type runs struct {
	mu    sync.Mutex
	tasks []Task
	at    []time.Time
	fail  func(t Task) error
}

func (r *runs) handler(ctx context.Context, ref *Ref, t Task) error {
	r.mu.Lock()
	r.tasks = append(r.tasks, t)
	r.at = append(r.at, time.Now())
	fail := r.fail
	r.mu.Unlock()
	if fail != nil {
		return fail(t)
	}
	return nil
}

// snapshot copies the runs so far.
func (r *runs) snapshot() ([]Task, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Task(nil), r.tasks...), append([]time.Time(nil), r.at...)
}

func (r *runs) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tasks)
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// schedHost opens a Host inside a synctest bubble with the "h" handler.
func schedHost(t *testing.T, dir string, rec *runs, opts Options) (*Host, *Class[Status]) {
	t.Helper()
	opts.Dir = dir
	opts.Logger = testLogger(t)
	h, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	h.Handle("h", rec.handler)
	c, err := Define(h, "agent", func() Status { return Status{} })
	if err != nil {
		t.Fatal(err)
	}
	return h, c
}

// running starts h.Run and returns a function that stops it and closes h.
func running(t *testing.T, h *Host) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			h.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestTaskRunsOnceAtItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{})
		defer running(t, h)()
		a := actorOf(t, c, "a")
		start := time.Now()
		task, err := a.Schedule(ctx, At(start.Add(time.Hour)), "h", map[string]int{"n": 1})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(task.ID, "task_") || task.Kind != KindAt || !task.Due.Equal(start.Add(time.Hour)) || string(task.Payload) != `{"n":1}` {
			t.Fatalf("Schedule returned %+v", task)
		}
		time.Sleep(time.Hour - time.Second)
		synctest.Wait()
		if n := rec.count(); n != 0 {
			t.Fatalf("ran %d times a second before its time", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n := rec.count(); n != 1 {
			t.Fatalf("ran %d times at its time, want 1", n)
		}
		tasks, _ := rec.snapshot()
		got := tasks[0]
		if got.ID != task.ID || string(got.Payload) != `{"n":1}` || got.Actor != "a" || got.Class != "agent" || got.Attempts != 1 {
			t.Errorf("the handler got %+v", got)
		}
		time.Sleep(48 * time.Hour)
		synctest.Wait()
		if n := rec.count(); n != 1 {
			t.Errorf("ran %d times in all, want once", n)
		}
		if ts, _ := a.Schedules(ctx); len(ts) != 0 {
			t.Errorf("a task that ran is still listed: %+v", ts)
		}
	})
}

func TestTaskAfterADelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{})
		defer running(t, h)()
		start := time.Now()
		if _, err := actorOf(t, c, "a").Schedule(ctx, After(90*time.Second), "h", json.RawMessage(`[1, 2]`)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		tasks, at := rec.snapshot()
		if len(tasks) != 1 || !at[0].Equal(start.Add(90*time.Second)) || string(tasks[0].Payload) != `[1,2]` || tasks[0].Kind != KindDelay {
			t.Fatalf("runs %+v at %v; want one at +90s", tasks, at)
		}
	})
}

func TestCronTaskRunsAtEachTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{})
		defer running(t, h)()
		a := actorOf(t, c, "a")
		task, err := a.Schedule(ctx, Cron("30 * * * *"), "h", nil)
		if err != nil {
			t.Fatal(err)
		}
		if task.Due.Minute() != 30 || task.Kind != KindCron {
			t.Fatalf("the first due time is %v", task.Due)
		}
		time.Sleep(3*time.Hour + 35*time.Minute)
		synctest.Wait()
		if n := rec.count(); n != 4 {
			t.Fatalf("ran %d times in 3h35m on minute 30, want 4", n)
		}
		_, ats := rec.snapshot()
		for _, at := range ats {
			if at.Minute() != 30 || at.Second() != 0 {
				t.Errorf("ran at %v", at)
			}
		}
		ts, _ := a.Schedules(ctx)
		if len(ts) != 1 || ts[0].Due.Minute() != 30 || !ts[0].Due.After(time.Now()) || ts[0].Attempts != 0 {
			t.Errorf("the cron task after running: %+v", ts)
		}
	})
}

func TestBadWhenIsRefused(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "a")
	for _, w := range []When{{}, At(time.Time{}), After(-time.Second), Cron("61 * * * *"), Cron("every day")} {
		if _, err := a.Schedule(ctx, w, "h", nil); err == nil {
			t.Errorf("Schedule(%+v) succeeded", w)
		}
	}
	if _, err := a.Schedule(ctx, After(0), "", nil); err == nil {
		t.Error("Schedule without a handler succeeded")
	}
	if _, err := a.Schedule(ctx, After(0), "h", make(chan int)); err == nil {
		t.Error("a payload JSON cannot encode was accepted")
	}
	if _, err := a.Schedule(ctx, After(0), "h", []byte(`{"x":`)); err == nil {
		t.Error("an invalid JSON payload was accepted")
	}
	if a.HasDatabase() {
		t.Error("refused tasks created the database")
	}
}

// TestTasksSurviveARestartAndRunLate: a task due while no Host ran runs
// once, at once, when Run starts again; a cron task runs once for all the
// times it missed.
func TestTasksSurviveARestartAndRunLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		dir := filepath.Join(t.TempDir(), "actors")
		rec := &runs{}
		h, c := schedHost(t, dir, rec, Options{})
		stop := running(t, h)
		a := actorOf(t, c, "a")
		once, err := a.Schedule(ctx, After(time.Hour), "h", "once")
		if err != nil {
			t.Fatal(err)
		}
		cron, err := a.Schedule(ctx, Cron("0 * * * *"), "h", "hourly")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Minute)
		stop() // the host goes down before either is due

		time.Sleep(5 * time.Hour)
		synctest.Wait()
		if rec.count() != 0 {
			t.Fatal("a task ran while no Host ran")
		}
		down := time.Now()
		h2, _ := schedHost(t, dir, rec, Options{})
		defer running(t, h2)()
		synctest.Wait()
		if n := rec.count(); n != 2 {
			t.Fatalf("%d runs after the restart, want 2 (each task once, late)", n)
		}
		byID := map[string]int{}
		tasks, ats := rec.snapshot()
		for i, task := range tasks {
			byID[task.ID]++
			if !ats[i].Equal(down) {
				t.Errorf("task %s ran at %v, want at once (%v)", task.ID, ats[i], down)
			}
		}
		if byID[once.ID] != 1 || byID[cron.ID] != 1 {
			t.Errorf("runs by task: %v", byID)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := rec.count(); n != 3 {
			t.Errorf("%d runs an hour later, want 3 (the cron task's next time)", n)
		}
	})
}

func TestListAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{})
		defer running(t, h)()
		a := actorOf(t, c, "a")
		late, _ := a.Schedule(ctx, After(2*time.Hour), "h", "late")
		early, _ := a.Schedule(ctx, After(time.Hour), "h", "early")
		ts, err := a.Schedules(ctx)
		if err != nil || len(ts) != 2 || ts[0].ID != early.ID || ts[1].ID != late.ID {
			t.Fatalf("Schedules = %+v, %v; want early then late", ts, err)
		}
		if err := a.CancelSchedule(ctx, early.ID); err != nil {
			t.Fatal(err)
		}
		if err := a.CancelSchedule(ctx, early.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("cancelling twice = %v", err)
		}
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		if tasks, _ := rec.snapshot(); len(tasks) != 1 || tasks[0].ID != late.ID {
			t.Fatalf("runs %+v; want only the task not cancelled", tasks)
		}
	})
}

func TestFailedRunsAreRetriedThenKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{fail: func(t Task) error {
			if string(t.Payload) == `"flaky"` && t.Attempts >= 3 {
				return nil
			}
			return errors.New("boom")
		}}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{MaxAttempts: 3, RetryDelay: time.Minute})
		defer running(t, h)()
		a := actorOf(t, c, "a")
		start := time.Now()
		flaky, _ := a.Schedule(ctx, After(0), "h", "flaky")
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if _, at := rec.snapshot(); len(at) != 3 || !at[1].Equal(start.Add(time.Minute)) || !at[2].Equal(start.Add(3*time.Minute)) {
			t.Fatalf("runs at %v; want at 0, +1m and +3m (the delay doubles)", at)
		}
		if ts, _ := a.Schedules(ctx); len(ts) != 0 {
			t.Fatalf("the task that succeeded on its third run is still listed: %+v", ts)
		}
		_ = flaky
		broken, _ := a.Schedule(ctx, After(0), "h", "broken")
		missing, _ := a.Schedule(ctx, After(0), "nobody", nil)
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := rec.count(); n != 6 {
			t.Fatalf("%d runs, want 3 more for the broken task", n)
		}
		ts, _ := a.Schedules(ctx)
		if len(ts) != 2 {
			t.Fatalf("Schedules = %+v; want both failed tasks kept", ts)
		}
		for _, task := range ts {
			if !task.Failed || task.Attempts != 3 {
				t.Errorf("task %+v; want failed after 3 attempts", task)
			}
			if task.ID == broken.ID && !strings.Contains(task.LastError, "boom") {
				t.Errorf("the broken task's error: %q", task.LastError)
			}
			if task.ID == missing.ID && !strings.Contains(task.LastError, `no handler named "nobody"`) {
				t.Errorf("the task without a handler: %q", task.LastError)
			}
		}
		time.Sleep(24 * time.Hour)
		synctest.Wait()
		if n := rec.count(); n != 6 {
			t.Errorf("a failed task ran again (%d runs)", n)
		}
	})
}

// TestAttemptsAreCountedBeforeARun: the attempt is on disk while the
// handler runs, so a task whose every allowed run started and never
// finished (the process died in the handler) is not run again; a run cut
// short by the end of Run is not counted.
func TestAttemptsAreCountedBeforeARun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		dir := filepath.Join(t.TempDir(), "actors")
		rec := &runs{}
		started := make(chan struct{})
		h, c := schedHost(t, dir, rec, Options{MaxAttempts: 2})
		h.Handle("hang", func(ctx context.Context, r *Ref, t Task) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
		a := actorOf(t, c, "a")
		task, _ := a.Schedule(ctx, After(0), "hang", nil)
		stop := running(t, h)
		<-started
		ts, _ := a.Schedules(ctx)
		if len(ts) != 1 || ts[0].Attempts != 1 {
			t.Fatalf("during the run: %+v; want attempts 1 stored", ts)
		}
		stop()

		h2, c2 := schedHost(t, dir, rec, Options{MaxAttempts: 2})
		a2 := actorOf(t, c2, "a")
		ts, _ = a2.Schedules(ctx)
		if len(ts) != 1 || ts[0].Attempts != 0 {
			t.Fatalf("after a shutdown during the run: %+v; want attempts 0", ts)
		}
		// As after two crashes in the handler.
		e, err := a2.acquireWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.ExecContext(ctx, `UPDATE schedules SET attempts = 2 WHERE id = ?`, task.ID); err != nil {
			t.Fatal(err)
		}
		h2.pool.release(e)
		var calls atomic.Int32
		h2.Handle("hang", func(ctx context.Context, r *Ref, t Task) error { calls.Add(1); return nil })
		defer running(t, h2)()
		synctest.Wait()
		ts, _ = a2.Schedules(ctx)
		if calls.Load() != 0 || len(ts) != 1 || !ts[0].Failed || !strings.Contains(ts[0].LastError, "process ended") {
			t.Fatalf("calls %d, tasks %+v; want the task failed without another run", calls.Load(), ts)
		}
	})
}

// TestManyActorsOneDue: the index wakes Run for the
// one actor with a due task among many.
func TestManyActorsOneDue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{Synchronous: "normal", MaxOpen: 4})
		for i := range 20 {
			a := actorOf(t, c, "quiet-"+string(rune('a'+i)))
			if _, err := a.SetState(ctx, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 {
			a := actorOf(t, c, "busy-"+string(rune('a'+i)))
			if _, err := a.Schedule(ctx, After(time.Duration(i+1)*time.Minute), "h", i); err != nil {
				t.Fatal(err)
			}
		}
		defer running(t, h)()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if n := rec.count(); n != 3 {
			t.Fatalf("%d runs, want 3", n)
		}
		tasks, _ := rec.snapshot()
		for i, task := range tasks {
			if task.Actor != "busy-"+string(rune('a'+i)) {
				t.Errorf("run %d was of %s", i, task.Actor)
			}
		}
	})
}

// TestIndexFollowsTheNextTask: after running an actor's due tasks, its
// index entry moves to its next task, or goes when it has none.
func TestIndexFollowsTheNextTask(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{})
		a := actorOf(t, c, "a")
		start := time.Now()
		a.Schedule(ctx, After(time.Hour), "h", nil)
		last, _ := a.Schedule(ctx, After(90*time.Minute), "h", nil)
		entry := func() []dueActor {
			d, err := h.indexFirst(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		if d := entry(); len(d) != 1 || !d[0].at.Equal(start.Add(time.Hour)) {
			t.Fatalf("index %v; want the first task's time", d)
		}
		time.Sleep(time.Hour)
		if err := h.fireActor(ctx, "agent", "a"); err != nil {
			t.Fatal(err)
		}
		if d := entry(); len(d) != 1 || !d[0].at.Equal(start.Add(90*time.Minute)) || rec.count() != 1 {
			t.Fatalf("index %v after the first run (%d runs); want one run and the next task's time", d, rec.count())
		}
		if err := a.CancelSchedule(ctx, last.ID); err != nil {
			t.Fatal(err)
		}
		if err := h.fireActor(ctx, "agent", "a"); err != nil {
			t.Fatal(err)
		}
		if d := entry(); len(d) != 0 {
			t.Fatalf("index %v; want no entry for an actor without tasks", d)
		}
	})
}

// TestAPanickingHandlerIsAFailedRun: a panic is recorded as the run's
// error, and Run goes on with other tasks.
func TestAPanickingHandlerIsAFailedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		rec := &runs{}
		h, c := schedHost(t, filepath.Join(t.TempDir(), "actors"), rec, Options{MaxAttempts: 1})
		h.Handle("boom", func(ctx context.Context, r *Ref, t Task) error { panic("kaboom") })
		defer running(t, h)()
		a := actorOf(t, c, "a")
		a.Schedule(ctx, After(time.Minute), "boom", nil)
		a.Schedule(ctx, After(2*time.Minute), "h", nil)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		ts, _ := a.Schedules(ctx)
		if rec.count() != 1 || len(ts) != 1 || !ts[0].Failed || !strings.Contains(ts[0].LastError, "panicked: kaboom") {
			t.Fatalf("%d runs of the other task, tasks %+v; want the panic recorded and the other task run", rec.count(), ts)
		}
	})
}
