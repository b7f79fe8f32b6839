package natskv

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// jetstreamKey is the rule nats.go applies to keys (validKeyRe plus the dot
// rules of keyValid).
var jetstreamKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func validJetStreamKey(k string) bool {
	return k != "" && k[0] != '.' && k[len(k)-1] != '.' && !strings.Contains(k, "..") && jetstreamKey.MatchString(k)
}

var codecKeys = []string{
	"a", "a/", "/a", "/", "//", "a//b", "a/b", "a/bc", "ab", "x", "x/y", "x.y", "x/.", "..", ".",
	"a=b", "a_b", "a-b", "=", "=2E", "_", "%2F", "sha256:abc", "héllo", "agentkit/v1/bot/sessions/s%201/meta",
	"!~*'()%/:", "a b", "\x01\xff", strings.Repeat("%", 1024), strings.Repeat("é", 512),
}

func TestEncodeKeyValidAndReversible(t *testing.T) {
	seen := map[string]string{}
	for _, k := range codecKeys {
		enc := encodeKey(k)
		if !validJetStreamKey(enc) {
			t.Errorf("encodeKey(%q) = %q, not a valid JetStream key", k, enc)
		}
		dec, ok := decodeKey(enc)
		if !ok || dec != k {
			t.Errorf("decodeKey(encodeKey(%q)) = %q, %v", k, dec, ok)
		}
		if prev, dup := seen[enc]; dup {
			t.Errorf("keys %q and %q both encode to %q", prev, k, enc)
		}
		seen[enc] = k
	}
}

func TestEncodeKeyExamples(t *testing.T) {
	for _, c := range []struct{ key, enc string }{
		{"agentkit/v1/bot/sessions/s1/meta", "agentkit.v1.bot.sessions.s1.meta"},
		{"a.b", "a=2Eb"},
		{"a//b", "a.=.b"},
		{"a/", "a.="},
		{"alert-memory%2Fabc", "alert-memory=252Fabc"},
		{"héllo", "h=C3=A9llo"},
	} {
		if got := encodeKey(c.key); got != c.enc {
			t.Errorf("encodeKey(%q) = %q, want %q", c.key, got, c.enc)
		}
	}
}

func TestDecodeKeyRejectsForeignKeys(t *testing.T) {
	for _, s := range []string{"", "a..b", ".a", "a.", "a/b", "=2e", "=41", "=2", "=G0", "a=", "==", "=2F", "a.=.=3"} {
		if k, ok := decodeKey(s); ok {
			t.Errorf("decodeKey(%q) = %q, want rejection (encodeKey never produces it)", s, k)
		}
	}
}

// The filter for a prefix must match every key that starts with it: a
// token filter "T1.T2.>" matches subjects whose first tokens are T1, T2 and
// that have at least one more token.
func TestFilterCoversPrefix(t *testing.T) {
	matches := func(filter, subject string) bool {
		if filter == "" {
			return true
		}
		ft := strings.Split(filter, ".")
		st := strings.Split(subject, ".")
		for i, f := range ft {
			if f == ">" {
				return len(st) > i
			}
			if i >= len(st) || st[i] != f {
				return false
			}
		}
		return len(ft) == len(st)
	}
	for _, k := range codecKeys {
		for i := 0; i <= len(k); i++ {
			p := k[:i]
			if !utf8.ValidString(p) {
				continue
			}
			if f := filterFor(p); !matches(f, encodeKey(k)) {
				t.Errorf("filterFor(%q) = %q does not match key %q (encoded %q)", p, f, k, encodeKey(k))
			}
		}
	}
	if f := filterFor("a/b/c"); f != "a.b.>" {
		t.Errorf(`filterFor("a/b/c") = %q, want "a.b.>"`, f)
	}
	if f := filterFor("abc"); f != "" {
		t.Errorf(`filterFor("abc") = %q, want no filter`, f)
	}
}

func FuzzKeyCodec(f *testing.F) {
	for _, k := range codecKeys {
		f.Add(k, "b")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := encodeKey(a), encodeKey(b)
		if a != "" && !validJetStreamKey(ea) {
			t.Fatalf("encodeKey(%q) = %q is not a valid JetStream key", a, ea)
		}
		if d, ok := decodeKey(ea); !ok || d != a {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", a, d, ok)
		}
		if (a == b) != (ea == eb) {
			t.Fatalf("injectivity: %q -> %q, %q -> %q", a, ea, b, eb)
		}
	})
}
