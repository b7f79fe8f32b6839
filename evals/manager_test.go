package evals_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"agentkit/agent"
	"agentkit/evals"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/storage"
)

// boomModel echoes the message, and fails any turn whose message contains
// "boom" (a model error that does not pass by itself).
type boomModel struct{ echo *model.Echo }

func (b boomModel) Name() string { return "boom-echo" }

func (b boomModel) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	if strings.Contains(req.Messages[len(req.Messages)-1].Content, "boom") {
		return model.Response{}, errors.New("the model broke")
	}
	return b.echo.Generate(ctx, req)
}

func newBoom(t *testing.T) boomModel {
	e, err := model.NewEcho(nil)
	if err != nil {
		t.Fatal(err)
	}
	return boomModel{e}
}

var threeCases = []evals.Case{
	{Name: "passes", Input: "hello", Expect: evals.Expect{Exact: ptr("echo: hello")}},
	{Name: "fails", Input: "hi", Expect: evals.Expect{Contains: ptr("bye")}},
	{Name: "errors", Input: "boom", Expect: evals.Expect{Contains: ptr("boom")}},
}

func TestARunIsStoredAtStartAfterEachCaseAndAtTheEnd(t *testing.T) {
	for _, tb := range allTables(t) {
		t.Run(tb.name, func(t *testing.T) {
			rt := runtime(t, newBoom(t))
			tbl := tb.open(t)
			m := manager(t, evals.Options{Sessions: rt, Table: tbl, Agent: agentName, Model: "boom-echo", Heartbeat: time.Hour})
			type seen struct {
				status evals.Status
				done   int
			}
			var progress, storedSeq []seen
			run, err := m.Run(context.Background(), threeCases, evals.StartOptions{Name: "three", Concurrency: 1, OnProgress: func(r evals.Run) {
				progress = append(progress, seen{r.Status, r.Counts.Done})
				s := stored(t, tb.open(t))[r.ID] // what another host reads now
				storedSeq = append(storedSeq, seen{s.Status, s.Counts.Done})
			}})
			if err != nil {
				t.Fatal(err)
			}
			want := []seen{{evals.StatusRunning, 0}, {evals.StatusRunning, 1}, {evals.StatusRunning, 2}, {evals.StatusRunning, 3}, {evals.StatusFinished, 3}}
			if !slices.Equal(progress, want) || !slices.Equal(storedSeq, want) {
				t.Errorf("progress %v, stored %v; want %v: the snapshot is stored at the start, after each case and at the end", progress, storedSeq, want)
			}
			c := run.Counts
			if run.Status != evals.StatusFinished || c.Total != 3 || c.Done != 3 || c.Passed != 1 || c.Failed != 1 || c.Errored != 1 || !run.Failed() {
				t.Errorf("run %s counts %+v: want finished, 1 passed, 1 failed (a wrong answer), 1 errored (a failed turn)", run.Status, c)
			}
			final := stored(t, tbl)[run.ID]
			if final.Status != evals.StatusFinished || final.FinishedAt.IsZero() || final.Host.ID != "test-host" || final.Name != "three" || final.Model != "boom-echo" {
				t.Errorf("stored run %+v", final)
			}
			for _, k := range final.Cases {
				sess, err := rt.GetSession(context.Background(), k.SessionID)
				if err != nil || sess.ChannelID != agent.EvalChannel {
					t.Errorf("case %s ran in session %q on channel %q (%v); want a fresh session on channel eval", k.Name, k.SessionID, sess.ChannelID, err)
				}
				if k.Attempts != 1 || k.Usage.InputTokens == 0 && k.Status != evals.CaseErrored {
					t.Errorf("case %+v", k)
				}
			}
			if k := final.Cases[0]; k.Status != evals.CasePassed || k.Answer != "echo: hello" || k.Grade == nil || !k.Grade.Pass {
				t.Errorf("passing case %+v", k)
			}
			if k := final.Cases[1]; k.Status != evals.CaseFailed || !strings.Contains(k.Grade.Reason, `does not contain "bye"`) {
				t.Errorf("failing case %+v", k)
			}
			if k := final.Cases[2]; k.Status != evals.CaseErrored || !strings.Contains(k.Error, "the turn failed: model error: the model broke") {
				t.Errorf("erroring case %+v", k)
			}
		})
	}
}

