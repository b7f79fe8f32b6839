package memory

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"agentkit/model"
)

func TestRecordLineExactBytes(t *testing.T) {
	at := time.Date(2026, 10, 1, 16, 42, 9, 118_999_999, time.UTC)
	tests := []struct {
		name string
		rec  Record
		want string
	}{
		{
			name: "completed with title",
			rec: Record{
				At: at, SessionID: "s-1", ChannelID: "slack", Status: StatusCompleted,
				Title: "Checkout flaky test", UserMessage: "Why does <a> & <b> fail?", Result: "line one\nline \"two\"",
				Usage: model.Usage{InputTokens: 18234, OutputTokens: 912, CacheReadTokens: 15002, CacheWriteTokens: 7},
			},
			want: `{"at":"2026-10-01T16:42:09.118Z","sessionId":"s-1","channelId":"slack","status":"completed","title":"Checkout flaky test",` +
				`"userMessage":"Why does <a> & <b> fail?","result":"line one\nline \"two\"",` +
				`"usage":{"inputTokens":18234,"outputTokens":912,"cacheReadTokens":15002,"cacheWriteTokens":7}}` + "\n",
		},
		{
			name: "completed without title, zero usage, whole second",
			rec: Record{
				At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), SessionID: "s-2", ChannelID: "http", Status: StatusCompleted,
				UserMessage: "hi", Result: "",
			},
			want: `{"at":"2026-01-02T03:04:05.000Z","sessionId":"s-2","channelId":"http","status":"completed",` +
				`"userMessage":"hi","result":"","usage":{"inputTokens":0,"outputTokens":0,"cacheReadTokens":0,"cacheWriteTokens":0}}` + "\n",
		},
		{
			name: "failed: usage omitted even if set, zone converted to UTC",
			rec: Record{
				At: time.Date(2026, 10, 1, 18, 42, 9, 5_000_000, time.FixedZone("CEST", 2*3600)), SessionID: "s-3", ChannelID: "http",
				Status: StatusFailed, Title: "t", UserMessage: "do it", Result: "model: timeout",
				Usage: model.Usage{InputTokens: 1},
			},
			want: `{"at":"2026-10-01T16:42:09.005Z","sessionId":"s-3","channelId":"http","status":"failed","title":"t",` +
				`"userMessage":"do it","result":"model: timeout"}` + "\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.rec.Line()
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("Line() =\n%s\nwant\n%s", got, tt.want)
			}
			if strings.Count(string(got), "\n") != 1 {
				t.Errorf("Line() has %d newlines, want exactly the final one", strings.Count(string(got), "\n"))
			}
			mj, err := tt.rec.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if string(mj)+"\n" != tt.want {
				t.Errorf("MarshalJSON() = %s, want Line without its newline", mj)
			}
			// json.Marshal re-escapes HTML characters but means the same.
			var back Record
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatal(err)
			}
			want := tt.rec
			want.At = want.At.UTC().Truncate(time.Millisecond)
			if want.Status == StatusFailed {
				want.Usage = model.Usage{}
			}
			if back != want {
				t.Errorf("round trip = %+v, want %+v", back, want)
			}
		})
	}
}

func TestRecordLineRejectsInvalid(t *testing.T) {
	ok := Record{At: time.Now(), SessionID: "s", ChannelID: "http", Status: StatusCompleted}
	bad := ok
	bad.Status = "done"
	if _, err := bad.Line(); err == nil || !strings.Contains(err.Error(), `"done"`) {
		t.Errorf("status %q: err = %v, want one naming the status", bad.Status, err)
	}
	bad = ok
	bad.At = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := bad.Line(); err == nil {
		t.Error("year 10000: no error")
	}
	if _, err := json.Marshal(Record{}); err == nil {
		t.Error("json.Marshal(Record{}): no error for an empty status")
	}
	var r Record
	if err := json.Unmarshal([]byte(`{"at":"2026-10-01T16:42:09.118Z","status":"maybe"}`), &r); err == nil {
		t.Error("Unmarshal accepted status maybe")
	}
	if err := json.Unmarshal([]byte(`{"at":"yesterday","status":"failed"}`), &r); err == nil {
		t.Error("Unmarshal accepted at=yesterday")
	}
}

