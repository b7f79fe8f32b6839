package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"agentkit/internal/testenv"
)

// browser starts a headless Chromium (Debian's package, which
// scripts/test.sh installs when missing; AGENTKIT_TEST_CHROMIUM names
// another binary) and returns a tab's context. Without Chromium the test
// skips with a how-to, or fails under CI. extra are more Chromium flags.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
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
	opts = append(opts, extra...)
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

// htmlServer serves page on an origin of its own, http://127.0.0.1:PORT,
// for every path.
func htmlServer(t *testing.T, page string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write([]byte(page))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// rebinder stands for a name whose DNS record an attacker controls: a TCP
// front on 127.0.0.1 that forwards connections to the attacker's web
// server until rebind, and to the victim (the agentkit server) after it.
// Chromium resolves the name to the front (--host-resolver-rules), so the
// page keeps its origin, http://NAME:FRONTPORT, while its requests reach
// the victim, as after a DNS rebinding. A rebind closes the connections
// open so far: the browser needs a new one to reach the new address.
type rebinder struct {
	ln    net.Listener
	mu    sync.Mutex
	to    string
	conns map[net.Conn]bool
}

func newRebinder(t *testing.T, to string) *rebinder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rebinder{ln: ln, to: to, conns: map[net.Conn]bool{}}
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		r.rebind("")
	})
	return r
}

func (r *rebinder) port() string {
	_, p, _ := net.SplitHostPort(r.ln.Addr().String())
	return p
}

func (r *rebinder) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		to := r.to
		r.mu.Unlock()
		up, err := net.Dial("tcp", to)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns[c], r.conns[up] = true, true
		r.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

// rebind points the name at to ("" after the test) and closes the
// connections to the previous address.
func (r *rebinder) rebind(to string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.to = to
	for c := range r.conns {
		c.Close()
		delete(r.conns, c)
	}
}

// rebindingPage is an attacker's page: once its name points at the
// victim, attack() calls the victim's API with same-origin requests (a GET
// carries no Origin, a POST carries the page's own) and records what each
// got.
const rebindingPage = `<!doctype html><meta charset="utf-8"><title>cute cats</title>
<script>
window.ready = true;
window.attack = async (sid) => {
  const probes = [
    ['list', '/v1/sessions', {}],
    ['start', '/v1/sessions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify({message: 'rebound'})}],
    ['events', '/v1/sessions/' + sid, {}],
    ['info', '/v1/info', {}],
    ['health', '/healthz', {}],
    ['metrics', '/metrics', {}],
    ['page', '/', {}],
    ['script', '/playground/app.js', {}],
  ];
  const out = {};
  for (const [name, path, init] of probes) {
    try {
      const res = await fetch(path, Object.assign({cache: 'no-store'}, init));
      const text = await res.text();
      let code = '';
      try { code = JSON.parse(text).error.code; } catch (e) {}
      out[name] = {status: res.status, code: code, text: text.slice(0, 1000)};
    } catch (e) {
      out[name] = {status: 0, text: String(e)};
    }
  }
  window.attackResult = out;
};
</script>`

