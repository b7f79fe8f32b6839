package server_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/ledger"
)

// TestLedgerKeyedRetryAfterTheWindowAndTooManyKeys: over real HTTP, a
// retry with an Idempotency-Key after more later messages than the
// ledger's window of recent ids is answered with the first answer
// (Idempotent-Replayed), on another host; past ledger.maxKeys kept keys a
// keyed message is 429 too_many_keys with a Retry-After of about the
// idempotency window, and a message without a key goes through.
func TestLedgerKeyedRetryAfterTheWindowAndTooManyKeys(t *testing.T) {
	store := memkv.New()
	a, b := ledgerPair(t, store, newHold(t), newHold(t), agent.LedgerOptions{Tuning: ledger.Tuning{DedupWindow: 1, MaxKeys: 2}})
	var s started
	if code, _ := a.keyed("/v1/sessions", `{"message":"one"}`, "", &s); code != http.StatusCreated {
		t.Fatalf("start: %d", code)
	}
	cont := func(f *fixture, msg, key string, out any) (int, http.Header) {
		t.Helper()
		released(t, a, s.SessionID) // each message taken by the host it is sent to
		return f.keyed("/v1/sessions/continue", `{"continuationToken":"`+s.ContinuationToken+`","message":"`+msg+`"}`, key, out)
	}
	var first started
	if code, _ := cont(a, "early", "k-early", &first); code != 200 || first.Turn.Result != "re: early" {
		t.Fatalf("continue with k-early: %d %+v", code, first)
	}
	for _, m := range []string{"two", "three", "four"} {
		if code, _ := cont(a, m, "", nil); code != 200 {
			t.Fatalf("continue %s: %d", m, code)
		}
	}
	var again started
	code, hdr := cont(b, "early", "k-early", &again)
	if code != 200 || hdr.Get("Idempotent-Replayed") != "true" || again.Turn.Result != "re: early" {
		t.Fatalf("the retry of k-early three messages later, on B: %d replayed %q %+v; want the first answer", code, hdr.Get("Idempotent-Replayed"), again)
	}
	for _, k := range []string{"k-2", "k-3"} { // k-early and k-2 kept: at the limit
		if code, _ := cont(a, k, k, nil); code != 200 {
			t.Fatalf("continue %s: %d", k, code)
		}
	}
	var e apiError
	code, hdr = cont(b, "k-4", "k-4", &e)
	if code != http.StatusTooManyRequests || e.Error.Code != "too_many_keys" || !strings.Contains(e.Error.Message, "ledger.maxKeys") {
		t.Fatalf("a keyed message past maxKeys: %d %+v; want 429 too_many_keys naming ledger.maxKeys", code, e)
	}
	if secs, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || secs < 24*3600 || secs > 24*3600+10*60 {
		t.Errorf("Retry-After %q; want about the idempotency window and the clock skew (86,700 s)", hdr.Get("Retry-After"))
	}
	if code, _ := cont(b, "no key", "", nil); code != 200 {
		t.Fatalf("a message without a key past maxKeys: %d", code)
	}
}