func TestNewRecord(t *testing.T) {
	finished := time.Date(2026, 10, 1, 16, 42, 9, 118_500_000, time.FixedZone("X", -5*3600))
	u := model.Usage{InputTokens: 3, OutputTokens: 4, CacheReadTokens: 5, CacheWriteTokens: 6}
	rec := NewRecord(TurnInfo{
		SessionID: "s", ChannelID: "http", Title: "title", UserMessage: "question",
		Result: "answer", Usage: u, FinishedAt: finished,
	}, 0)
	want := Record{
		At: time.Date(2026, 10, 1, 21, 42, 9, 118_000_000, time.UTC), SessionID: "s", ChannelID: "http",
		Status: StatusCompleted, Title: "title", UserMessage: "question", Result: "answer", Usage: u,
	}
	if rec != want {
		t.Errorf("completed: %+v, want %+v", rec, want)
	}
	if rec.At.Location() != time.UTC {
		t.Errorf("At location = %v, want UTC", rec.At.Location())
	}

	rec = NewRecord(TurnInfo{SessionID: "s", UserMessage: "q", Result: "ignored", Usage: u, Err: errors.New("tool crashed")}, 0)
	if rec.Status != StatusFailed || rec.Result != "tool crashed" || rec.Usage != (model.Usage{}) {
		t.Errorf("failed: %+v, want status failed, result = error message, no usage", rec)
	}

	before := time.Now().UTC().Truncate(time.Millisecond)
	rec = NewRecord(TurnInfo{SessionID: "s"}, 0)
	after := time.Now().UTC()
	if rec.At.Before(before) || rec.At.After(after) || rec.At.Nanosecond()%int(time.Millisecond) != 0 {
		t.Errorf("zero FinishedAt: At = %v, want now (%v..%v) to the millisecond", rec.At, before, after)
	}

	long := strings.Repeat("é", DefaultMaxTextLength+10)
	rec = NewRecord(TurnInfo{UserMessage: long, Result: long, Title: long}, 0)
	for name, s := range map[string]string{"userMessage": rec.UserMessage, "result": rec.Result} {
		if n := utf8.RuneCountInString(s); n != DefaultMaxTextLength {
			t.Errorf("%s: %d characters, want the default cut %d", name, n, DefaultMaxTextLength)
		}
	}
	if rec.Title != long {
		t.Errorf("title: %d characters, want all %d: the contract cuts only userMessage and result", utf8.RuneCountInString(rec.Title), utf8.RuneCountInString(long))
	}
	rec = NewRecord(TurnInfo{UserMessage: "abcdef", Title: "title", Err: errors.New("uvwxyz")}, 3)
	if rec.UserMessage != "abc" || rec.Result != "uvw" || rec.Title != "title" {
		t.Errorf("cut 3: userMessage %q result %q title %q, want abc, uvw and the title whole", rec.UserMessage, rec.Result, rec.Title)
	}
	// The title is repaired like the other texts: invalid UTF-8 becomes
	// U+FFFD, byte by byte.
	if rec = NewRecord(TurnInfo{Title: "a\xffb\xfe"}, 1); rec.Title != "a\uFFFDb\uFFFD" {
		t.Errorf("title with invalid UTF-8 and a cut of 1: %q, want %q", rec.Title, "a\uFFFDb\uFFFD")
	}
}

func TestCut(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"hello", 10, "hello"},
		{"hello", 5, "hello"},
		{"hello", 3, "hel"},
		{"", 3, ""},
		{"héllo", 2, "hé"},                        // 2-byte sequence kept whole
		{"日本語", 2, "日本"},                          // 3-byte sequences
		{"a😀b", 2, "a😀"},                          // 4-byte sequence
		{"a😀b", 1, "a"},                           // cut before a 4-byte sequence, not inside it
		{"\uFFFDx", 1, "\uFFFD"},                  // a real U+FFFD is one character
		{"a\xffb", 3, "a\uFFFDb"},                 // invalid byte: one character, replaced
		{"a\xffb", 2, "a\uFFFD"},                  // and counted
		{"\xe6\x97", 5, "\uFFFD\uFFFD"},           // torn sequence in the input: each byte replaced
		{"ok\xe6\x97\xa5", 3, "ok日"},              // the same bytes, whole
		{"\xed\xa0\x80", 9, "\uFFFD\uFFFD\uFFFD"}, // surrogate half: invalid
	}
	for _, tt := range tests {
		if got := cut(tt.in, tt.n); got != tt.want {
			t.Errorf("cut(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

func FuzzCut(f *testing.F) {
	for _, s := range []string{"", "abc", "héllo wörld", "日本語", "😀😀", "a\xffb", "\xe6\x97", "\xf0\x9f\x98"} {
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n <= 0 || n > 1<<16 {
			return
		}
		got := cut(s, n)
		if !utf8.ValidString(got) {
			t.Fatalf("cut(%q, %d) = %q: invalid UTF-8", s, n, got)
		}
		if c := utf8.RuneCountInString(got); c > n {
			t.Fatalf("cut(%q, %d) = %q: %d characters", s, n, got, c)
		}
		// Characters are counted as range does: each invalid byte is one.
		chars := 0
		for range s {
			chars++
		}
		if want := min(chars, n); utf8.RuneCountInString(got) != want {
			t.Fatalf("cut(%q, %d) = %q: %d characters, want %d", s, n, got, utf8.RuneCountInString(got), want)
		}
		if utf8.ValidString(s) && !strings.HasPrefix(s, got) {
			t.Fatalf("cut(%q, %d) = %q: not a prefix of valid input", s, n, got)
		}
	})
}