// TestARebindingPageIsRefusedAndThePlaygroundWorks runs a DNS rebinding
// against agentkit dev (no token) in Chromium: a page on evil.test, a name
// that resolves to 127.0.0.1, loads from the attacker's server; then the
// name is re-pointed at the agentkit server and the page calls the API
// with same-origin requests. Every one is refused (421), nothing is
// started, and the playground on http://127.0.0.1:PORT and
// http://localhost:PORT keeps working.
func TestARebindingPageIsRefusedAndThePlaygroundWorks(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: rebind\n")
	p := startServe(t, dir, nil, "dev", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "s"))
	known := start(t, p.url, "", "a private conversation")
	attacker := htmlServer(t, rebindingPage)
	front := newRebinder(t, strings.TrimPrefix(attacker, "http://"))

	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP evil.test 127.0.0.1"))
	page := "http://evil.test:" + front.port() + "/"
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the attacker's page", `window.ready === true`)
	if origin := eval[string](t, ctx, `location.origin`); origin != strings.TrimSuffix(page, "/") {
		t.Fatalf("the page's origin is %s; want %s", origin, page)
	}
	front.rebind(strings.TrimPrefix(p.url, "http://"))
	eval[bool](t, ctx, `window.attack(`+strconvQuote(known.SessionID)+`), true`)
	waitFor(t, ctx, "the attack's requests", `window.attackResult !== undefined`)
	type answer struct {
		Status int
		Code   string
		Text   string
	}
	got := eval[map[string]answer](t, ctx, `window.attackResult`)
	if len(got) != 8 {
		t.Fatalf("the page recorded %d answers: %+v", len(got), got)
	}
	for name, a := range got {
		if a.Status != 421 || (name != "script" && name != "page" && a.Code != "host_not_allowed") || strings.Contains(a.Text, known.SessionID) || strings.Contains(a.Text, "a private conversation") {
			t.Errorf("the rebound page's %s request got %d %q %q; want 421 host_not_allowed and nothing of the server's data", name, a.Status, a.Code, a.Text)
		}
	}
	if !strings.Contains(got["list"].Text, "evil.test:"+front.port()) || !strings.Contains(got["list"].Text, "--allowed-hosts") {
		t.Errorf("the refusal %q does not name the Host and --allowed-hosts", got["list"].Text)
	}
	if n := len(listSessions(t, p.url, "")); n != 1 {
		t.Errorf("%d sessions on the server after the attack; want the test's one", n)
	}

	// The playground, on the server's own loopback names, in the same
	// browser.
	for _, base := range []string{p.url, "http://localhost:" + portOf(t, p.url)} {
		tab, cancel := chromedp.NewContext(ctx)
		if err := chromedp.Do(tab, chromedp.Navigate(base+"/")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, tab, "the playground on "+base, `document.body.dataset.loaded === 'true' && document.getElementById('error').hidden`)
		rows := eval[[]string](t, tab, `[...document.querySelectorAll('#session-list tr[data-session-id]')].map(r => r.dataset.sessionId)`)
		if len(rows) != 1 || rows[0] != known.SessionID {
			t.Errorf("the playground on %s lists %v; want the session %s", base, rows, known.SessionID)
		}
		cancel()
	}
}

func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// retryingPage is a chat front end on an allowed origin that retries
// safely: it starts a session with an Idempotency-Key and sends the same
// request again (the answer says it is a replay), then sends two messages
// at once to a session whose queue holds one; the one told to come back
// (429) waits Retry-After seconds and sends the same request, key and all,
// again.
const retryingPage = `<!doctype html><meta charset="utf-8"><title>retrying chat</title>
<script>
const api = new URLSearchParams(location.search).get('api');
const headers = (key) => ({'Content-Type': 'application/json', 'Idempotency-Key': key});
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));
window.result = {done: false};
(async () => {
  const r = window.result;
  try {
    const key = 'start-' + crypto.randomUUID();
    const body = JSON.stringify({message: 'keyed from ' + location.origin});
    let res = await fetch(api + '/v1/sessions', {method: 'POST', headers: headers(key), body});
    const first = await res.json();
    r.first = {status: res.status, sessionId: first.sessionId, replayed: res.headers.get('Idempotent-Replayed')};
    res = await fetch(api + '/v1/sessions', {method: 'POST', headers: headers(key), body});
    const again = await res.json();
    r.retry = {status: res.status, sessionId: again.sessionId, replayed: res.headers.get('Idempotent-Replayed')};
    const send = async (message) => {
      const key = 'message-' + message + '-' + crypto.randomUUID();
      const body = JSON.stringify({continuationToken: first.continuationToken, message});
      const out = {message, statuses: [], retryAfter: []};
      for (let i = 0; i < 20; i++) {
        const res = await fetch(api + '/v1/sessions/continue', {method: 'POST', headers: headers(key), body});
        out.statuses.push(res.status);
        if (res.status !== 429) break;
        const after = res.headers.get('Retry-After');
        out.retryAfter.push(after);
        await sleep(1000 * (Number(after) || 10));
      }
      return out;
    };
    r.messages = await Promise.all([send('two'), send('three')]);
  } catch (e) {
    r.error = String(e);
  }
  r.done = true;
})();
</script>`

