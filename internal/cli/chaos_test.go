package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"agentkit/internal/testenv"
)

// The process-level fault test of serving mode ledger (docs/ledger.md,
// "How it is tested"): three agentkit serve --serving ledger processes on
// one real store, each reaching it through a proxy the test can cut; a
// client sending messages over many sessions to random hosts, retrying
// every failure with the same Idempotency-Key; a chaos loop that SIGKILLs
// and restarts hosts, SIGSTOPs one past the lease, cuts one host from the
// store and takes the store away from all of them. Afterwards every
// acknowledged message must be in the committed transcript exactly once,
// read through each host, in the order it was sent, with no gaps, and no
// message may appear twice or out of nowhere.
//
// Settings (environment):
//
//	AGENTKIT_CHAOS_DURATION  how long the load runs per store (default 25s)
//	AGENTKIT_CHAOS_BACKENDS  the stores, comma-separated (default postgres,redis,nats)
//	AGENTKIT_CHAOS_SESSIONS  the number of sessions (default 24)
//	AGENTKIT_CHAOS_WORKERS   concurrent client workers (default 12)
//	AGENTKIT_CHAOS_LEASE     the ledger lease (default 1s)

// chaosLease is the lease of the hosts under test, short so that a paused
// or killed holder is replaced quickly.
func chaosSettings(t *testing.T) (d time.Duration, backends []string, sessions, workers int, lease time.Duration) {
	t.Helper()
	d, lease = 25*time.Second, time.Second
	backends = []string{"postgres", "redis", "nats"}
	sessions, workers = 24, 12
	if v := os.Getenv("AGENTKIT_CHAOS_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("AGENTKIT_CHAOS_DURATION=%q: use a duration such as 30m", v)
		}
	}
	if v := os.Getenv("AGENTKIT_CHAOS_LEASE"); v != "" {
		var err error
		if lease, err = time.ParseDuration(v); err != nil || lease < 200*time.Millisecond {
			t.Fatalf("AGENTKIT_CHAOS_LEASE=%q: use a duration of 200ms or more, such as 2s", v)
		}
	}
	if v := os.Getenv("AGENTKIT_CHAOS_BACKENDS"); v != "" {
		backends = strings.Split(v, ",")
	}
	for _, c := range []struct {
		name string
		n    *int
	}{{"AGENTKIT_CHAOS_SESSIONS", &sessions}, {"AGENTKIT_CHAOS_WORKERS", &workers}} {
		if v := os.Getenv(c.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: use a positive number", c.name, v)
			}
			*c.n = n
		}
	}
	return
}

func TestLedgerChaos(t *testing.T) {
	d, backends, sessions, workers, lease := chaosSettings(t)
	for _, b := range backends {
		t.Run(b, func(t *testing.T) {
			var store string
			switch b {
			case "postgres":
				store, _ = postgresURL(t)
			case "redis":
				store = redisChaosURL(t)
			case "nats":
				store = natsChaosURL(t)
			default:
				t.Fatalf("AGENTKIT_CHAOS_BACKENDS: unknown store %q; use postgres, redis or nats", b)
			}
			runChaos(t, store, chaosConfig{duration: d, sessions: sessions, workers: workers, lease: lease})
		})
	}
}

// redisChaosURL returns the test Redis's URL with a key prefix of its own,
// whose keys are deleted when the test ends.
func redisChaosURL(t *testing.T) string {
	t.Helper()
	base := testenv.Getenv("AGENTKIT_TEST_REDIS", "redis://127.0.0.1:6379/0")
	o, err := redis.ParseURL(base)
	if err != nil {
		t.Fatalf("AGENTKIT_TEST_REDIS %q: %v", base, err)
	}
	c := redis.NewClient(o)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		testenv.Unavailable(t, "Redis at "+base, "Start Redis or set AGENTKIT_TEST_REDIS to a redis:// URL.", err)
	}
	prefix := "agentkit-chaos:" + strconv.FormatUint(rand.Uint64(), 36) + ":"
	t.Cleanup(func() {
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var keys []string
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		for len(keys) > 0 {
			n := min(len(keys), 1000)
			c.Unlink(ctx, keys[:n]...)
			keys = keys[n:]
		}
	})
	return withParam(t, base, "prefix", prefix)
}

