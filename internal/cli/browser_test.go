package cli_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"agentkit/internal/testenv"
)

// browser starts a headless Chromium (Debian's package, which
// scripts/test.sh installs when missing; AGENTKIT_TEST_CHROMIUM names
// another binary) and returns a tab's context. Without Chromium the test
// skips with a how-to, or fails under CI.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("AGENTKIT_TEST_CHROMIUM")
	var err error
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if path, err = exec.LookPath(name); err == nil {
				break
			}
		}
	}
	if path == "" {
		testenv.Unavailable(t, "Chromium", "Install Debian's chromium (apt-get install chromium; scripts/test.sh does it) or set AGENTKIT_TEST_CHROMIUM to a Chromium binary.", err)
		return nil
	}
	profile := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 1800),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	// Start the browser now, so that a failure to start is reported here.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		if testenv.InCI() {
			t.Fatalf("starting Chromium (%s): %v", path, err)
		}
		t.Skipf("Chromium at %s does not start (%v); skipping", path, err)
	}
	return ctx
}

// saveScreenshot writes a full-page screenshot into the test's folder, and
// into AGENTKIT_TEST_ARTIFACTS when it is set (CI keeps it).
func saveScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dirs := []string{t.TempDir()}
	if d := os.Getenv("AGENTKIT_TEST_ARTIFACTS"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", p, len(png))
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

func waitFor(t *testing.T, ctx context.Context, what, js string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(45*time.Second)))
		if err == nil {
			return
		}
		// Right after a navigation the page's JavaScript context may be
		// replaced under the poll; poll again in the new one.
		if attempt < 5 && strings.Contains(err.Error(), "Cannot find context") {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		t.Fatalf("waiting for %s (%s): %v", what, js, err)
	}
}

