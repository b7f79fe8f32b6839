package driverkit

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"agentkit/kv"
)

var bang = Escaper{Mark: '!', Keep: func(c byte) bool { return AlphaNum(c) || c == '.' }}

func TestEscapeRoundTrip(t *testing.T) {
	for _, s := range []string{"", "abc", "a.b", "a!b", "!", "!!", "é", "\x01\xff", "a/b c", strings.Repeat("!x", 100)} {
		e := bang.Escape(s)
		if len(e) != bang.Len(s) {
			t.Errorf("Len(%q) = %d, Escape gave %d bytes", s, bang.Len(s), len(e))
		}
		for i := 0; i < len(e); i++ {
			if c := e[i]; c != '!' && !bang.Keep(c) {
				t.Errorf("Escape(%q) = %q keeps the byte %q", s, e, c)
			}
		}
		got, ok := bang.Unescape(e)
		if !ok || got != s {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", s, got, ok)
		}
	}
	if got := bang.Escape("a!b/é"); got != "a!21b!2F!C3!A9" {
		t.Errorf("Escape = %q, want upper-case hex escapes of '!', '/' and each byte of é", got)
	}
}

func TestUnescapeRefusesWhatNoEncoderWrites(t *testing.T) {
	for _, s := range []string{"!", "!2", "!2e", "!G0", "a/b", "a b", "ab!"} {
		if got, ok := bang.Unescape(s); ok {
			t.Errorf("Unescape(%q) = %q, want refusal", s, got)
		}
	}
	// Lenient about kept bytes written as escapes: the caller checks.
	if got, ok := bang.Unescape("!61"); !ok || got != "a" {
		t.Errorf("Unescape(!61) = %q, %v", got, ok)
	}
}

func TestPrefixEndBoundsExactlyThePrefix(t *testing.T) {
	runes := []rune{0, 1, 'a', 0x7e, 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfffe, 0xffff, 0x10000, 0x10fffe, utf8.MaxRune}
	var strs []string
	for _, a := range runes {
		strs = append(strs, string(a))
		for _, b := range runes {
			strs = append(strs, string(a)+string(b))
		}
	}
	for _, p := range strs {
		end, ok := PrefixEnd(p)
		if !ok {
			if strings.Trim(p, string(utf8.MaxRune)) != "" {
				t.Errorf("PrefixEnd(%q) reports none", p)
			}
			continue
		}
		if !utf8.ValidString(end) {
			t.Errorf("PrefixEnd(%q) = %q, not valid UTF-8", p, end)
		}
		for _, s := range strs {
			if in := s >= p && s < end; in != strings.HasPrefix(s, p) {
				t.Errorf("prefix %q, end %q: %q in range = %v, has prefix = %v", p, end, s, in, !in)
			}
		}
	}
	for _, c := range []struct{ in, out string }{{"a", "b"}, {"a/", "a0"}, {"é", "ê"}, {"\ud7ff", "\ue000"}} {
		if out, ok := PrefixEnd(c.in); !ok || out != c.out {
			t.Errorf("PrefixEnd(%q) = %q, %v; want %q", c.in, out, ok, c.out)
		}
	}
	if _, ok := PrefixEnd(""); ok {
		t.Error(`PrefixEnd("") reports a bound`)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestSplitParams(t *testing.T) {
	for _, tc := range []struct{ in, rest, table string }{
		{"postgres://u:p@h:5432/db?sslmode=disable&table=my_kv", "postgres://u:p@h:5432/db?sslmode=disable", "my_kv"},
		{"postgresql://h/db", "postgresql://h/db", ""},
		{"postgres://h/db?table=t1&application_name=x", "postgres://h/db?application_name=x", "t1"},
		{"redis://:pw@h:6379/2?table=app%3A&dial_timeout=3s", "redis://:pw@h:6379/2?dial_timeout=3s", "app:"},
	} {
		own, rest, err := SplitParams(mustURL(t, tc.in), "table")
		if err != nil {
			t.Fatalf("SplitParams(%s): %v", tc.in, err)
		}
		if rest.String() != tc.rest || own["table"] != tc.table {
			t.Errorf("SplitParams(%s) = %q, table %q; want %q, table %q", tc.in, rest, own["table"], tc.rest, tc.table)
		}
	}
	for in, want := range map[string]string{
		"postgres://h/db?table=":              "table parameter is empty",
		"postgres://h/db?table=a&table=b":     "given 2 times",
		"postgres://h/db?table=a;password=pw": "query does not parse",
	} {
		_, _, err := SplitParams(mustURL(t, in), "table")
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "pw") {
			t.Errorf("SplitParams(%s) = %v, want an error saying %q without the query's values", in, err, want)
		}
	}
}

func TestParamsRefusesUnknownNames(t *testing.T) {
	got, err := Params(mustURL(t, "s3://b/p?region=r&endpoint=http://x"), "endpoint", "region")
	if err != nil || got["region"] != "r" || got["endpoint"] != "http://x" || len(got) != 2 {
		t.Fatalf("Params = %v, %v", got, err)
	}
	_, err = Params(mustURL(t, "s3://b/p?endpont=x&secret=s3cr3t"), "endpoint", "region")
	if err == nil || !strings.Contains(err.Error(), `unknown URL parameter "endpont"`) || !strings.Contains(err.Error(), "endpoint, region") || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Params with a typo = %v, want the unknown name and the known ones, no values", err)
	}
	_, err = Params(mustURL(t, "mem://?x=1"))
	if !errors.Is(err, kv.ErrInvalidURL) {
		t.Errorf("Params error %v does not match kv.ErrInvalidURL", err)
	}
	if err == nil || !strings.Contains(err.Error(), "takes no parameters") || !strings.Contains(err.Error(), "x") {
		t.Errorf("Params of a driver without parameters = %v, want a refusal naming x", err)
	}
}

func TestSecretsScrub(t *testing.T) {
	var s Secrets
	s.Add("p@ss word&1")
	s.Add("")
	for _, spelling := range []string{"p@ss word&1", url.QueryEscape("p@ss word&1"), url.PathEscape("p@ss word&1")} {
		err := s.Scrub(fmt.Errorf("dial: bad password %s", spelling))
		if strings.Contains(err.Error(), spelling) || !strings.Contains(err.Error(), "[redacted]") {
			t.Errorf("Scrub kept %q: %v", spelling, err)
		}
	}
	plain := errors.New("connection refused")
	if got := s.Scrub(plain); got != plain {
		t.Errorf("Scrub of an error without secrets = %v, want it unchanged", got)
	}
	if s.Scrub(nil) != nil {
		t.Error("Scrub(nil) is not nil")
	}
}
