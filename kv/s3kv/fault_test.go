package s3kv_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"agentkit/kv"
)

// faultServer answers HeadBucket with 200, the key format marker with
// format 2, and every other object request with
// the status and S3 error code given, counting object requests. It stands
// in for a server only to produce answers a real one gives rarely or under
// races (409, a 500 on a conditional write, a dropped connection).
type faultServer struct {
	status   int
	code     string
	hangUp   bool // close the connection without answering
	requests atomic.Int32
}

func (f *faultServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.Count(strings.Trim(r.URL.Path, "/"), "/") == 0 { // the bucket
		w.WriteHeader(http.StatusOK)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/!format") && r.Method == http.MethodGet { // read at open
		fmt.Fprint(w, "agentkit s3kv key format 2\n")
		return
	}
	f.requests.Add(1)
	if f.hangUp {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(f.status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected</Message><RequestId>1</RequestId></Error>`, f.code)
}

func openFault(t *testing.T, f *faultServer) *kv.DB {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	db, err := kv.Open(context.Background(), "s3://key:secret@bucket/p/?endpoint="+srv.URL+"&region=us-east-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestConditionalWriteAnswers(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		status   int
		code     string
		conflict bool
	}{
		{412, "PreconditionFailed", true},
		{409, "ConditionalRequestConflict", true},
		{404, "NoSuchKey", true},
		{404, "NoSuchBucket", false},
		{403, "AccessDenied", false},
		{500, "InternalError", false},
		{503, "SlowDown", false},
	} {
		f := &faultServer{status: c.status, code: c.code}
		db := openFault(t, f)
		_, err := db.PutIfVersion(ctx, "k", []byte("v"), "0123456789abcdef0123456789abcdef")
		if got := errors.Is(err, kv.ErrConflict); got != c.conflict {
			t.Errorf("PutIfVersion answered %d %s: error %v; conflict = %v, want %v", c.status, c.code, err, got, c.conflict)
		}
		// A conditional write is sent once: a retry after an unknown
		// outcome could report a false conflict.
		if n := f.requests.Load(); n != 1 {
			t.Errorf("PutIfVersion answered %d %s: %d requests, want 1 (no retries)", c.status, c.code, n)
		}
	}
}

func TestUnknownOutcomeIsNoConflict(t *testing.T) {
	ctx := context.Background()
	f := &faultServer{hangUp: true}
	db := openFault(t, f)
	if _, err := db.PutIfAbsent(ctx, "k", []byte("v")); err == nil || errors.Is(err, kv.ErrConflict) {
		t.Errorf("PutIfAbsent with the connection dropped: %v, want a transport error that is not a conflict", err)
	}
	if n := f.requests.Load(); n != 1 {
		t.Errorf("PutIfAbsent was sent %d times, want once", n)
	}
}

func TestPlainWriteAnswers(t *testing.T) {
	ctx := context.Background()
	f := &faultServer{status: 409, code: "OperationAborted"}
	db := openFault(t, f)
	if err := db.Put(ctx, "k", []byte("v")); err == nil || errors.Is(err, kv.ErrConflict) {
		t.Errorf("Put answered 409: %v, want an error that is not a conflict (Put has no condition)", err)
	}
	f = &faultServer{status: 500, code: "InternalError"}
	db = openFault(t, f)
	if err := db.Put(ctx, "k", []byte("v")); err == nil {
		t.Error("Put answered 500 succeeded")
	}
	if n := f.requests.Load(); n < 2 {
		t.Errorf("Put answered 500 was sent %d times; plain writes keep the SDK's retries", n)
	}
}

func TestGetAnswers(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		status  int
		code    string
		missing bool
	}{
		{404, "NoSuchKey", true},
		{404, "NoSuchBucket", false},
		{403, "AccessDenied", false},
	} {
		db := openFault(t, &faultServer{status: c.status, code: c.code})
		_, err := db.Get(ctx, "k")
		if got := errors.Is(err, kv.ErrNotFound); got != c.missing {
			t.Errorf("Get answered %d %s: %v; not found = %v, want %v", c.status, c.code, err, got, c.missing)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error shows the secret: %v", err)
		}
	}
}
