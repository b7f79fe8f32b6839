package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestSegmentSpecTable checks every example of 02-keys.md, digests as the
// spec prints them.
func TestSegmentSpecTable(t *testing.T) {
	tests := []struct {
		name, raw, want string
	}{
		{"plain", "slack", "slack"},
		{"slash and space", "C0123/thread 1", "C0123%2Fthread%201"},
		{"UTF-8", "héllo", "h%C3%A9llo"},
		{"colon", "sha256:abc", "sha256%3Aabc"},
		{"256 a", strings.Repeat("a", 256), strings.Repeat("a", 256)},
		{"257 a", strings.Repeat("a", 257), "sha256:e8d95cc2b4bc198c54b40bd214df958afb65f5e73d2c2eafe0593cf5c635c1f0"},
		{"42 é", strings.Repeat("é", 42), strings.Repeat("%C3%A9", 42)},
		{"43 é", strings.Repeat("é", 43), "sha256:d034107ed46657dc87b9e260e78d1d5c542a15cd7b41edc08937d0a7538ee557"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Segment(tt.raw)
			if err != nil {
				t.Fatalf("Segment: %v", err)
			}
			if got != tt.want {
				t.Fatalf("Segment(%q) = %q, want %q", tt.raw, got, tt.want)
			}
		})
	}
	if n := len(strings.Repeat("%C3%A9", 42)); n != 252 {
		t.Fatalf("42 × é encodes to %d bytes, the spec says 252", n)
	}
}

// reference is an independent, slow percent-encoder with no bound.
func reference(raw string) string {
	const keep = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.!~*'()"
	var b strings.Builder
	for _, c := range []byte(raw) {
		if strings.IndexByte(keep, c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func TestSegmentEveryByte(t *testing.T) {
	kept := 0
	for i := range 256 {
		raw := string([]byte{byte(i)})
		got, err := Segment(raw)
		if err != nil {
			t.Fatalf("Segment(%q): %v", raw, err)
		}
		if want := reference(raw); got != want {
			t.Errorf("Segment(%q) = %q, want %q", raw, got, want)
		}
		if got == raw {
			kept++
		}
	}
	// 26 + 26 + 10 letters and digits, and - _ . ! ~ * ' ( ).
	if kept != 71 {
		t.Errorf("%d bytes kept as they are, want 71", kept)
	}
}

func TestSegmentInvalidUTF8(t *testing.T) {
	got, err := Segment("a\xff\xfe\x00b")
	if err != nil {
		t.Fatal(err)
	}
	if want := "a%FF%FE%00b"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestSegmentBound(t *testing.T) {
	digestOf := func(raw string) string {
		sum := sha256.Sum256([]byte(raw))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	for _, tt := range []struct {
		raw    string
		digest bool
	}{
		{strings.Repeat("%", 85), false},       // 255 encoded bytes
		{strings.Repeat("%", 85) + "a", false}, // 256
		{strings.Repeat("%", 86), true},        // 258
		{strings.Repeat("a", 255) + "/", true}, // 258
		{strings.Repeat("\xff", 86), true},     // invalid UTF-8, 258
		{strings.Repeat("x", 10000), true},
	} {
		got, err := Segment(tt.raw)
		if err != nil {
			t.Fatal(err)
		}
		if tt.digest {
			if got != digestOf(tt.raw) || len(got) != DigestLen || !IsDigest(got) {
				t.Errorf("Segment(%d bytes) = %q, want the digest of the raw bytes", len(tt.raw), got)
			}
			if got != Digest(tt.raw) {
				t.Errorf("Digest disagrees with Segment")
			}
			continue
		}
		if got != reference(tt.raw) || len(got) > MaxSegment {
			t.Errorf("Segment(%q) = %q (%d bytes), want the plain encoding", tt.raw, got, len(got))
		}
	}
	if DigestLen != 71 {
		t.Errorf("DigestLen = %d, want 71", DigestLen)
	}
}

func TestSegmentEmpty(t *testing.T) {
	_, err := Segment("")
	if !errors.Is(err, ErrEmptySegment) {
		t.Fatalf("Segment(\"\") error = %v, want ErrEmptySegment", err)
	}
}

func TestSegmentNoAllocWhenUnchanged(t *testing.T) {
	raw := strings.Repeat("abc", 20)
	if n := testing.AllocsPerRun(100, func() { _, _ = Segment(raw) }); n != 0 {
		t.Errorf("Segment of an already-safe string allocates %v times", n)
	}
}

func TestUnsegment(t *testing.T) {
	for _, raw := range []string{"slack", "C0123/thread 1", "héllo", "sha256:abc", "\x00\xff", "%41", strings.Repeat("%", 85) + "a"} {
		enc, err := Segment(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Unsegment(enc)
		if err != nil {
			t.Fatalf("Unsegment(%q): %v", enc, err)
		}
		if got != raw {
			t.Errorf("Unsegment(Segment(%q)) = %q", raw, got)
		}
	}

	digest, _ := Segment(strings.Repeat("a", 257))
	if _, err := Unsegment(digest); !errors.Is(err, ErrDigest) {
		t.Errorf("Unsegment(digest) error = %v, want ErrDigest", err)
	}
	if _, err := Unsegment(""); !errors.Is(err, ErrEmptySegment) {
		t.Errorf("Unsegment(\"\") error = %v, want ErrEmptySegment", err)
	}
	for _, bad := range []string{
		"%41",                               // escapes a kept byte
		"%2f",                               // lower-case hex
		"%",                                 // truncated
		"ab%2",                              // truncated
		"%G0",                               // not hex
		"a/b",                               // a byte Segment never keeps
		"a:b",                               // likewise
		"a b",                               // likewise
		"SHA256:" + strings.Repeat("a", 64), // not a digest, and ":" is never kept
		"sha256:" + strings.Repeat("A", 64), // upper-case digest is not one
		strings.Repeat("a", MaxSegment+1),   // longer than the bound
	} {
		if _, err := Unsegment(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("Unsegment(%q) error = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestIsDigest(t *testing.T) {
	d := Digest("x")
	for s, want := range map[string]bool{
		d:                       true,
		d[:70]:                  false,
		d + "0":                 false,
		"sha256%3A" + d[7:]:     false,
		strings.ToUpper(d):      false,
		"sha256:" + d[8:] + "g": false,
	} {
		if got := IsDigest(s); got != want {
			t.Errorf("IsDigest(%q) = %v, want %v", s, got, want)
		}
	}
}