// TestPlaygroundInABrowser loads the page from a built binary with auth on,
// enters the token, and checks that the sessions, an eval run and the A/B
// charts show the figures the API gives.
func TestPlaygroundInABrowser(t *testing.T) {
	t.Parallel()
	const token = "browser-secret"
	dir := writeProject(t, abYAML)
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--auth-token", token, "--state-root", filepath.Join(t.TempDir(), "s"))

	var ids []string
	// At least five sessions, and as many as it takes for both variants to
	// have one, so that the comparison is defined.
	seen := map[bool]bool{}
	for i := 0; i < 5 || len(seen) < 2; i++ {
		if i == 40 {
			t.Fatal("40 sessions of a 1:1 experiment all landed in one variant")
		}
		r := start(t, p.url, token, fmt.Sprintf("message %d", i))
		seen[strings.HasPrefix(r.Turn.Result, "LOUD: ")] = true
		ids = append(ids, r.SessionID)
		if i == 1 {
			if st, _ := continueWith(t, p.url, token, r.ContinuationToken, "second turn"); st != 200 {
				t.Fatalf("continue: %d", st)
			}
		}
	}
	var run evalRun
	if st := call(t, "POST", p.url+"/v1/evals", token, `{"name": "browser", "cases": [
		{"name": "ok-1", "input": "a", "expect": {"contains": "a"}},
		{"name": "ok-2", "input": "b", "expect": {"regexp": "b$"}},
		{"name": "nope", "input": "c", "expect": {"exact": "something else"}}]}`, &run); st != 202 {
		t.Fatalf("POST /v1/evals: %d", st)
	}
	for deadline := time.Now().Add(30 * time.Second); run.Status != "finished"; time.Sleep(50 * time.Millisecond) {
		call(t, "GET", p.url+"/v1/evals/"+run.RunID, token, "", &run)
		if time.Now().After(deadline) {
			t.Fatalf("run not finished: %+v", run)
		}
	}
	sessions := listSessions(t, p.url, token) // newest first; eval sessions included
	var rep abReport
	call(t, "GET", p.url+"/v1/abs", token, "", &rep)

	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(p.url+"/")); err != nil {
		t.Fatal(err)
	}
	// No token yet: the page asks for it and shows no data.
	waitFor(t, ctx, "the token form", `!document.getElementById('auth').hidden`)
	if n := eval[int](t, ctx, `document.querySelectorAll('#session-list tr[data-session-id]').length`); n != 0 {
		t.Errorf("the page shows %d sessions before the token is given", n)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#auth-token"), token),
		chromedp.Click(chromedp.CSS(`#auth button[type="submit"]`)),
	); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the page to load", `document.body.dataset.loaded === 'true'`)

	// Sessions, newest first, as the API lists them.
	rows := eval[[]string](t, ctx, `[...document.querySelectorAll('#session-list tr[data-session-id]')].map(r => r.dataset.sessionId)`)
	if len(rows) != len(sessions) || rows[0] != sessions[0].ID {
		t.Fatalf("the page lists %d sessions starting with %v; the API lists %d starting with %s", len(rows), rows[:min(1, len(rows))], len(sessions), sessions[0].ID)
	}
	for i, s := range sessions {
		if rows[i] != s.ID {
			t.Errorf("row %d is %s, the API says %s", i, rows[i], s.ID)
		}
	}
	// Open the session with two turns and read its events.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#session-list tr[data-session-id="`+ids[1]+`"]`))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the session's events", `document.querySelectorAll('#session-detail li[data-type="turn.finished"]').length === 2`)
	if got := eval[string](t, ctx, `document.querySelector('#session-detail li[data-type="turn.started"] .what').textContent`); !strings.Contains(got, "message 1") || !strings.Contains(got, "A/B: tone=") {
		t.Errorf("the first event shows %q; want the message and the enrolment", got)
	}

	// The eval run: its row, its point on the pass-rate chart, its cases.
	runRow := eval[[]string](t, ctx, `(() => { const r = document.querySelector('#eval-runs tr[data-run-id="`+run.RunID+`"]'); return r ? [...r.cells].map(c => c.textContent) : []; })()`)
	if len(runRow) < 7 || runRow[2] != "finished" || runRow[3] != "2/3" || runRow[6] != "66.7%" {
		t.Errorf("the run's row reads %q; want finished, 2/3, 66.7%%", runRow)
	}
	if v := eval[string](t, ctx, `document.querySelector('svg[data-chart="pass-rate"] circle[data-run-id="`+run.RunID+`"]').dataset.value`); v != "66.7" {
		t.Errorf("the pass-rate chart plots %q for the run, want 66.7", v)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#eval-runs tr[data-run-id="`+run.RunID+`"]`))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the run's cases", `document.querySelectorAll('#eval-detail tr[data-case]').length === 3`)
	statuses := eval[[]string](t, ctx, `[...document.querySelectorAll('#eval-detail tr[data-case]')].map(r => r.dataset.case + '=' + r.dataset.status)`)
	if strings.Join(statuses, " ") != "ok-1=passed ok-2=passed nope=failed" {
		t.Errorf("cases %v", statuses)
	}

	// The A/B figures: the table and the charts carry the API's numbers.
	type bar struct {
		Variant, Metric, Label string
		Value                  float64
	}
	bars := eval[[]bar](t, ctx, `[...document.querySelectorAll('article[data-experiment="tone"] svg[data-chart="latency"] rect')].map(r => ({
		variant: r.dataset.variant, metric: r.dataset.metric, value: +r.dataset.value,
		label: document.querySelector('article[data-experiment="tone"] svg[data-chart="latency"] text.value[data-variant="' + r.dataset.variant + '"][data-metric="' + r.dataset.metric + '"]').textContent}))`)
	if len(rep.Experiments) != 1 || len(bars) != 2*len(rep.Experiments[0].Variants) {
		t.Fatalf("latency chart bars %+v for %+v", bars, rep.Experiments)
	}
	for _, v := range rep.Experiments[0].Variants {
		for _, b := range bars {
			if b.Variant == v.Name && b.Metric == "p50Ms" && (b.Value != float64(v.P50Ms) || (v.Turns > 0 && b.Label != fmt.Sprintf("p50 %d ms", v.P50Ms))) {
				t.Errorf("variant %s: the chart draws p50 %v labelled %q; the API says %d ms", v.Name, b.Value, b.Label, v.P50Ms)
			}
		}
		cells := eval[map[string]string](t, ctx, `Object.fromEntries([...document.querySelectorAll('article[data-experiment="tone"] tr[data-variant="`+v.Name+`"] td[data-metric]')].map(c => [c.dataset.metric, c.textContent]))`)
		if cells["sessions"] != fmt.Sprint(v.Sessions) || cells["turns"] != fmt.Sprint(v.Turns) {
			t.Errorf("variant %s: the table shows %v; the API says %d sessions, %d turns", v.Name, cells, v.Sessions, v.Turns)
		}
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('article[data-experiment="tone"] svg[data-chart="failure-difference"] circle.diff').length`); n != 1 {
		t.Errorf("the interval chart draws %d comparisons, want 1", n)
	}
	saveScreenshot(t, ctx, "playground.png")
}

// crossOriginPage is a chat front end on another origin: it starts a
// session with fetch (credentials included, bearer token), follows the
// session's events with EventSource, and continues the session once the
// first turn's events arrived, watching the second turn come in live.
const crossOriginPage = `<!doctype html><meta charset="utf-8"><title>chat</title>
<script>
const q = new URLSearchParams(location.search);
const api = q.get('api'), token = q.get('token');
window.result = {status: 'running', turns: [], events: 0, finished: false};
(async () => {
  let res;
  try {
    res = await fetch(api + '/v1/sessions', {method: 'POST', credentials: 'include',
      headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token},
      body: JSON.stringify({message: 'hello from ' + location.origin})});
  } catch (e) {
    window.result.status = 'fetch refused';
  }
  if (res) {
    const body = await res.json();
    window.result.start = {status: res.status, sessionId: body.sessionId, answer: body.turn.result, requestId: res.headers.get('X-Request-Id')};
    window.result.sessionId = body.sessionId;
    window.result.token = body.continuationToken;
  }
  const sid = window.result.sessionId || q.get('sid');
  const es = new EventSource(api + '/v1/sessions/' + sid + '/events?access_token=' + encodeURIComponent(token), {withCredentials: true});
  es.addEventListener('turn.started', () => { window.result.events++; });
  es.addEventListener('turn.finished', async (ev) => {
    window.result.events++;
    const e = JSON.parse(ev.data);
    window.result.turns.push(e.turn + ':' + e.result);
    if (e.turn === 1) {
      await fetch(api + '/v1/sessions/continue', {method: 'POST', credentials: 'include',
        headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token},
        body: JSON.stringify({continuationToken: window.result.token, message: 'second turn'})});
    } else {
      window.result.status = 'done';
      window.result.finished = true;
      es.close();
    }
  });
  es.onerror = () => {
    if (window.result.status !== 'done') {
      window.result.stream = 'refused';
      window.result.status += ', stream refused';
      window.result.finished = true;
      es.close();
    }
  };
})();
</script>`

// originServer serves crossOriginPage on its own origin.
func originServer(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(crossOriginPage))
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	return srv, "http://127.0.0.1:" + port
}

// TestABrowserClientOnAnAllowedOriginStreamsAndAnotherIsRefused runs a
// chat page from two other origins against a server that allows one.
func TestABrowserClientOnAnAllowedOriginStreamsAndAnotherIsRefused(t *testing.T) {
	t.Parallel()
	const token = "cors-secret"
	_, allowed := originServer(t)
	_, other := originServer(t)
	dir := writeProject(t, "name: chat\nmodel: echo\n")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--auth-token", token, "--cors-origins", allowed, "--state-root", filepath.Join(t.TempDir(), "s"))
	known := start(t, p.url, token, "a session the refused page tries to follow")

	type result struct {
		Status string
		Stream string
		Turns  []string
		Events int
		Start  *struct {
			Status    int
			SessionID string
			Answer    string
			RequestID string
		}
	}
	pageResult := func(origin string) result {
		ctx := browser(t)
		u := origin + "/chat.html?api=" + p.url + "&token=" + token + "&sid=" + known.SessionID
		if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "the page to finish", `window.result && window.result.finished`)
		return eval[result](t, ctx, `window.result`)
	}

	ok := pageResult(allowed)
	if ok.Status != "done" || ok.Start == nil || ok.Start.Status != 201 || ok.Start.RequestID == "" ||
		ok.Start.Answer != "echo: hello from "+allowed || len(ok.Turns) != 2 || ok.Turns[1] != "2:echo: second turn" || ok.Events != 4 {
		t.Errorf("the page on the allowed origin %s got %+v (start %+v); want the session started, both turns' events streamed", allowed, ok, ok.Start)
	}
	bad := pageResult(other)
	if bad.Status != "fetch refused, stream refused" || bad.Start != nil || len(bad.Turns) != 0 {
		t.Errorf("the page on %s (not allowed) got %+v; want its fetch and its event stream refused", other, bad)
	}
	// The refused page started nothing.
	if n := len(listSessions(t, p.url, token)); n != 2 {
		t.Errorf("%d sessions on the server; want the allowed page's and the test's", n)
	}
}
