package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// level is what one concurrency level measured over its rounds.
type level struct {
	clients   int
	floor     bool            // the disk's own floor (diskFloor), not turns
	latencies []time.Duration // one per completed turn
	elapsed   time.Duration   // the level's measured time, over its rounds
	errors    int
	firstErr  error
}

// throughput is completed turns per second.
func (l *level) throughput() float64 {
	if l.elapsed <= 0 {
		return 0
	}
	return float64(len(l.latencies)) / l.elapsed.Seconds()
}

// quantile returns the q-quantile of the sorted latencies (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// turnAnswer is the part of a turn's answer the clients read.
type turnAnswer struct {
	SessionID         string `json:"sessionId"`
	ContinuationToken string `json:"continuationToken"`
	Turn              struct {
		Status string `json:"status"`
		Result string `json:"result"`
	} `json:"turn"`
}

// client is one simulated user: its session and the HTTP client.
type client struct {
	base    string
	http    *http.Client
	message string
	turns   int // per session
	token   string
	done    int // turns in the current session
}

// turn runs one turn: a start when the session is new or done, a
// continue otherwise. It checks the answer is the echo of the message.
func (c *client) turn(ctx context.Context) error {
	path, body := "/v1/sessions", map[string]any{"message": c.message}
	want := http.StatusCreated
	if c.token != "" && c.done < c.turns {
		path, body = "/v1/sessions/continue", map[string]any{"continuationToken": c.token, "message": c.message}
		want = http.StatusOK
	}
	data, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, strings.TrimSpace(string(raw)))
	}
	var a turnAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("POST %s: the answer is not a turn's: %w", path, err)
	}
	if a.Turn.Status != "completed" || a.ContinuationToken == "" {
		return fmt.Errorf("POST %s: the turn ended %q: %.80s", path, a.Turn.Status, a.Turn.Result)
	}
	if path == "/v1/sessions" {
		c.token, c.done = a.ContinuationToken, 0
	}
	c.done++
	return nil
}