// TestABrowserClientOnAnAllowedOriginRetriesSafely runs retryingPage in
// Chromium against serve in serving mode ledger (over a SQLite store, a
// queue of one message per session, turns of 1 s): the preflight must
// allow Idempotency-Key, and the page must read Idempotent-Replayed and
// the Retry-After of a 429.
func TestABrowserClientOnAnAllowedOriginRetriesSafely(t *testing.T) {
	t.Parallel()
	origin := htmlServer(t, retryingPage)
	dir := writeProject(t, `name: retry
model:
  provider: echo
  echo:
    script:
      - text: "slow: {{.UserMessage}}"
        delay: 1s
serving: ledger
ledger:
  maxPending: 1
  retryAfter: 1s
`)
	tmp := t.TempDir()
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--cors-origins", origin, "--storage", "sqlite:"+filepath.Join(tmp, "store.db"), "--state-root", filepath.Join(tmp, "s"))
	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(origin+"/chat.html?api="+p.url)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the page to finish", `window.result.done`)
	type keyed struct {
		Status    int
		SessionID string
		Replayed  *string
	}
	type message struct {
		Message    string
		Statuses   []int
		RetryAfter []*string
	}
	type result struct {
		Error    string
		First    keyed
		Retry    keyed
		Messages []message
	}
	got := eval[result](t, ctx, `window.result`)
	t.Logf("the page got: %+v", got)
	if got.Error != "" {
		t.Fatalf("the page on %s failed: %s (a preflight that does not allow Idempotency-Key makes fetch fail)", origin, got.Error)
	}
	if got.First.Status != 201 || got.First.Replayed != nil {
		t.Errorf("the keyed start: %+v; want 201 without Idempotent-Replayed", got.First)
	}
	if got.Retry.Status != 201 || got.Retry.SessionID != got.First.SessionID || got.Retry.Replayed == nil || *got.Retry.Replayed != "true" {
		t.Errorf("the keyed retry: %+v; want 201, the same session, and Idempotent-Replayed: true readable by the page", got.Retry)
	}
	told := 0
	for _, m := range got.Messages {
		if len(m.Statuses) == 0 || m.Statuses[len(m.Statuses)-1] != 200 {
			t.Errorf("message %s: statuses %v; want it answered 200 in the end", m.Message, m.Statuses)
		}
		for i, st := range m.Statuses[:max(len(m.Statuses)-1, 0)] {
			if st != 429 || m.RetryAfter[i] == nil || *m.RetryAfter[i] != "1" {
				t.Errorf("message %s: answer %d was %d with Retry-After %v; want 429 with Retry-After: 1 readable by the page", m.Message, i, st, m.RetryAfter[i])
			}
			told++
		}
	}
	if told == 0 {
		t.Errorf("no message was told to come back (429) though two went at once to a queue of one: %+v", got.Messages)
	}
	// Every message ran once: the start, two and three.
	var s struct {
		Session struct{ Turns int } `json:"session"`
	}
	if st := call(t, "GET", p.url+"/v1/sessions/"+got.First.SessionID, "", "", &s); st != 200 || s.Session.Turns != 3 {
		t.Errorf("the session: %d, %d turns; want 3", st, s.Session.Turns)
	}
}

