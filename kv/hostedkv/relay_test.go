package hostedkv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"agentkit/hosted"
	"agentkit/internal/proctest"
	"agentkit/internal/testenv/pgtest"
	"agentkit/kv"
	"agentkit/kv/kvtest"
)

// The relay is the floor of the throughput benchmark: the thinnest HTTP
// service in front of the PostgreSQL driver, in a process of its own as
// storaged is, with storaged's connection pool. It does what any storage
// service reached over HTTP must do (a request parsed, one driver call, an
// answer written) and nothing storaged adds (authentication, namespaces,
// request ids and their table, versions, metrics, logs). Its throughput
// over the direct driver's is what a service hop costs on this machine.

const relayEnv = "HOSTEDKV_RELAY_STORE" // the store URL the relay child opens

// runRelayChild serves GET and PUT /k?key=KEY over the store it is given,
// printing "listening on http://ADDR" when ready.
func runRelayChild() error {
	ctx := context.Background()
	db, err := kv.Open(ctx, os.Getenv(relayEnv))
	if err != nil {
		return err
	}
	defer db.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println("listening on http://" + ln.Addr().String())
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		switch r.Method {
		case http.MethodGet:
			v, err := db.Get(r.Context(), key)
			switch {
			case errors.Is(err, kv.ErrNotFound):
				http.Error(w, "not found", http.StatusNotFound)
			case err != nil:
				http.Error(w, err.Error(), http.StatusInternalServerError)
			default:
				w.Write(v)
			}
		case http.MethodPut:
			v, err := io.ReadAll(r.Body)
			if err == nil {
				err = db.Put(r.Context(), key, v)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
		}
	}))
}

// relayOps starts a relay child over a fresh PostgreSQL table with
// storaged's pool size, fills it as benchSides fills the other sides, and
// returns its Get and Put over HTTP.
func relayOps(b *testing.B, value []byte, fill []string) ops {
	store := pgtest.TableURL(b) + "&pool_max_conns=" + fmt.Sprint(hosted.DefaultPoolSize)
	child := proctest.Start(b, "relay", relayEnv+"="+store)
	base := strings.TrimPrefix(child.Expect("listening on ", time.Minute), "listening on ") + "/k?key="
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256 // as the hosted driver's client
	client := &http.Client{Transport: tr}
	b.Cleanup(func() { tr.CloseIdleConnections(); child.Kill(); child.Wait() })
	do := func(ctx context.Context, method, key string, body []byte) error {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+url.QueryEscape(key), rd)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode >= 300 {
			return fmt.Errorf("relay: %s %s: %s", method, key, resp.Status)
		}
		return nil
	}
	o := ops{
		get: func(ctx context.Context, key string) error { return do(ctx, http.MethodGet, key, nil) },
		put: func(ctx context.Context, key string, v []byte) error { return do(ctx, http.MethodPut, key, v) },
	}
	for _, k := range fill {
		if err := o.put(context.Background(), k, value); err != nil {
			b.Fatal(err)
		}
	}
	return o
}

// dbOps returns the Get and Put of a store.
func dbOps(db *kv.DB) ops {
	return ops{
		get: func(ctx context.Context, key string) error { _, err := db.Get(ctx, key); return err },
		put: func(ctx context.Context, key string, v []byte) error { return db.Put(ctx, key, v) },
	}
}

// ops is one side of the throughput benchmark.
type ops struct {
	get func(ctx context.Context, key string) error
	put func(ctx context.Context, key string, value []byte) error
}

// BenchmarkHopFloorLatency is the floor of BenchmarkHostedVsPostgres: what
// the thinnest HTTP hop in front of the PostgreSQL driver adds to a Get and
// a Put at the median, the direct driver and the relay alternated in one
// loop as there:
//
//	go test -run '^$' -bench HopFloorLatency -benchtime 3000x ./kv/hostedkv/
func BenchmarkHopFloorLatency(b *testing.B) {
	dbs, value := benchSides(b)
	fill := make([]string, 1000)
	for i := range fill {
		fill[i] = kvtest.BenchKey(i)
	}
	sides := []ops{dbOps(dbs[0]), relayOps(b, value, fill)}
	ctx := b.Context()
	for _, op := range []string{"Get", "Put"} {
		b.Run(op, func(b *testing.B) {
			lat := [2][]time.Duration{}
			i := 0
			for b.Loop() {
				for k := range 2 {
					side := (i + k) % 2
					key := kvtest.BenchKey(i % len(fill))
					start := time.Now()
					var err error
					if op == "Get" {
						err = sides[side].get(ctx, key)
					} else {
						err = sides[side].put(ctx, key, value)
					}
					if err != nil {
						b.Fatalf("%s on side %d: %v", op, side, err)
					}
					lat[side] = append(lat[side], time.Since(start))
				}
				i++
			}
			d, r := median(lat[0]), median(lat[1])
			b.ReportMetric(float64(d.Microseconds()), "direct-p50-µs")
			b.ReportMetric(float64(r.Microseconds()), "relay-p50-µs")
			b.ReportMetric(float64((r - d).Microseconds()), "added-p50-µs")
		})
	}
}