// measure runs the warm-up, then every level for cfg.duration, cfg.rounds
// times, alternating.
func measure(ctx context.Context, base string, cfg config, floorDir string, info io.Writer) ([]*level, error) {
	most := slices.Max(cfg.clients)
	tr := &http.Transport{MaxIdleConns: most, MaxIdleConnsPerHost: most, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	msg := strings.Repeat("load ", cfg.messageBytes/5+1)[:cfg.messageBytes]
	if err := ping(ctx, hc, base); err != nil {
		return nil, err
	}
	if cfg.warmup > 0 {
		fmt.Fprintf(info, "load: warming up with %d clients for %s\n", most, cfg.warmup)
		w := &level{clients: most}
		drive(ctx, base, hc, msg, cfg.turns, w, cfg.warmup)
		if w.errors > 0 {
			return nil, fmt.Errorf("%d requests failed while warming up; the first: %v", w.errors, w.firstErr)
		}
	}
	levels := make([]*level, len(cfg.clients))
	for i, n := range cfg.clients {
		levels[i] = &level{clients: n}
	}
	var floor *level
	for r := range cfg.rounds {
		for _, l := range levels {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			fmt.Fprintf(info, "load: round %d, %d clients for %s\n", r+1, l.clients, cfg.duration)
			drive(ctx, base, hc, msg, cfg.turns, l, cfg.duration)
		}
		if floorDir != "" {
			fmt.Fprintf(info, "load: round %d, the disk's floor, %d writers for %s\n", r+1, most, cfg.duration)
			f, err := diskFloor(ctx, floorDir, most, cfg.duration)
			if err != nil {
				return nil, fmt.Errorf("the disk's floor: %w", err)
			}
			if floor == nil {
				floor = f
				floor.floor = true
			} else {
				floor.latencies = append(floor.latencies, f.latencies...)
				floor.elapsed += f.elapsed
				floor.errors += f.errors
			}
		}
	}
	if floor != nil {
		levels = append(levels, floor)
	}
	return levels, nil
}

// ping checks the server answers before any load.
func ping(ctx context.Context, hc *http.Client, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
	if err != nil {
		return fmt.Errorf("the server address %q: %w", base, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("the server at %s does not answer: %w", base, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the server at %s answered GET /healthz with %s", base, resp.Status)
	}
	return nil
}

// drive runs l.clients clients for d, adding their turns to l. A turn
// still running when d ends is waited for and counted; the level's time
// runs until the last one ends.
func drive(ctx context.Context, base string, hc *http.Client, msg string, turns int, l *level, d time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range l.clients {
		wg.Go(func() {
			c := &client{base: base, http: hc, message: msg, turns: turns}
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				err := c.turn(ctx)
				lat := time.Since(t0)
				mu.Lock()
				if err != nil {
					l.errors++
					if l.firstErr == nil {
						l.firstErr = err
					}
					c.token = "" // start over with a new session
				} else {
					l.latencies = append(l.latencies, lat)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	l.elapsed += time.Since(start)
}

// report prints the levels and the two ratios with their targets.
func report(out io.Writer, conditions string, cfg config, levels []*level) {
	fmt.Fprintf(out, "server: %s\n", conditions)
	fmt.Fprintf(out, "each client: a session of %d turns (1 start, %d continues), then the next; %d-byte messages; %s per level, %d round(s)\n\n",
		cfg.turns, cfg.turns-1, cfg.messageBytes, cfg.duration, cfg.rounds)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\tturns\terrors\tturns/s\tp50\tp90\tp99\tmax\tp99/p50\t")
	var floor *level
	var turnLevels []*level
	for _, l := range levels {
		if l.floor {
			floor = l
		} else {
			turnLevels = append(turnLevels, l)
		}
	}
	for _, l := range levels {
		s := slices.Clone(l.latencies)
		slices.Sort(s)
		p50, p99 := quantile(s, 0.50), quantile(s, 0.99)
		ratio := 0.0
		if p50 > 0 {
			ratio = float64(p99) / float64(p50)
		}
		name := strconv.Itoa(l.clients)
		if l.floor {
			name = fmt.Sprintf("fsync ×%d", l.clients)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\t%s\t%s\t%s\t%.2f\t\n", name, len(s), l.errors, l.throughput(),
			ms(p50), ms(quantile(s, 0.90)), ms(p99), ms(quantile(s, 1)), ratio)
	}
	tw.Flush()
	if floor != nil {
		fmt.Fprintf(out, "(fsync ×%d: the disk's floor, %d writers each writing %d bytes to a file of its own and fsyncing it, between the levels; its \"turns\" are writes)\n", floor.clients, floor.clients, floorRecord)
	}
	levels = turnLevels
	if len(levels) == 0 {
		return
	}
	lo, hi := levels[0], levels[0]
	for _, l := range levels {
		if l.clients < lo.clients {
			lo = l
		}
		if l.clients > hi.clients {
			hi = l
		}
	}
	s := slices.Clone(hi.latencies)
	slices.Sort(s)
	if p50 := quantile(s, 0.5); p50 > 0 {
		fmt.Fprintf(out, "\np99/p50 at %d clients: %.2f (target: at most 5)", hi.clients, float64(quantile(s, 0.99))/float64(p50))
		if floor != nil {
			f := slices.Clone(floor.latencies)
			slices.Sort(f)
			if fp50 := quantile(f, 0.5); fp50 > 0 {
				fmt.Fprintf(out, "; the disk's own with %d writers: %.2f", floor.clients, float64(quantile(f, 0.99))/float64(fp50))
			}
		}
		fmt.Fprintln(out)
	}
	if hi != lo && lo.throughput() > 0 {
		fmt.Fprintf(out, "throughput at %d clients / at %d: %.2f (target: at least 1.5 from 1 to 16 clients)\n", hi.clients, lo.clients, hi.throughput()/lo.throughput())
	}
}

// ms formats a latency in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}
