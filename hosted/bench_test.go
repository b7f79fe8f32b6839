package hosted

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"agentkit/kv/hostedkv/wire"
)

// BenchmarkServicePath measures what the service itself costs per request
// (routing, authentication, parameters, metrics, logging, the answer),
// over the memory driver and without a network, so the backend's and the
// transport's costs stay out:
//
//	go test -run '^$' -bench ServicePath -benchmem ./hosted/
func BenchmarkServicePath(b *testing.B) {
	ts := newTestService(b, Options{Backend: "mem://", Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}, "alpha")
	tok := ts.tokens["alpha"]
	ts.put(b, "alpha", "bench/key", string(bytes.Repeat([]byte("v"), 256)))
	value := bytes.Repeat([]byte("w"), 256)
	b.Run("Get", func(b *testing.B) {
		req := httptest.NewRequest("GET", kvPath("alpha", "bench/key"), nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		for b.Loop() {
			w := httptest.NewRecorder()
			ts.svc.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatal(w.Code)
			}
		}
	})
	b.Run("Put", func(b *testing.B) {
		for b.Loop() {
			req := httptest.NewRequest("PUT", kvPath("alpha", "bench/key"), bytes.NewReader(value))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set(wire.HeaderRequestID, newID())
			w := httptest.NewRecorder()
			ts.svc.ServeHTTP(w, req)
			if w.Code != http.StatusNoContent {
				b.Fatal(w.Code)
			}
		}
	})
}
