package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// FuzzSegment checks the invariants of the segment encoding on two inputs
// at a time: determinism, the bound, the output alphabet, that digests are
// exactly the SHA-256 of the raw bytes, that Unsegment inverts every
// non-digest output, and that two different inputs never share a non-digest
// output. The seed corpus is in testdata/fuzz/FuzzSegment.
func FuzzSegment(f *testing.F) {
	f.Add("slack", "C0123/thread 1")
	f.Fuzz(func(t *testing.T, a, b string) {
		ea := checkSegment(t, a)
		eb := checkSegment(t, b)
		if a != b && ea == eb && ea != "" && !IsDigest(ea) {
			t.Fatalf("Segment(%q) and Segment(%q) share the output %q", a, b, ea)
		}
		if a == b && ea != eb {
			t.Fatalf("Segment(%q) is not deterministic: %q then %q", a, ea, eb)
		}
	})
}

// checkSegment checks one input and returns its encoding ("" for "").
func checkSegment(t *testing.T, raw string) string {
	t.Helper()
	enc, err := Segment(raw)
	if raw == "" {
		if err == nil {
			t.Fatal("Segment(\"\") succeeded")
		}
		return ""
	}
	if err != nil {
		t.Fatalf("Segment(%q): %v", raw, err)
	}
	if again, _ := Segment(raw); again != enc {
		t.Fatalf("Segment(%q) is not deterministic: %q then %q", raw, enc, again)
	}
	plain := reference(raw)
	if len(plain) > MaxSegment {
		sum := sha256.Sum256([]byte(raw))
		if want := "sha256:" + hex.EncodeToString(sum[:]); enc != want {
			t.Fatalf("Segment(%q) = %q, want the digest %q", raw, enc, want)
		}
		if len(enc) != 71 || !IsDigest(enc) {
			t.Fatalf("digest %q is malformed", enc)
		}
		return enc
	}
	if enc != plain {
		t.Fatalf("Segment(%q) = %q, want %q", raw, enc, plain)
	}
	if len(enc) > MaxSegment {
		t.Fatalf("Segment(%q) is %d bytes", raw, len(enc))
	}
	if IsDigest(enc) {
		t.Fatalf("Segment(%q) = %q looks like a digest", raw, enc)
	}
	if strings.ContainsAny(enc, ":/") {
		t.Fatalf("Segment(%q) = %q contains ':' or '/'", raw, enc)
	}
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if !unreservedRef(c) && c != '%' {
			t.Fatalf("Segment(%q) = %q has %q outside the alphabet", raw, enc, c)
		}
	}
	back, err := Unsegment(enc)
	if err != nil {
		t.Fatalf("Unsegment(%q): %v", enc, err)
	}
	if back != raw {
		t.Fatalf("Unsegment(Segment(%q)) = %q", raw, back)
	}
	return enc
}

func unreservedRef(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0
}

// FuzzUnsegment checks that Unsegment accepts only what Segment returns:
// whenever it succeeds, encoding its result gives the input back.
func FuzzUnsegment(f *testing.F) {
	for _, s := range []string{"a", "%41", "%2F", "%2f", "h%C3%A9llo", "%", "a%2", "sha256%3Aabc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := Unsegment(s)
		if err != nil {
			return
		}
		if enc, _ := Segment(raw); enc != s {
			t.Fatalf("Unsegment(%q) = %q, but Segment of that is %q", s, raw, enc)
		}
	})
}