// natsChaosURL returns the test NATS's URL with a bucket of its own,
// deleted when the test ends.
func natsChaosURL(t *testing.T) string {
	t.Helper()
	base := testenv.Getenv("AGENTKIT_TEST_NATS", "nats://127.0.0.1:4222")
	nc, err := nats.Connect(base, nats.Timeout(2*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS at "+base, "Start nats-server -js or set AGENTKIT_TEST_NATS.", err)
	}
	bucket := "agentkit_chaos_" + strconv.FormatUint(rand.Uint64(), 36)
	t.Cleanup(func() {
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js.DeleteKeyValue(ctx, bucket)
	})
	return withParam(t, base, "bucket", bucket)
}

func withParam(t *testing.T, raw, k, v string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

type chaosConfig struct {
	duration          time.Duration
	sessions, workers int
	lease             time.Duration
}

// chaosHost is one agentkit serve process slot: restarted on the same
// port and state root, reaching the store through its own proxy.
type chaosHost struct {
	name  string
	root  string
	addr  string
	store string // the store URL through the proxy
	proxy *switchProxy

	mu     sync.Mutex
	p      *proc
	paused bool
}

func (h *chaosHost) url() string { return "http://" + h.addr }

// chaosStats are the figures of a run.
type chaosStats struct {
	requests, ok200, ok201, queued202, errors, busy429, timeouts, duplicates atomic.Int64
	kills, pauses, cuts, storeDowns                                          int

	mu     sync.Mutex
	status map[string]int // failed attempts by status code or error
}

func (st *chaosStats) failed(what string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.status == nil {
		st.status = map[string]int{}
	}
	st.status[what]++
}

// sentMessage is one message the client sent: its session index and
// number, its key, and whether a host acknowledged it.
type sentMessage struct {
	key   string
	acked bool
}

// clientSession is the client's record of one session.
type clientSession struct {
	index int
	id    string
	token string
	sent  []sentMessage // by message number
}

func runChaos(t *testing.T, store string, cfg chaosConfig) {
	name := "chaos" + strconv.FormatUint(rand.Uint64()%1e6, 10)
	dir := writeProject(t, fmt.Sprintf(`name: %s
model:
  provider: echo
ledger:
  lease: %s
  maxAttempts: 1000
`, name, cfg.lease))
	su, err := url.Parse(store)
	if err != nil {
		t.Fatal(err)
	}
	hosts := make([]*chaosHost, 3)
	for i := range hosts {
		proxy := newSwitchProxy(t, su.Host)
		via := *su
		via.Host = proxy.Addr()
		hosts[i] = &chaosHost{name: fmt.Sprintf("h%d", i), root: t.TempDir(), store: via.String(), proxy: proxy}
	}
	start := func(h *chaosHost) {
		t.Helper()
		addr := "127.0.0.1:0"
		if h.addr != "" {
			addr = h.addr
		}
		args := []string{"serve", "--serving", "ledger", "--storage", h.store, "--state-root", h.root, "--log-level", "warn", "--shutdown-timeout", "5s"}
		p, err := launch(t, agentkitBin, dir, nil, append(args, "--addr", addr)...)
		if err != nil && addr != "127.0.0.1:0" {
			// The port was taken meanwhile (by another connection's
			// ephemeral port): the host comes back on another one.
			t.Logf("restarting %s on %s failed, restarting it on a new port: %v", h.name, addr, tail(err.Error(), 300))
			p, err = launch(t, agentkitBin, dir, nil, append(args, "--addr", "127.0.0.1:0")...)
		}
		if err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		h.p = p
		h.addr = strings.TrimPrefix(p.url, "http://")
		h.mu.Unlock()
	}
	for _, h := range hosts {
		start(h)
	}

	var st chaosStats
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections()
	sessions := make([]*clientSession, cfg.sessions)
	for i := range sessions {
		sessions[i] = &clientSession{index: i}
	}
	runStart := time.Now()
	loadCtx, stopLoad := context.WithTimeout(context.Background(), cfg.duration)
	defer stopLoad()
	// giveUp bounds the retries of the message in flight when the load
	// ends: the chaos has stopped by then, so a message that cannot be
	// acknowledged within it is a failure of the hosts.
	giveUp := make(chan struct{})
	var wg sync.WaitGroup
	for w := range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(runStart.UnixNano())))
			var mine []*clientSession
			for i := w; i < len(sessions); i += cfg.workers {
				mine = append(mine, sessions[i])
			}
			for k := 0; loadCtx.Err() == nil; k++ {
				s := mine[k%len(mine)]
				if !sendNext(client, hosts, name, s, rng, &st, giveUp) {
					return
				}
			}
		}()
	}

	// The chaos loop, in the test's goroutine.
	rng := rand.New(rand.NewPCG(7, uint64(runStart.UnixNano())))
	pauseFor := cfg.lease + cfg.lease/5 + cfg.lease + 500*time.Millisecond // past lease + margin + a janitor scan
	sleep := func(d time.Duration) {
		select {
		case <-loadCtx.Done():
		case <-time.After(d):
		}
	}
	sleep(cfg.lease)
	for loadCtx.Err() == nil {
		h := hosts[rng.IntN(len(hosts))]
		switch action := rng.IntN(10); {
		case action < 4: // SIGKILL, then a restart on the same port and state root
			h.mu.Lock()
			p := h.p
			h.mu.Unlock()
			p.cmd.Process.Kill()
			<-p.exited
			st.kills++
			time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
			start(h)
		case action < 7: // SIGSTOP past the lease, then SIGCONT
			h.mu.Lock()
			p := h.p
			h.paused = true
			h.mu.Unlock()
			p.cmd.Process.Signal(syscall.SIGSTOP)
			st.pauses++
			time.Sleep(pauseFor)
			p.cmd.Process.Signal(syscall.SIGCONT)
			h.mu.Lock()
			h.paused = false
			h.mu.Unlock()
		case action < 9: // one host cut from the store past the lease
			h.proxy.setDown(true)
			st.cuts++
			time.Sleep(pauseFor)
			h.proxy.setDown(false)
		default: // the store away from every host
			for _, h := range hosts {
				h.proxy.setDown(true)
			}
			st.storeDowns++
			time.Sleep(cfg.lease)
			for _, h := range hosts {
				h.proxy.setDown(false)
			}
		}
		sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
	}
	// The load is over: every host runs and reaches the store; the message
	// in flight of each session gets a minute to be acknowledged.
	timer := time.AfterFunc(time.Minute, func() { close(giveUp) })
	wg.Wait()
	timer.Stop()
	loadTime := time.Since(runStart)

	var acked, sent int
	for _, s := range sessions {
		for _, m := range s.sent {
			sent++
			if m.acked {
				acked++
			}
		}
	}
	t.Logf("load: %s, %d sessions, %d messages sent, %d acknowledged (%d answered 200/201, %d 202); %d requests, %d errors or timeouts, %d 429, %d duplicates answered; chaos: %d kills, %d pauses past the lease, %d cuts of one host from the store, %d store outages",
		loadTime.Round(time.Second), len(sessions), sent, acked, st.ok200.Load()+st.ok201.Load(), st.queued202.Load(), st.requests.Load(),
		st.errors.Load()+st.timeouts.Load(), st.busy429.Load(), st.duplicates.Load(), st.kills, st.pauses, st.cuts, st.storeDowns)
	t.Logf("failed attempts, each retried: %v", st.status)
	if acked < cfg.sessions {
		t.Fatalf("only %d messages acknowledged: the hosts did not serve", acked)
	}

	// Wait until every acknowledged message is committed, as host 0 reads
	// it, then check every host's view.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		views := readViews(t, client, hosts[:1], sessions)
		problems := checkChaos(sessions, views, false)
		if len(problems) == 0 {
			break
		}
		// Committed turns never change: anything but a missing message
		// (its turn not committed yet) is final.
		if i := slices.IndexFunc(problems, func(p string) bool { return !strings.Contains(p, "is missing") }); i >= 0 {
			t.Fatalf("%d problems in the committed transcripts:\n%s", len(problems), strings.Join(clip(problems, 30), "\n"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("two minutes after the load, the transcripts are still wrong:\n%s", strings.Join(clip(problems, 30), "\n"))
		}
		time.Sleep(200 * time.Millisecond) // polling for the queued turns to commit
	}
	views := readViews(t, client, hosts, sessions)
	if problems := checkChaos(sessions, views, true); len(problems) > 0 {
		t.Fatalf("%d problems in the committed transcripts:\n%s", len(problems), strings.Join(clip(problems, 30), "\n"))
	}
	var dl struct {
		DeadLetters []json.RawMessage `json:"deadLetters"`
	}
	if code := getJSON(client, hosts[0].url()+"/v1/deadletters", &dl); code != 200 || len(dl.DeadLetters) != 0 {
		t.Errorf("GET /v1/deadletters: %d, %d dead letters; want none", code, len(dl.DeadLetters))
	}
	var takeovers, fenced, acks float64
	for _, h := range hosts {
		takeovers += metric(t, h.p, "agentkit_ledger_takeovers_total")
		fenced += metric(t, h.p, "agentkit_ledger_fenced_commits_total")
		acks += metric(t, h.p, "agentkit_ledger_ack_duration_seconds_count")
	}
	if acks == 0 {
		t.Error("no host observed an acknowledgement in agentkit_ledger_ack_duration_seconds")
	}
	t.Logf("checked: %d acknowledged messages each exactly once, in order, with no gaps, through each of the 3 hosts; no dead letters; the hosts running at the end count %v takeovers and %v fenced commits since their last start; %s in all",
		acked, takeovers, fenced, time.Since(runStart).Round(time.Second))
}

