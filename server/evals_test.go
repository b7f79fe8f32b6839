package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/abtest"
	"agentkit/agent"
	"agentkit/evals"
	"agentkit/internal/storetest"
	"agentkit/kv"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/server"
)

// waitRun polls GET /v1/evals/{id} until the run is no longer running.
func (f *fixture) waitRun(id string) evals.Run {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var run evals.Run
		if st := f.do("GET", "/v1/evals/"+id, "", &run); st != http.StatusOK {
			f.t.Fatalf("GET /v1/evals/%s: status %d", id, st)
		}
		if run.Status != evals.StatusRunning {
			return run
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("run %s still running after 30s: %+v", id, run.Counts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestEvalRoutes(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var started evals.Run
	resp := f.send("POST", "/v1/evals", `{"name": "smoke", "concurrency": 2, "cases": [
		{"name": "greets", "input": "hello", "expect": {"exact": "echo: hello"}},
		{"name": "wrong", "input": "hi", "expect": {"contains": "bye"}}]}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(resp.Header.Get("Location"), "/v1/evals/") {
		t.Fatalf("POST /v1/evals: %d %s %q", resp.StatusCode, body, resp.Header.Get("Location"))
	}
	if err := json.Unmarshal(body, &started); err != nil || started.Status != evals.StatusRunning || started.Source != "api" || started.Counts.Total != 2 {
		t.Fatalf("POST /v1/evals answered %s (%v)", body, err)
	}
	run := f.waitRun(started.ID)
	if run.Status != evals.StatusFinished || run.Counts.Passed != 1 || run.Counts.Failed != 1 || run.Name != "smoke" || run.Concurrency != 2 {
		t.Errorf("run %+v", run)
	}

	// A cases file as the body.
	resp = f.send("POST", "/v1/evals?name=cases.jsonl", `{"name": "a", "input": "x", "expect": {"regexp": "^echo: x$"}}`+"\n",
		http.Header{"Content-Type": {"application/x-ndjson"}})
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var second evals.Run
	if err := json.Unmarshal(body, &second); resp.StatusCode != http.StatusAccepted || err != nil {
		t.Fatalf("POST /v1/evals (JSONL): %d %s", resp.StatusCode, body)
	}
	if run := f.waitRun(second.ID); run.Counts.Passed != 1 || run.Name != "cases.jsonl" {
		t.Errorf("JSONL run %+v", run)
	}

	var list struct {
		Runs          []evals.Summary `json:"runs"`
		HistoryWindow int             `json:"historyWindow"`
	}
	if st := f.do("GET", "/v1/evals", "", &list); st != 200 || len(list.Runs) != 2 || list.Runs[0].ID != second.ID || list.HistoryWindow != 50 {
		t.Fatalf("GET /v1/evals: %d %+v", st, list)
	}
	if s := list.Runs[1]; s.PassRate != 0.5 || s.Counts.Done != 2 {
		t.Errorf("summary %+v", s)
	}

	f.wantError("GET", "/v1/evals/nope", "", 404, server.CodeRunNotFound)
	f.wantError("POST", "/v1/evals", `{"cases": [{"name": "a"}]}`, 400, server.CodeInvalid, `case 1`, `has no "input"`)
	f.wantError("POST", "/v1/evals", `{"cases": [{"name": "a", "input": "x", "expect": {"equal": "x"}}]}`, 400, server.CodeInvalid, `unknown field "equal"`)
	f.wantError("POST", "/v1/evals", `{"cases": []}`, 400, server.CodeInvalid, "no cases")
	f.wantError("POST", "/v1/evals", `{"cases": [{"name": "a", "input": "x"}], "concurrency": 500}`, 400, server.CodeInvalid, "concurrency 500")
	f.wantError("POST", "/v1/evals", `{"name": "x"}`, 400, server.CodeInvalid, "cases: missing")
}

// The errors of an eval request speak of JSON and the request's fields,
// never of the Go types the runtime decodes them into, and an empty cases
// file is said to be empty, at no line.
func TestEvalErrorsSpeakJSON(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	for _, c := range []struct{ body, want string }{
		{`{"cases": 5}`, `cases: expected a JSON array of cases, such as [{"name": "greets", "input": "hello", "expect": {"contains": "hello"}}], found a JSON number`},
		{`{"cases": "x"}`, `cases: expected a JSON array of cases`},
		{`{"cases": [5]}`, `cases: case 1: not a case: a case is a JSON object such as {"name": "greets"`},
		{`{"cases": [{"name": 5}]}`, `cases: case 1: not a case: name: expected a string, found a JSON number`},
		{`{"cases": [{"name": "a", "input": "x", "expect": "y"}]}`, `cases: case 1: not a case: expect: expected an object, found a JSON string`},
		{`{"cases": [], "concurrency": 1}`, `invalid cases: no cases; give at least one`},
		{`{"cases": [{"name": "a", "input": "x"}], "concurrency": 1e20}`, `concurrency: 1e20 is not a whole number from -9223372036854775808 to 9223372036854775807`},
		{`{"cases": [{"name": "a", "input": "x"}], "concurrency": 2.5}`, `concurrency: 2.5 is not a whole number`},
	} {
		var e apiError
		st := f.do("POST", "/v1/evals", c.body, &e)
		if st != 400 || e.Error.Code != server.CodeInvalid || !strings.Contains(e.Error.Message, c.want) {
			t.Errorf("POST /v1/evals %s: %d %q; want 400 saying %q", c.body, st, e.Error.Message, c.want)
		}
		for _, goName := range []string{"Go ", "json.", "evals.", "evals:", "RawMessage", "Case."} {
			if strings.Contains(e.Error.Message, goName) {
				t.Errorf("POST /v1/evals %s: %q names %q", c.body, e.Error.Message, goName)
			}
		}
	}
	for _, body := range []string{"", "\n# nothing yet\n"} {
		resp := f.send("POST", "/v1/evals", body, http.Header{"Content-Type": {"application/x-ndjson"}})
		var e apiError
		decodeJSON(t, resp, &e)
		if resp.StatusCode != 400 || !strings.HasPrefix(e.Error.Message, "cases: the request body: no cases: it ") || strings.Contains(e.Error.Message, ":0:") {
			t.Errorf("a cases file %q: %d %q; want 400 saying the request body has no cases", body, resp.StatusCode, e.Error.Message)
		}
	}
}

func TestEvalAndABRoutesNeedTheToken(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: "secret"}})
	f.token = ""
	for _, p := range []string{"/v1/evals", "/v1/evals/x", "/v1/abs"} {
		f.wantError("GET", p, "", 401, server.CodeUnauthorized)
	}
	f.wantError("POST", "/v1/evals", `{"cases": [{"name": "a", "input": "x"}]}`, 401, server.CodeUnauthorized)
}

func TestABsRoute(t *testing.T) {
	slow, err := model.NewEcho(&model.EchoConfig{Reply: "slow: {{.UserMessage}}"})
	if err != nil {
		t.Fatal(err)
	}
	exp := abtest.Experiment{Name: "engine", Variants: []abtest.Variant{{Name: "echo"}, {Name: "slow", Model: slow}}}
	f := newFixture(t, fixtureOpts{agent: agent.Agent{Experiments: []abtest.Experiment{exp}}})
	want := map[string]int64{}
	for range 6 {
		var r agent.TurnResult
		if st := f.do("POST", "/v1/sessions", `{"message": "hi"}`, &r); st != 201 {
			t.Fatalf("start: %d", st)
		}
		v := exp.Variants[exp.Assign(r.SessionID)].Name
		if (v == "slow") != strings.HasPrefix(r.Turn.Result, "slow: ") {
			t.Errorf("session in %s answered %q", v, r.Turn.Result)
		}
		want[v]++
	}
	// An eval session is not enrolled.
	var run evals.Run
	f.do("POST", "/v1/evals", `{"cases": [{"name": "a", "input": "x"}]}`, &run)
	f.waitRun(run.ID)
	var rep abtest.Report
	if st := f.do("GET", "/v1/abs", "", &rep); st != 200 || len(rep.Experiments) != 1 {
		t.Fatalf("GET /v1/abs: %d %+v", st, rep)
	}
	for _, v := range rep.Experiments[0].Variants {
		if v.Sessions != want[v.Name] || v.Turns != want[v.Name] {
			t.Errorf("variant %s: %d sessions %d turns, want %d", v.Name, v.Sessions, v.Turns, want[v.Name])
		}
	}
	if len(rep.Experiments[0].Comparisons) != 1 || rep.Experiments[0].Comparisons[0].Method != abtest.IntervalMethod {
		t.Errorf("comparisons %+v", rep.Experiments[0].Comparisons)
	}
}

func TestShutdownStopsEvalRunsBeforeTheRuntimeCloses(t *testing.T) {
	slow, err := model.NewEcho(&model.EchoConfig{Script: []model.EchoStep{{Text: "done", Delay: "300ms"}}})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOpts{agent: agent.Agent{Model: slow}})
	var run evals.Run
	f.do("POST", "/v1/evals", `{"concurrency": 1, "cases": [{"name": "a", "input": "x"}, {"name": "b", "input": "y"}, {"name": "c", "input": "z"}]}`, &run)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	got := f.waitRun(run.ID)
	if got.Status != evals.StatusInterrupted || got.Counts.Done == 3 || !strings.Contains(got.Error, "server stopped") {
		t.Errorf("after Shutdown the run is %s with %+v (%q); want interrupted before its last case", got.Status, got.Counts, got.Error)
	}
	f.wantError("POST", "/v1/evals", `{"cases": [{"name": "a", "input": "x"}]}`, 503, server.CodeShuttingDown)
}

func TestPlaygroundPageAndAssets(t *testing.T) {
	f := newFixture(t, fixtureOpts{Options: server.Options{AuthToken: "secret"}})
	f.token = ""
	for _, c := range []struct{ path, ctype, contains string }{
		{"/", "text/html", `<script src="/playground/app.js">`},
		{"/playground/app.js", "javascript", "function passRateChart"},
		{"/playground/style.css", "text/css", ".badge"},
	} {
		resp := f.send("GET", c.path, "", nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), c.ctype) || !strings.Contains(string(body), c.contains) ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Errorf("GET %s: %d %q %q", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Security-Policy"))
		}
		// The page must work offline: no asset from another host.
		for _, remote := range []string{"http://", "https://", "//cdn"} {
			if strings.Contains(string(body), remote) && !strings.Contains(string(body), "http://www.w3.org/2000/svg") {
				t.Errorf("GET %s references %q: the playground must not load anything from another host", c.path, remote)
			}
		}
	}
	f.wantError("GET", "/playground/nope.js", "", 404, server.CodeNotFound)
	// The page holds no data: its data routes need the token.
	f.wantError("GET", "/v1/sessions", "", 401, server.CodeUnauthorized)
}

func TestNativeTablesThroughTheRuntime(t *testing.T) {
	native := storetest.NewNative()
	e, _ := model.NewEcho(nil)
	exp := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "a"}, {Name: "b"}}}
	rt, err := agent.Open(context.Background(), agent.Config{
		Agent:     agent.Agent{Name: "native", Model: e, Experiments: []abtest.Experiment{exp}},
		StateRoot: t.TempDir(), Store: memkv.New(), Evals: native, ABs: native, Logger: discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(rt, server.Options{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	f := &fixture{t: t, url: hs.URL, rt: rt, srv: srv}
	var info struct {
		Storage struct{ Evals, ABs, ABSnapshot string }
	}
	f.do("GET", "/v1/info", "", &info)
	if info.Storage.Evals != "native" || info.Storage.ABs != "native" || info.Storage.ABSnapshot != "native" {
		t.Errorf("/v1/info storage modes %+v", info.Storage)
	}
	var r agent.TurnResult
	f.do("POST", "/v1/sessions", `{"message": "hi"}`, &r)
	var run evals.Run
	f.do("POST", "/v1/evals", `{"cases": [{"name": "a", "input": "x"}]}`, &run)
	f.waitRun(run.ID)
	if ids := native.RunIDs("native"); len(ids) != 1 || ids[0] != run.ID {
		t.Errorf("the native eval table holds %v, want the run", ids)
	}
	if s := native.Samples(); len(s) != 1 || s[0].SessionID != r.SessionID || s[0].Variant != exp.Variants[exp.Assign(r.SessionID)].Name {
		t.Errorf("the native A/B table holds %+v, want one sample of the enrolled session", s)
	}
	hs.Close()
	if err := rt.Close(); err != nil { // flushes the A/B state
		t.Fatal(err)
	}
	if c := native.Calls(); c["PutSnapshot"] == 0 {
		t.Errorf("closing the runtime wrote no A/B snapshot to the native table: %v", c)
	}
}

// TestDroppedABSamplesAreReported: an A/B sample the store refuses is
// lost (it is the one record written at most once), and /v1/info and
// /metrics count it.
func TestDroppedABSamplesAreReported(t *testing.T) {
	mem := memkv.New()
	var refused atomic.Int64
	store := kv.Funcs{
		Put: func(ctx context.Context, key string, value []byte) error {
			if strings.Contains(key, "/ab-samples/") {
				refused.Add(1)
				return errors.New("the samples table is full")
			}
			return mem.Put(ctx, key, value)
		},
		Get: mem.Get, Delete: mem.Delete, List: mem.List,
	}
	exp := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "a"}, {Name: "b"}}}
	f := newFixture(t, fixtureOpts{agent: agent.Agent{Experiments: []abtest.Experiment{exp}}, store: store})
	var info struct {
		ABSamplesDropped uint64 `json:"abSamplesDropped"`
	}
	if st := f.do("GET", "/v1/info", "", &info); st != 200 || info.ABSamplesDropped != 0 {
		t.Fatalf("before any turn: status %d, abSamplesDropped %d", st, info.ABSamplesDropped)
	}
	if st := f.do("POST", "/v1/sessions", `{"message":"hi"}`, nil); st != 201 {
		t.Fatalf("start: status %d", st)
	}
	deadline := time.Now().Add(30 * time.Second)
	for refused.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if refused.Load() == 0 {
		t.Fatal("the turn wrote no A/B sample")
	}
	if st := f.do("GET", "/v1/info", "", &info); st != 200 || info.ABSamplesDropped != uint64(refused.Load()) {
		t.Fatalf("status %d, abSamplesDropped %d; the store refused %d", st, info.ABSamplesDropped, refused.Load())
	}
	want := fmt.Sprintf("agentkit_ab_samples_dropped_total %d\n", refused.Load())
	if !strings.Contains(f.metricsText(), want) {
		t.Fatalf("/metrics lacks %q", want)
	}
}

// TestMirrorWriteFailuresAreReported: a session mirror write the store
// refuses is counted in /v1/info (mirrorDropped) and in /metrics under
// agentkit_mirror_write_failures_total and, for existing dashboards, its
// first name agentkit_mirror_writes_dropped_total; the write is retried.
func TestMirrorWriteFailuresAreReported(t *testing.T) {
	mem := memkv.New()
	var refused atomic.Int64
	store := kv.Funcs{
		Put: func(ctx context.Context, key string, value []byte) error {
			if strings.Contains(key, "/sessions/") && refused.CompareAndSwap(0, 1) {
				return errors.New("the store is away for a moment")
			}
			return mem.Put(ctx, key, value)
		},
		Get: mem.Get, Delete: mem.Delete, List: mem.List,
	}
	f := newFixture(t, fixtureOpts{store: store})
	if st := f.do("POST", "/v1/sessions", `{"message":"hi"}`, nil); st != 201 {
		t.Fatalf("start: status %d", st)
	}
	var info struct {
		MirrorDropped int64 `json:"mirrorDropped"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for info.MirrorDropped == 0 && time.Now().Before(deadline) {
		f.do("GET", "/v1/info", "", &info)
		time.Sleep(10 * time.Millisecond)
	}
	if refused.Load() != 1 || info.MirrorDropped != 1 {
		t.Fatalf("the store refused %d writes, /v1/info counts %d; want 1 and 1", refused.Load(), info.MirrorDropped)
	}
	text := f.metricsText()
	for _, want := range []string{"agentkit_mirror_write_failures_total 1\n", "agentkit_mirror_writes_dropped_total 1\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