// TestPlaygroundFitsA1280By800Window loads the playground in a 1280x800
// window with sessions whose titles and channels are long (a URL, a slug)
// and an eval run: no column of the sessions or eval-run tables may end
// past its scroll box or the window; the run's host cell explains the host
// with what the API gives (no "undefined"); the page's icon loads and
// /favicon.ico answers without a 404.
func TestPlaygroundFitsA1280By800Window(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: layout\n")
	p := startServe(t, dir, nil, "dev", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(t.TempDir(), "s"))
	for _, body := range []string{
		`{"message": "a", "title": "a title of some length about the refund of order 42 and a few more words to wrap"}`,
		`{"message": "b", "channelId": "support-widget-eu-west-1", "title": "https://shop.example.com/orders/42/refund-request-with-a-long-slug-and-no-spaces"}`,
		`{"message": "c"}`,
	} {
		if st := call(t, "POST", p.url+"/v1/sessions", "", body, nil); st != 201 {
			t.Fatalf("POST /v1/sessions %s: %d", body, st)
		}
	}
	var run struct {
		RunID  string `json:"runId"`
		Status string `json:"status"`
		Host   struct {
			ID   string `json:"id"`
			Name string `json:"name"`
			PID  int    `json:"pid"`
		} `json:"host"`
	}
	if st := call(t, "POST", p.url+"/v1/evals", "", `{"name": "a-run-name-that-is-long-and-has-no-spaces-at-all", "cases": [{"name": "c", "input": "x", "expect": {"contains": "x"}}]}`, &run); st != 202 {
		t.Fatalf("POST /v1/evals: %d", st)
	}
	for deadline := time.Now().Add(30 * time.Second); run.Status != "finished"; time.Sleep(50 * time.Millisecond) {
		call(t, "GET", p.url+"/v1/evals/"+run.RunID, "", "", &run)
		if time.Now().After(deadline) {
			t.Fatalf("run not finished: %+v", run)
		}
	}
	if run.Host.Name == "" || run.Host.PID == 0 {
		t.Fatalf("the run's host: %+v", run.Host)
	}

	ctx := browser(t)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800), chromedp.Navigate(p.url+"/")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the page to load", `document.body.dataset.loaded === 'true' && document.querySelectorAll('#session-list tr[data-session-id]').length === 4 && document.querySelector('#eval-runs tr[data-run-id]') !== null`)
	type box struct {
		Table                    string
		Rows                     int
		LastRight, BoxRight      float64
		ScrollWidth, ClientWidth int
		Viewport                 int
	}
	boxes := eval[[]box](t, ctx, `['session-list', 'eval-runs'].map((id) => {
		const table = document.getElementById(id), scroll = table.closest('.scroll');
		const rows = [...table.querySelectorAll('tr')];
		return {table: id, rows: rows.length,
			lastRight: Math.max(...rows.map((r) => r.lastElementChild.getBoundingClientRect().right)),
			boxRight: scroll.getBoundingClientRect().right,
			scrollWidth: scroll.scrollWidth, clientWidth: scroll.clientWidth,
			viewport: document.documentElement.clientWidth};
	})`)
	saveScreenshot(t, ctx, "playground-1280x800.png")
	for _, b := range boxes {
		if b.Rows < 2 || b.Viewport != 1280 {
			t.Fatalf("%s: %+v", b.Table, b)
		}
		if b.LastRight > b.BoxRight+0.5 || b.LastRight > float64(b.Viewport) || b.ScrollWidth > b.ClientWidth {
			t.Errorf("the %s table's last column ends at %.1f px, past its box (%.1f px, %d of %d px scrollable) or the window (%d px)",
				b.Table, b.LastRight, b.BoxRight, b.ScrollWidth, b.ClientWidth, b.Viewport)
		}
	}
	title := eval[string](t, ctx, `document.querySelector('#eval-runs tr[data-run-id="`+run.RunID+`"]').lastElementChild.title`)
	if want := fmt.Sprintf("machine %s, process %d", run.Host.Name, run.Host.PID); title != want {
		t.Errorf("the run's host cell's tooltip reads %q; want %q", title, want)
	}
	type fetched struct {
		Status int
		Type   string
	}
	icons, err := chromedp.Run(ctx, chromedp.Evaluate[[]fetched](`Promise.all([document.querySelector('link[rel="icon"]').href, '/favicon.ico'].map((u) =>
		fetch(u, {cache: 'no-store'}).then((r) => ({status: r.status, type: r.headers.get('Content-Type') || ''}))))`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if len(icons) != 2 || icons[0].Status != 200 || icons[0].Type != "image/svg+xml" || icons[1].Status != 204 {
		t.Errorf("the page's icon and /favicon.ico: %+v; want 200 image/svg+xml and 204", icons)
	}
}