// sendNext sends the session's next message (its first starts the
// session), retrying on random hosts with the same key until a host
// acknowledges it (200, 201 or 202). It returns false when giveUp closes
// first.
func sendNext(client *http.Client, hosts []*chaosHost, agentName string, s *clientSession, rng *rand.Rand, st *chaosStats, giveUp <-chan struct{}) bool {
	n := len(s.sent)
	key := fmt.Sprintf("%s-s%d-m%d", agentName, s.index, n)
	text := fmt.Sprintf("s%d-m%d", s.index, n)
	s.sent = append(s.sent, sentMessage{key: key})
	for attempt := 0; ; attempt++ {
		select {
		case <-giveUp:
			return false
		default:
		}
		h := hosts[rng.IntN(len(hosts))]
		h.mu.Lock()
		base := h.url()
		h.mu.Unlock()
		path, body := "/v1/sessions/continue", fmt.Sprintf(`{"continuationToken":%q,"message":%q}`, s.token, text)
		if n == 0 {
			path, body = "/v1/sessions", fmt.Sprintf(`{"message":%q}`, text)
		}
		timeout := 5 * time.Second
		if attempt == 0 && rng.IntN(20) == 0 {
			timeout = time.Duration(1+rng.IntN(30)) * time.Millisecond // a client that gives up early, then retries
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		req, _ := http.NewRequestWithContext(ctx, "POST", base+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		st.requests.Add(1)
		resp, err := client.Do(req)
		var data []byte
		if err == nil {
			data, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				st.timeouts.Add(1)
				st.failed("timeout")
			} else {
				st.errors.Add(1)
				st.failed("connection error")
			}
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
			continue
		}
		switch resp.StatusCode {
		case http.StatusOK, http.StatusCreated, http.StatusAccepted:
			var a struct {
				SessionID         string `json:"sessionId"`
				ContinuationToken string `json:"continuationToken"`
				Replayed          bool   `json:"replayed"`
			}
			json.Unmarshal(data, &a)
			if n == 0 {
				if a.SessionID == "" || a.ContinuationToken == "" {
					// A start answered without its token: retry the key
					// until an answer carries it.
					continue
				}
				s.id, s.token = a.SessionID, a.ContinuationToken
			}
			switch resp.StatusCode {
			case http.StatusOK:
				st.ok200.Add(1)
			case http.StatusCreated:
				st.ok201.Add(1)
			default:
				st.queued202.Add(1)
			}
			if a.Replayed || resp.Header.Get("Idempotent-Replayed") == "true" {
				st.duplicates.Add(1)
			}
			s.sent[n].acked = true
			return true
		case http.StatusTooManyRequests:
			st.busy429.Add(1)
			st.failed("429")
			time.Sleep(time.Duration(200+rng.IntN(300)) * time.Millisecond)
		default:
			st.errors.Add(1)
			var e struct {
				Error struct{ Code string }
			}
			json.Unmarshal(data, &e)
			st.failed(fmt.Sprintf("%d %s", resp.StatusCode, e.Error.Code))
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
		}
	}
}

// turnView is one committed turn as a host reads it: its number, the
// message that started it and that message's event id.
type turnView struct {
	turn    int64
	message string
	eventID string
	// seqs are the turn's event sequence numbers, for the gap check.
	seqs []int64
}

// readViews reads every session's transcript through each host.
func readViews(t *testing.T, client *http.Client, hosts []*chaosHost, sessions []*clientSession) map[string]map[string][]turnView {
	t.Helper()
	views := map[string]map[string][]turnView{}
	for _, h := range hosts {
		v := map[string][]turnView{}
		for _, s := range sessions {
			if s.id == "" {
				continue
			}
			turns, err := readTranscript(client, h.url(), s.id)
			if err != nil {
				t.Fatalf("reading session %s through %s: %v", s.id, h.name, err)
			}
			v[s.id] = turns
		}
		views[h.name] = v
	}
	return views
}

func getJSON(client *http.Client, u string, out any) int {
	for range 5 {
		resp, err := client.Get(u)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		json.Unmarshal(data, out)
		return resp.StatusCode
	}
	return 0
}

// readTranscript pages a session's events and folds them into turns.
func readTranscript(client *http.Client, base, id string) ([]turnView, error) {
	var turns []turnView
	for after := int64(0); ; {
		var page struct {
			Events []struct {
				Seq     int64  `json:"seq"`
				Type    string `json:"type"`
				Turn    int64  `json:"turn"`
				Message string `json:"message"`
				EventID string `json:"eventId"`
			} `json:"events"`
			Next int64 `json:"next"`
			More bool  `json:"more"`
		}
		code := getJSON(client, fmt.Sprintf("%s/v1/sessions/%s/events?after=%d&limit=1000", base, url.PathEscape(id), after), &page)
		if code == http.StatusNotFound {
			return nil, nil // not committed anywhere yet
		}
		if code != http.StatusOK {
			return nil, fmt.Errorf("GET events: status %d", code)
		}
		for _, ev := range page.Events {
			if ev.Type == "turn.started" {
				turns = append(turns, turnView{turn: ev.Turn, message: ev.Message, eventID: ev.EventID})
			}
			if len(turns) == 0 || turns[len(turns)-1].turn != ev.Turn {
				turns = append(turns, turnView{turn: ev.Turn}) // an event without its turn.started: reported as a gap
			}
			turns[len(turns)-1].seqs = append(turns[len(turns)-1].seqs, ev.Seq)
		}
		if !page.More {
			return turns, nil
		}
		after = page.Next
	}
}

// checkChaos checks the transcripts against what the client sent. Each
// view (host) must hold, for each session: turns 1, 2, 3… and event
// sequence numbers 1, 2, 3… without gaps; each turn started by one of the
// session's messages, under its key; every acknowledged message exactly
// once; no message twice; the messages in the order they were sent. With
// same, every view must also be the same.
func checkChaos(sessions []*clientSession, views map[string]map[string][]turnView, same bool) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	names := make([]string, 0, len(views))
	for name := range views {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, host := range names {
		for _, s := range sessions {
			if s.id == "" {
				add("session %d: never started (its first message was never acknowledged)", s.index)
				continue
			}
			turns := views[host][s.id]
			seen := map[int]int{} // message number → turn
			last, nextSeq := -1, int64(1)
			for i, tv := range turns {
				if tv.turn != int64(i+1) {
					add("%s: session %d: turn %d where turn %d belongs: a gap or a repeat", host, s.index, tv.turn, i+1)
				}
				for _, q := range tv.seqs {
					if q != nextSeq {
						add("%s: session %d: event seq %d where %d belongs", host, s.index, q, nextSeq)
					}
					nextSeq = q + 1
				}
				var si, mi int
				if _, err := fmt.Sscanf(tv.message, "s%d-m%d", &si, &mi); err != nil || si != s.index || mi < 0 || mi >= len(s.sent) {
					add("%s: session %d: turn %d has message %q, which the client never sent to this session", host, s.index, tv.turn, tv.message)
					continue
				}
				if tv.eventID != s.sent[mi].key {
					add("%s: session %d: turn %d (message %d) has event id %q, not its key %q", host, s.index, tv.turn, mi, tv.eventID, s.sent[mi].key)
				}
				if prev, dup := seen[mi]; dup {
					add("%s: session %d: message %d is in turns %d and %d: consumed twice", host, s.index, mi, prev, tv.turn)
				}
				seen[mi] = int(tv.turn)
				if mi < last {
					add("%s: session %d: message %d after message %d: out of the order they were sent", host, s.index, mi, last)
				}
				last = mi
			}
			for mi, m := range s.sent {
				if _, ok := seen[mi]; !ok && m.acked {
					add("%s: session %d: acknowledged message %d (%s) is missing", host, s.index, mi, m.key)
				}
			}
		}
	}
	if same && len(names) > 1 {
		for _, s := range sessions {
			a := views[names[0]][s.id]
			for _, host := range names[1:] {
				b := views[host][s.id]
				if !slices.EqualFunc(a, b, func(x, y turnView) bool {
					return x.turn == y.turn && x.message == y.message && x.eventID == y.eventID && slices.Equal(x.seqs, y.seqs)
				}) {
					add("session %d: %s and %s read different transcripts (%d and %d turns)", s.index, names[0], host, len(a), len(b))
				}
			}
		}
	}
	return problems
}

func clip(lines []string, n int) []string {
	if len(lines) > n {
		return append(lines[:n:n], fmt.Sprintf("… and %d more", len(lines)-n))
	}
	return lines
}

// TestChaosCheckerCatchesLossDuplicatesAndGaps feeds the fault test's
// checker transcripts with one fault each, so a checker that stopped
// looking would be caught.
func TestChaosCheckerCatchesLossDuplicatesAndGaps(t *testing.T) {
	sessions := []*clientSession{{index: 0, id: "a", sent: []sentMessage{{key: "k0", acked: true}, {key: "k1", acked: true}, {key: "k2", acked: false}}}}
	good := func() []turnView {
		return []turnView{
			{turn: 1, message: "s0-m0", eventID: "k0", seqs: []int64{1, 2}},
			{turn: 2, message: "s0-m1", eventID: "k1", seqs: []int64{3, 4}},
		}
	}
	view := func(turns []turnView) map[string]map[string][]turnView {
		return map[string]map[string][]turnView{"h0": {"a": turns}, "h1": {"a": good()}}
	}
	if p := checkChaos(sessions, view(good()), true); len(p) != 0 {
		t.Fatalf("a correct transcript: %v", p)
	}
	// A message not acknowledged may be committed once.
	withUnacked := append(good(), turnView{turn: 3, message: "s0-m2", eventID: "k2", seqs: []int64{5, 6}})
	if p := checkChaos(sessions, map[string]map[string][]turnView{"h0": {"a": withUnacked}}, true); len(p) != 0 {
		t.Fatalf("a committed message that was not acknowledged: %v", p)
	}
	for name, c := range map[string]struct {
		turns []turnView
		want  string
	}{
		"lost":      {good()[:1], "acknowledged message 1 (k1) is missing"},
		"doubled":   {append(good(), turnView{turn: 3, message: "s0-m1", eventID: "k1", seqs: []int64{5, 6}}), "consumed twice"},
		"gap":       {[]turnView{good()[0], {turn: 3, message: "s0-m1", eventID: "k1", seqs: []int64{3, 4}}}, "a gap"},
		"seq gap":   {[]turnView{good()[0], {turn: 2, message: "s0-m1", eventID: "k1", seqs: []int64{4, 5}}}, "event seq 4 where 3 belongs"},
		"reordered": {[]turnView{{turn: 1, message: "s0-m1", eventID: "k1", seqs: []int64{1, 2}}, {turn: 2, message: "s0-m0", eventID: "k0", seqs: []int64{3, 4}}}, "out of the order"},
		"phantom":   {append(good(), turnView{turn: 3, message: "s1-m0", eventID: "x", seqs: []int64{5, 6}}), "never sent"},
		"wrong key": {[]turnView{good()[0], {turn: 2, message: "s0-m1", eventID: "k9", seqs: []int64{3, 4}}}, "not its key"},
	} {
		p := checkChaos(sessions, view(c.turns), true)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: the checker said %q; want a problem containing %q", name, p, c.want)
		}
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, "read different transcripts") }) {
			t.Errorf("%s: the checker did not see that h0 and h1 differ: %q", name, p)
		}
	}
}
