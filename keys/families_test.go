package keys

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/kv"
)

func mustAgent(t *testing.T, name string) Scope {
	t.Helper()
	s, err := Agent(name)
	if err != nil {
		t.Fatalf("Agent(%q): %v", name, err)
	}
	return s
}

// mustOK returns a helper that unwraps (string, error), failing t on error.
func mustOK(t *testing.T) func(string, error) string {
	return func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func TestFamilies(t *testing.T) {
	must := mustOK(t)
	k := mustAgent(t, "support bot")
	at := time.Date(2024, 5, 1, 14, 30, 0, 123_456_789, time.FixedZone("CEST", 2*3600))
	tests := []struct {
		name string
		got  string
		err  error
		want string
	}{
		{"prefix", k.Prefix(), nil, "agentkit/v1/support%20bot/"},
		{"sessions", k.SessionsPrefix(), nil, "agentkit/v1/support%20bot/sessions/"},
		{"session", must(k.SessionPrefix("s/1")), nil, "agentkit/v1/support%20bot/sessions/s%2F1/"},
		{"meta", must(k.SessionMeta("s/1")), nil, "agentkit/v1/support%20bot/sessions/s%2F1/meta"},
		{"head", must(k.SessionHead("s/1")), nil, "agentkit/v1/support%20bot/sessions/s%2F1/head"},
		{"batch parts", must(k.BatchPartsPrefix("s/1", "b:7")), nil, "agentkit/v1/support%20bot/sessions/s%2F1/parts/b%3A7/"},
		{"batch part", must(k.BatchPart("s/1", "b7", 2)), nil, "agentkit/v1/support%20bot/sessions/s%2F1/parts/b7/00000000000000000002"},
		{"events", must(k.EventsPrefix("s/1")), nil, "agentkit/v1/support%20bot/sessions/s%2F1/events/"},
		{"batch", must(k.EventBatch("s/1", 42)), nil, "agentkit/v1/support%20bot/sessions/s%2F1/events/00000000000000000042"},
		{"batch max", must(k.EventBatch("s", math.MaxUint64)), nil, "agentkit/v1/support%20bot/sessions/s/events/18446744073709551615"},
		{"continuations", k.ContinuationsPrefix(), nil, "agentkit/v1/support%20bot/continuations/"},
		{"continuation", must(k.Continuation("tok:en")), nil, "agentkit/v1/support%20bot/continuations/tok%3Aen"},
		{"reminders", k.RemindersPrefix(), nil, "agentkit/v1/support%20bot/reminders/"},
		{"reminder", must(k.Reminder("r1")), nil, "agentkit/v1/support%20bot/reminders/r1"},
		{"eval runs", k.EvalRunsPrefix(), nil, "agentkit/v1/support%20bot/eval-runs/"},
		{"eval run", must(k.EvalRun("run 7")), nil, "agentkit/v1/support%20bot/eval-runs/run%207"},
		{"eval case pages", must(k.EvalCasesPrefix("run 7")), nil, "agentkit/v1/support%20bot/eval-cases/run%207/"},
		{"eval case page", must(k.EvalCasePage("run 7", "p1")), nil, "agentkit/v1/support%20bot/eval-cases/run%207/p1"},
		{"ab samples", k.ABSamplesPrefix(), nil, "agentkit/v1/support%20bot/ab-samples/"},
		{"ab experiment", must(k.ABExperimentPrefix("tone")), nil, "agentkit/v1/support%20bot/ab-samples/tone/"},
		{"ab session", must(k.ABSessionPrefix("tone", "s1")), nil, "agentkit/v1/support%20bot/ab-samples/tone/s1/"},
		{"ab sample", must(k.ABSample("tone", "s1", at)), nil, "agentkit/v1/support%20bot/ab-samples/tone/s1/2024-05-01T12%3A30%3A00.123Z"},
		{"ab snapshot", must(k.ABSnapshot()), nil, "agentkit/v1/support%20bot/ab-snapshot"},
		{"author kv (spec example)", must(k.AuthorKV("alert-memory/abc")), nil, "agentkit/v1/support%20bot/kv/alert-memory%2Fabc"},
		{"author kv digests", k.AuthorKVDigestPrefix(), nil, "agentkit/v1/support%20bot/kv/sha256:"},
		{"ledger", k.LedgerPrefix(), nil, "agentkit/v1/support%20bot/durable-session/"},
		{"ledger session", must(k.LedgerSession("s1")), nil, "agentkit/v1/support%20bot/durable-session/s1/"},
		{"actors", k.ActorsPrefix(), nil, "agentkit/v1/support%20bot/actors/"},
		{"actor", must(k.Actor("user:42")), nil, "agentkit/v1/support%20bot/actors/user%3A42/"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
		if strings.HasSuffix(tt.want, "/") {
			continue
		}
		if err := kv.ValidateKey(tt.got); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if k.Name() != "support bot" {
		t.Errorf("Name() = %q", k.Name())
	}
	p, ok := k.AuthorKVPrefix("alert-memory/")
	if !ok || p != "agentkit/v1/support%20bot/kv/alert-memory%2F" {
		t.Errorf("AuthorKVPrefix = %q, %v", p, ok)
	}
}

func TestEmptySegmentsNameThePart(t *testing.T) {
	k := mustAgent(t, "a")
	now := time.Now()
	for _, tt := range []struct {
		what string
		err  error
	}{
		{"session id", second(k.SessionMeta(""))},
		{"session id", second(k.SessionPrefix(""))},
		{"session id", second(k.EventsPrefix(""))},
		{"session id", second(k.EventBatch("", 1))},
		{"session id", second(k.SessionHead(""))},
		{"session id", second(k.BatchPart("", "b", 1))},
		{"batch id", second(k.BatchPart("s", "", 1))},
		{"batch id", second(k.BatchPartsPrefix("s", ""))},
		{"continuation token", second(k.Continuation(""))},
		{"reminder id", second(k.Reminder(""))},
		{"eval run id", second(k.EvalRun(""))},
		{"experiment name", second(k.ABExperimentPrefix(""))},
		{"experiment name", second(k.ABSample("", "s", now))},
		{"session id", second(k.ABSample("e", "", now))},
		{"session id", second(k.ABSessionPrefix("e", ""))},
		{"host KV key", second(k.AuthorKV(""))},
		{"session id", second(k.LedgerSession(""))},
		{"actor id", second(k.Actor(""))},
	} {
		if !errors.Is(tt.err, ErrEmptySegment) || !strings.Contains(tt.err.Error(), "the "+tt.what+" is empty") {
			t.Errorf("error %v: want ErrEmptySegment naming the %s", tt.err, tt.what)
		}
	}
	if _, err := Agent(""); !errors.Is(err, ErrEmptySegment) || !strings.Contains(err.Error(), "agent name") {
		t.Errorf("Agent(\"\") error = %v", err)
	}
}

func second(_ string, err error) error { return err }

func parseErr(_ Key, err error) error { return err }

func TestZeroScope(t *testing.T) {
	var z Scope
	for _, err := range []error{
		second(z.SessionMeta("s")), second(z.EventBatch("s", 1)), second(z.Continuation("t")),
		second(z.Reminder("r")), second(z.EvalRun("r")), second(z.ABSample("e", "s", time.Now())),
		second(z.ABSnapshot()), second(z.AuthorKV("k")), second(z.Actor("a")), parseErr(z.Parse(Root + "a/ab-snapshot")),
	} {
		if err == nil || !strings.Contains(err.Error(), "keys.Agent") {
			t.Errorf("zero Scope: error %v, want one saying to use keys.Agent", err)
		}
	}
	// Prefixes of the zero Scope match no key of any real agent.
	real, _ := mustAgent(t, "x").SessionMeta("s")
	for _, p := range []string{z.Prefix(), z.SessionsPrefix(), z.ABSamplesPrefix(), z.LedgerPrefix()} {
		if !strings.HasPrefix(p, Root) || strings.HasPrefix(real, p) {
			t.Errorf("zero Scope prefix %q would match %q", p, real)
		}
	}
}

// TestWorstCaseLength builds every family from segments at the bound and
// checks the keys stay within kv.MaxKeyLength, with room for the layouts
// the ledger and legacy actors add below their prefixes.
func TestWorstCaseLength(t *testing.T) {
	must := mustOK(t)
	longest := strings.Repeat("%", 85) + "a" // encodes to exactly 256 bytes
	if e, _ := Segment(longest); len(e) != MaxSegment {
		t.Fatalf("test segment encodes to %d bytes", len(e))
	}
	k := mustAgent(t, longest)
	at := time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)
	keys := map[string]string{
		"meta":         must(k.SessionMeta(longest)),
		"batch":        must(k.EventBatch(longest, math.MaxUint64)),
		"head":         must(k.SessionHead(longest)),
		"batch part":   must(k.BatchPart(longest, longest, math.MaxUint64)),
		"index":        must(k.SessionIndex(time.Unix(0, 0), longest)),
		"continuation": must(k.Continuation(longest)),
		"reminder":     must(k.Reminder(longest)),
		"eval run":     must(k.EvalRun(longest)),
		"ab sample":    must(k.ABSample(longest, longest, at)),
		"ab snapshot":  must(k.ABSnapshot()),
		"author kv":    must(k.AuthorKV(longest)),
		// package ledger: dlq/{sessionId}/{eventId}/{inboxSeq} is the
		// deepest ledger key (a session id the runtime makes is a UUID; an
		// event id is at most 256 bytes).
		"ledger dead letter": k.LedgerPrefix() + "dlq/" + must(Segment(longest)) + "/" + must(Segment(longest)) + "/" + Seq(math.MaxUint64),
		// 07-actor.md: schedules/{id} is the deepest legacy actor key.
		"actor schedule": must(k.Actor(longest)) + "schedules/" + must(Segment(longest)),
		"actor message":  must(k.Actor(longest)) + "messages/" + Seq(math.MaxUint64),
	}
	for name, key := range keys {
		if len(key) > kv.MaxKeyLength {
			t.Errorf("%s: %d bytes, over kv.MaxKeyLength", name, len(key))
		}
		if err := kv.ValidateKey(key); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		t.Logf("%s: %d bytes", name, len(key))
	}
}

func TestListingOrderAndIsolation(t *testing.T) {
	must := mustOK(t)
	k := mustAgent(t, "a")
	var batches []string
	for _, n := range []uint64{0, 1, 2, 9, 10, 11, 100, 1 << 40, math.MaxUint64} {
		batches = append(batches, must(k.EventBatch("s", n)))
	}
	if !slices.IsSorted(batches) {
		t.Errorf("event batch keys do not sort in batch order: %q", batches)
	}
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	var samples []string
	for _, d := range []time.Duration{0, time.Millisecond, time.Second, time.Hour, 400 * 24 * time.Hour} {
		samples = append(samples, must(k.ABSample("e", "s", base.Add(d))))
	}
	if !slices.IsSorted(samples) {
		t.Errorf("A/B sample keys do not sort in time order: %q", samples)
	}

	// A session's prefix does not cover a session whose id extends it.
	pa := must(k.SessionPrefix("s"))
	if strings.HasPrefix(must(k.SessionMeta("s1")), pa) {
		t.Errorf("%q covers session s1", pa)
	}
	if !strings.HasPrefix(must(k.SessionMeta("s")), pa) || !strings.HasPrefix(batches[0], must(k.EventsPrefix("s"))) {
		t.Errorf("session keys are not under their prefixes")
	}
	// An agent's prefix does not cover an agent whose name extends it.
	if strings.HasPrefix(mustAgent(t, "ab").Prefix(), k.Prefix()) {
		t.Errorf("agent a's prefix covers agent ab")
	}
	// The snapshot key is not under the samples prefix.
	if strings.HasPrefix(must(k.ABSnapshot()), k.ABSamplesPrefix()) {
		t.Errorf("snapshot under the samples prefix")
	}
}

func TestAuthorKVPrefix(t *testing.T) {
	must := mustOK(t)
	k := mustAgent(t, "a")
	p, ok := k.AuthorKVPrefix("alert-memory/")
	if !ok {
		t.Fatal("not ok")
	}
	for key, want := range map[string]bool{
		"alert-memory/abc":  true,
		"alert-memory/":     true,
		"alert-memory":      false,
		"alert-memoryx/abc": false,
		"alert-memory/" + strings.Repeat("z", 300): false, // a digest
	} {
		got := strings.HasPrefix(must(k.AuthorKV(key)), p)
		if got != want {
			t.Errorf("AuthorKV(%q) under %q: %v, want %v", key, p, got, want)
		}
	}
	long := must(k.AuthorKV(strings.Repeat("z", 300)))
	if !strings.HasPrefix(long, k.AuthorKVDigestPrefix()) {
		t.Errorf("digest key %q not under the digest prefix", long)
	}
	if all, _ := k.AuthorKVPrefix(""); all != k.Prefix()+"kv/" {
		t.Errorf("AuthorKVPrefix(\"\") = %q", all)
	}
	if _, ok := k.AuthorKVPrefix(strings.Repeat("/", 86)); ok {
		t.Errorf("a prefix encoding past the bound should report ok=false")
	}
}

func TestFormatAt(t *testing.T) {
	at := time.Date(2024, 5, 1, 12, 30, 0, 0, time.UTC)
	got, err := FormatAt(at)
	if err != nil || got != "2024-05-01T12%3A30%3A00.000Z" {
		t.Fatalf("FormatAt = %q, %v", got, err)
	}
	back, err := ParseAt(got)
	if err != nil || !back.Equal(at) {
		t.Fatalf("ParseAt = %v, %v", back, err)
	}
	if _, err := FormatAt(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil {
		t.Error("year 10000 accepted")
	}
	if _, err := ParseAt("yesterday"); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseAt(yesterday) error = %v", err)
	}
}

func TestSeq(t *testing.T) {
	for _, n := range []uint64{0, 7, 1234567890, math.MaxUint64} {
		s := Seq(n)
		if len(s) != SeqDigits {
			t.Errorf("Seq(%d) = %q", n, s)
		}
		back, err := ParseSeq(s)
		if err != nil || back != n {
			t.Errorf("ParseSeq(%q) = %d, %v", s, back, err)
		}
	}
	for _, bad := range []string{"", "1", "0000000000000000000a", "99999999999999999999", "+0000000000000000001"} {
		if _, err := ParseSeq(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseSeq(%q) error = %v", bad, err)
		}
	}
}

func TestParse(t *testing.T) {
	must := mustOK(t)
	k := mustAgent(t, "bot/1")
	long := strings.Repeat("x", 300)
	at := time.Date(2024, 5, 1, 12, 30, 0, 5e6, time.UTC)
	tests := []struct {
		key  string
		want Key
	}{
		{must(k.SessionMeta("s 1")), Key{Family: FamilySessionMeta, Session: "s%201"}},
		{must(k.SessionMeta(long)), Key{Family: FamilySessionMeta, Session: Digest(long)}},
		{must(k.EventBatch("s", 77)), Key{Family: FamilyEventBatch, Session: "s", Batch: 77}},
		{must(k.SessionHead("s 1")), Key{Family: FamilySessionHead, Session: "s%201"}},
		{must(k.BatchPart("s", "b:1", 3)), Key{Family: FamilyBatchPart, Session: "s", ID: "b%3A1", Batch: 3}},
		{must(k.SessionIndex(at, "s/2")), Key{Family: FamilySessionIndex, Session: "s%2F2", At: at}},
		{must(k.Continuation("t")), Key{Family: FamilyContinuation, ID: "t"}},
		{must(k.Reminder("r")), Key{Family: FamilyReminder, ID: "r"}},
		{must(k.EvalRun("run")), Key{Family: FamilyEvalRun, ID: "run"}},
		{must(k.EvalCasePage("run", "p/1")), Key{Family: FamilyEvalCasePage, ID: "run", Rest: "p%2F1"}},
		{must(k.ABSample("exp", "s", at)), Key{Family: FamilyABSample, Experiment: "exp", Session: "s", At: at}},
		{must(k.ABSnapshot()), Key{Family: FamilyABSnapshot}},
		{must(k.AuthorKV("a/b")), Key{Family: FamilyAuthorKV, ID: "a%2Fb"}},
		{must(k.LedgerSession("s")) + "ctl", Key{Family: FamilyLedger, Rest: "s/ctl"}},
		{must(k.Actor("u")) + "messages/" + Seq(3), Key{Family: FamilyActor, ID: "u", Rest: "messages/" + Seq(3)}},
	}
	for _, tt := range tests {
		got, err := k.Parse(tt.key)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.key, err)
			continue
		}
		tt.want.Agent = "bot%2F1"
		if got != tt.want {
			t.Errorf("Parse(%q) = %+v, want %+v", tt.key, got, tt.want)
		}
	}
	raw, err := Unsegment("s%201")
	if err != nil || raw != "s 1" {
		t.Errorf("Unsegment = %q, %v", raw, err)
	}

	for _, bad := range []string{
		"other/x",
		Root,
		Root + "a",
		Root + "a/",
		Root + "a/unknown/x",
		Root + "a/sessions/s",
		Root + "a/sessions/s/meta/x",
		Root + "a/sessions//meta",
		Root + "a/sessions/%41/meta",
		Root + "a/sessions/s/events/12",
		Root + "a/sessions/s/events/0000000000000000001x",
		Root + "a/sessions/s/head/x",
		Root + "a/sessions/s/parts/b",
		Root + "a/sessions/s/parts/b/12",
		Root + "a/sessions/s/parts/b/" + Seq(1) + "/x",
		Root + "a/session-index/12/s",
		Root + "a/session-index/" + Seq(1),
		Root + "a/ab-samples/e/s/today",
		Root + "a/ab-samples/e/s",
		Root + "a/kv/a/b",
		Root + "a/kv/",
		Root + "a/durable-session/",
		Root + "a/actors/u",
		Root + "a b/ab-snapshot",
		Root + "a/ab-snapshot/x",
	} {
		if _, err := Parse(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%q) error = %v, want ErrMalformed", bad, err)
		}
	}
	other := must(mustAgent(t, "bot").SessionMeta("s"))
	if _, err := k.Parse(other); !errors.Is(err, ErrMalformed) {
		t.Errorf("Scope.Parse accepted another agent's key: %v", err)
	}
}