// chatServer is an OpenAI-compatible endpoint answering "ok" once
// failFirst requests got HTTP 429.
func chatServer(t *testing.T, failFirst int32) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if n.Add(1) <= failFirst {
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":{"message":"Rate limit reached"}}`))
			return
		}
		w.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}`))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRateLimitedCasesBackOffAndRetry(t *testing.T) {
	srv, requests := chatServer(t, 2)
	m, err := model.NewOpenAI(model.OpenAIOptions{BaseURL: srv.URL + "/v1", Model: "x", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var backoffs []int
	mgr := manager(t, evals.Options{Sessions: runtime(t, m), MaxAttempts: 3, Backoff: func(attempt int) time.Duration {
		mu.Lock()
		backoffs = append(backoffs, attempt)
		mu.Unlock()
		return time.Millisecond
	}})
	run, err := mgr.Run(context.Background(), []evals.Case{{Name: "c", Input: "hi", Expect: evals.Expect{Exact: ptr("ok")}}}, evals.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if k := run.Cases[0]; k.Status != evals.CasePassed || k.Attempts != 3 || requests.Load() != 3 || !slices.Equal(backoffs, []int{1, 2}) {
		t.Errorf("case %+v after %d requests, backoffs %v: want passed on the third attempt after backing off twice", k, requests.Load(), backoffs)
	}

	// A rate limit that outlasts every attempt errors the case.
	srv2, _ := chatServer(t, 100)
	m2, _ := model.NewOpenAI(model.OpenAIOptions{BaseURL: srv2.URL + "/v1", Model: "x", MaxRetries: -1})
	mgr2 := manager(t, evals.Options{Sessions: runtime(t, m2), MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Millisecond }})
	run, err = mgr2.Run(context.Background(), []evals.Case{{Name: "c", Input: "hi"}}, evals.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if k := run.Cases[0]; k.Status != evals.CaseErrored || k.Attempts != 3 || !strings.Contains(k.Error, "HTTP 429") || !strings.Contains(k.Error, "after 3 attempts") {
		t.Errorf("case %+v: want errored after 3 attempts, naming the 429", k)
	}
}

func TestAtMostConcurrencyCasesRunAtOnce(t *testing.T) {
	for _, c := range []struct{ concurrency, want int }{{0, evals.DefaultConcurrency}, {2, 2}} {
		t.Run(fmt.Sprint(c.concurrency), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				inFlight, most := 0, 0
				release := make(chan struct{})
				s := sessionsFunc(func(ctx context.Context, req agent.StartRequest) (agent.TurnResult, error) {
					mu.Lock()
					inFlight++
					most = max(most, inFlight)
					mu.Unlock()
					<-release
					mu.Lock()
					inFlight--
					mu.Unlock()
					return agent.TurnResult{SessionID: req.Message, Turn: agent.Turn{Status: agent.StatusCompleted, Result: "x"}}, nil
				})
				m := manager(t, evals.Options{Sessions: s})
				var cases []evals.Case
				for i := range 10 {
					cases = append(cases, evals.Case{Name: fmt.Sprint(i), Input: fmt.Sprint(i)})
				}
				done := make(chan evals.Run)
				go func() {
					run, _ := m.Run(context.Background(), cases, evals.StartOptions{Concurrency: c.concurrency})
					done <- run
				}()
				for range 10 {
					synctest.Wait() // every goroutine is blocked: as many turns as may run, run
					mu.Lock()
					n := inFlight
					mu.Unlock()
					if n > c.want {
						t.Errorf("%d cases run at once, want at most %d", n, c.want)
						close(release) // let them all end
						<-done
						return
					}
					release <- struct{}{}
				}
				run := <-done
				if most != c.want || run.Counts.Passed != 10 || run.Concurrency != c.want {
					t.Errorf("at most %d at once (want %d), run %+v", most, c.want, run.Counts)
				}
			})
		})
	}
}

func TestRunsPastTheHistoryWindowArePruned(t *testing.T) {
	for _, tb := range allTables(t) {
		t.Run(tb.name, func(t *testing.T) {
			tbl := tb.open(t)
			clock := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			now := func() time.Time { return clock }
			// An old run another host still runs, heartbeat fresh: kept,
			// even past the window.
			live := evals.Run{V: 1, ID: "00-live", Status: evals.StatusRunning, Host: evals.Host{ID: "other", Name: "elsewhere"},
				StartedAt: clock.Add(-time.Hour), HeartbeatAt: clock}
			doc, _ := json.Marshal(live)
			if err := tbl.Put(context.Background(), live.ID, doc); err != nil {
				t.Fatal(err)
			}
			// StaleAfter is long: the other host stays alive while the
			// clock moves on.
			m := manager(t, evals.Options{Sessions: fixedAnswer("x"), Table: tbl, HistoryWindow: 3, Now: now, StaleAfter: 24 * time.Hour})
			var ids []string
			for i := range 5 {
				clock = clock.Add(time.Minute)
				run, err := m.Run(context.Background(), []evals.Case{{Name: "c", Input: fmt.Sprint(i)}}, evals.StartOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, run.ID)
			}
			got := stored(t, tb.open(t))
			var keys []string
			for id := range got {
				keys = append(keys, id)
			}
			slices.Sort(keys)
			want := append([]string{"00-live"}, ids[2:]...)
			slices.Sort(want)
			if !slices.Equal(keys, want) {
				t.Errorf("stored runs %v, want the 3 newest and the live one: %v", keys, want)
			}
			list, err := m.List(context.Background())
			if err != nil || len(list) != 4 || list[0].ID != ids[4] || list[3].ID != "00-live" {
				t.Errorf("List: %v %v; want newest first", list, err)
			}
		})
	}
}

func TestRecoverMarksDeadOwnersRunsInterruptedAndLeavesLiveOnes(t *testing.T) {
	for _, tb := range allTables(t) {
		t.Run(tb.name, func(t *testing.T) {
			tbl := tb.open(t)
			clock := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			now := func() time.Time { return clock }
			me := evals.Host{ID: "root-1", Name: "box", PID: 200}
			put := func(r evals.Run) {
				r.V = 1
				r.Cases = []evals.CaseResult{{Name: "a", Status: evals.CasePassed}, {Name: "b", Status: evals.CaseRunning}}
				doc, _ := json.Marshal(r)
				if err := tbl.Put(context.Background(), r.ID, doc); err != nil {
					t.Fatal(err)
				}
			}
			// My state root's earlier process died mid-run a second ago.
			put(evals.Run{ID: "r1", Status: evals.StatusRunning, Host: evals.Host{ID: me.ID, Name: "box", PID: 100}, StartedAt: clock.Add(-time.Minute), HeartbeatAt: clock.Add(-time.Second)})
			// Another host, silent for an hour.
			put(evals.Run{ID: "r2", Status: evals.StatusRunning, Host: evals.Host{ID: "h2", Name: "other"}, StartedAt: clock.Add(-2 * time.Hour), HeartbeatAt: clock.Add(-time.Hour)})
			// Another machine with a copy of this state root (same host id),
			// heartbeat five seconds ago: alive.
			put(evals.Run{ID: "r3", Status: evals.StatusRunning, Host: evals.Host{ID: me.ID, Name: "third"}, StartedAt: clock.Add(-time.Minute), HeartbeatAt: clock.Add(-5 * time.Second)})
			// Another state root on this machine, heartbeat five seconds ago:
			// alive, though the machine's name is the same.
			put(evals.Run{ID: "r5", Status: evals.StatusRunning, Host: evals.Host{ID: "root-2", Name: "box", PID: 300}, StartedAt: clock.Add(-time.Minute), HeartbeatAt: clock.Add(-5 * time.Second)})
			put(evals.Run{ID: "r4", Status: evals.StatusFinished, Host: evals.Host{ID: "h2", Name: "other"}, StartedAt: clock.Add(-3 * time.Hour), HeartbeatAt: clock.Add(-3 * time.Hour)})

			m := manager(t, evals.Options{Sessions: fixedAnswer("x"), Table: tbl, Host: me, Now: now, Heartbeat: 10 * time.Second})
			runs, err := m.Recover(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) != 5 {
				t.Fatalf("Recover listed %d runs, want all 5", len(runs))
			}
			got := stored(t, tb.open(t))
			if r := got["r1"]; r.Status != evals.StatusInterrupted || !strings.Contains(r.Error, "pid 100") || r.Cases[1].Status != evals.CasePending || r.Cases[0].Status != evals.CasePassed {
				t.Errorf("r1 (left running by this state root's previous process) = %s %q %+v, want interrupted at once", r.Status, r.Error, r.Cases)
			}
			if r := got["r2"]; r.Status != evals.StatusInterrupted || !strings.Contains(r.Error, "stopped sending heartbeats") {
				t.Errorf("r2 (another host, stale heartbeat) = %s %q, want interrupted", r.Status, r.Error)
			}
			if r := got["r3"]; r.Status != evals.StatusRunning {
				t.Errorf("r3 (another host, live heartbeat) = %s: a host must not mark another host's live run", r.Status)
			}
			if r := got["r5"]; r.Status != evals.StatusRunning {
				t.Errorf("r5 (another state root on this machine, live heartbeat) = %s %q: only this state root's own earlier runs are orphans", r.Status, r.Error)
			}
			if r := got["r4"]; r.Status != evals.StatusFinished {
				t.Errorf("r4 = %s", r.Status)
			}
			// r3's host stops heartbeating: past StaleAfter (30s), a listing
			// marks it.
			clock = clock.Add(24 * time.Second)
			if r, _ := m.Get(context.Background(), "r3"); r.Status != evals.StatusRunning {
				t.Errorf("r3 after 29s of silence = %s, want still running (stale after 30s)", r.Status)
			}
			clock = clock.Add(5 * time.Second)
			if r, _ := m.Get(context.Background(), "r3"); r.Status != evals.StatusInterrupted {
				t.Errorf("r3 after 34s of silence = %s, want interrupted", r.Status)
			}
			if r := stored(t, tbl)["r3"]; r.Status != evals.StatusInterrupted {
				t.Errorf("stored r3 = %s", r.Status)
			}
			if _, err := m.Get(context.Background(), "nope"); !errors.Is(err, evals.ErrNotFound) {
				t.Errorf("Get(unknown) = %v", err)
			}
		})
	}
}

func TestStopEndsARunInterruptedWithItsCasesPending(t *testing.T) {
	started := make(chan struct{}, 10)
	release := make(chan struct{})
	s := sessionsFunc(func(ctx context.Context, req agent.StartRequest) (agent.TurnResult, error) {
		started <- struct{}{}
		<-release
		return agent.TurnResult{SessionID: req.Message, Turn: agent.Turn{Status: agent.StatusCompleted, Result: "x"}}, nil
	})
	tbl := memTable(t)
	m := manager(t, evals.Options{Sessions: s, Table: tbl})
	run, err := m.Start(context.Background(), []evals.Case{{Name: "a", Input: "a"}, {Name: "b", Input: "b"}, {Name: "c", Input: "c"}}, evals.StartOptions{Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	m.Stop()
	if _, err := m.Start(context.Background(), []evals.Case{{Name: "a", Input: "a"}}, evals.StartOptions{}); !errors.Is(err, evals.ErrClosed) {
		t.Errorf("Start after Stop: %v, want ErrClosed", err)
	}
	close(release) // the running case finishes and is graded
	if err := m.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := stored(t, tbl)[run.ID]
	if got.Status != evals.StatusInterrupted || got.Counts.Done != 1 || got.Cases[0].Status != evals.CasePassed ||
		got.Cases[1].Status != evals.CasePending || got.Cases[2].Status != evals.CasePending || !strings.Contains(got.Error, "stopped") {
		t.Errorf("stored run %s %+v %q: want interrupted, the running case graded, the rest pending", got.Status, got.Counts, got.Error)
	}
}

// TestMarkingInterruptedLosesToAnOwnerThatWroteMeanwhile has the owner of a
// stale-looking run write a fresh heartbeat between another host's read of
// the run and its conditional write: the run must stay running.
func TestMarkingInterruptedLosesToAnOwnerThatWroteMeanwhile(t *testing.T) {
	store := memkv.NewStore()
	var owner func()
	var armed atomic.Bool
	cas := kv.CASFuncsOf(store)
	getWithVersion := cas.GetWithVersion
	cas.GetWithVersion = func(ctx context.Context, key string) ([]byte, kv.Version, error) {
		data, ver, err := getWithVersion(ctx, key)
		if strings.Contains(key, "/eval-runs/") && armed.CompareAndSwap(true, false) {
			owner() // the owner's heartbeat lands after the read, before the write
		}
		return data, ver, err
	}
	backend := kv.Funcs{Put: store.Put, Get: store.Get, Delete: store.Delete, List: store.List, CAS: cas}
	tbl := table(t, storage.Config{Backend: backend})
	clock := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	put := func(heartbeat time.Time) {
		doc, _ := json.Marshal(evals.Run{V: 1, ID: "r", Status: evals.StatusRunning, Host: evals.Host{ID: "owner", Name: "elsewhere"},
			StartedAt: clock.Add(-time.Hour), HeartbeatAt: heartbeat})
		if err := tbl.Put(context.Background(), "r", doc); err != nil {
			t.Fatal(err)
		}
	}
	put(clock.Add(-time.Hour)) // silent for an hour, as far as anyone can tell
	owner = func() { put(clock) }
	armed.Store(true)
	m := manager(t, evals.Options{Sessions: fixedAnswer("x"), Table: tbl, Now: func() time.Time { return clock }})
	runs, err := m.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if armed.Load() {
		t.Fatal("the owner's write never happened: the test did not exercise the race")
	}
	got := stored(t, tbl)["r"]
	if got.Status != evals.StatusRunning || !got.HeartbeatAt.Equal(clock) || runs[0].Status != evals.StatusRunning {
		t.Errorf("stored %s (heartbeat %v), listed %s: a host marked a live run interrupted over its owner's newer heartbeat", got.Status, got.HeartbeatAt, runs[0].Status)
	}
}