func TestFamilyString(t *testing.T) {
	if FamilyEventBatch.String() != "session event batch" || Family(99).String() != "Family(99)" {
		t.Errorf("Family.String: %q, %q", FamilyEventBatch, Family(99))
	}
}

func TestSessionIndexSortsNewestFirstAndParsesBack(t *testing.T) {
	s, err := Agent("support")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 1, 2, 3, 4, time.UTC)
	older, err := s.SessionIndex(t0, "a/b")
	if err != nil {
		t.Fatal(err)
	}
	newer, err := s.SessionIndex(t0.Add(time.Nanosecond), "z")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(older, s.SessionIndexPrefix()) || !(newer < older) {
		t.Fatalf("index keys %q (newer) and %q (older): want both under %q with the newer sorting first", newer, older, s.SessionIndexPrefix())
	}
	at, seg, ok := ParseSessionIndex(s.SessionIndexPrefix(), older)
	if !ok || !at.Equal(t0) || seg != "a%2Fb" {
		t.Fatalf("ParseSessionIndex(%q) = %v, %q, %v; want %v, a%%2Fb, true", older, at, seg, ok, t0)
	}
	for _, bad := range []string{s.SessionIndexPrefix() + "123/x", s.SessionIndexPrefix() + Seq(1), "agentkit/v1/other/session-index/" + Seq(1) + "/x"} {
		if _, _, ok := ParseSessionIndex(s.SessionIndexPrefix(), bad); ok {
			t.Errorf("ParseSessionIndex accepted %q", bad)
		}
	}
	if _, err := s.SessionIndex(time.Unix(-1, 0), "x"); err == nil {
		t.Error("SessionIndex accepted a time before 1970")
	}
}

func TestRedactHidesContinuationTokensOnly(t *testing.T) {
	s, err := Agent("a")
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := s.Continuation("s3cr3t-token")
	if got := Redact(tok); strings.Contains(got, "s3cr3t") || got != s.ContinuationsPrefix()+Redacted {
		t.Errorf("Redact(%q) = %q; want the token replaced by %s", tok, got, Redacted)
	}
	meta, _ := s.SessionMeta("s3cr3t-session")
	if got := Redact(meta); got != meta {
		t.Errorf("Redact changed a session key: %q -> %q", meta, got)
	}
}

// TestCoordinationProbe: a probe key is under ProbePrefix, and no agent's
// key, whatever the agent's name, is under it.
func TestCoordinationProbe(t *testing.T) {
	k, err := CoordinationProbe("n/1")
	if err != nil || k != "agentkit/v1/probe:coordination/n%2F1" {
		t.Fatalf("CoordinationProbe = %q, %v", k, err)
	}
	if _, err := CoordinationProbe(""); !errors.Is(err, ErrEmptySegment) {
		t.Errorf("an empty nonce: %v", err)
	}
	for _, name := range []string{"probe:coordination", "probe", "probe:coordination/x", strings.Repeat("p", 300)} {
		if p := mustAgent(t, name).Prefix(); strings.HasPrefix(p, ProbePrefix) || strings.HasPrefix(ProbePrefix, p) {
			t.Errorf("agent %q has the prefix %q, which overlaps the probe prefix %q", name, p, ProbePrefix)
		}
	}
}
