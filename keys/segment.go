// Package keys builds every key agentkit writes to a store: the bounded
// segment encoding and the key families under the root "agentkit/v1/".
//
// A segment whose content a caller controls (an agent name, a session id, a
// continuation token, an author's host-KV key) goes through [Segment]: its
// bytes are percent-encoded, keeping only the characters JavaScript's
// encodeURIComponent keeps, and a result longer than [MaxSegment] bytes is
// replaced by "sha256:" and the hex SHA-256 of the raw bytes. The encoding is
// deterministic, so a write and a later lookup agree; it never produces "/"
// or ":" outside a digest, so segments cannot run into each other and a
// digest cannot collide with an encoded segment; and every key it builds
// stays far below kv.MaxKeyLength.
//
// Runtime code starts from an agent's [Scope]:
//
//	k, err := keys.Agent("support")
//	meta, err := k.SessionMeta(sessionID)  // agentkit/v1/support/sessions/{id}/meta
//	prefix, err := k.EventsPrefix(sessionID)
//
// and turns listed keys back into their parts with [Parse] and [Unsegment].
// Users of the library never build keys: host KV adds its prefix itself.
package keys

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

const (
	// MaxSegment is the longest percent-encoded segment, in bytes. A longer
	// encoding is replaced by its digest.
	MaxSegment = 256
	// DigestPrefix starts every digest segment.
	DigestPrefix = "sha256:"
	// DigestLen is the length of a digest segment: the prefix and 64 hex
	// digits.
	DigestLen = len(DigestPrefix) + 2*sha256.Size
)

// Errors matched with errors.Is.
var (
	// ErrEmptySegment means a caller-controlled segment was empty.
	ErrEmptySegment = errors.New("keys: empty segment")
	// ErrDigest means a segment is a digest: the raw value it stands for
	// cannot be recovered from the key, only from the stored record.
	ErrDigest = errors.New("keys: segment is a sha256 digest")
	// ErrMalformed means a string is not something this package produces:
	// a segment Segment could not have returned, or a key outside the
	// families.
	ErrMalformed = errors.New("keys: malformed")
)

// unreserved marks the bytes a segment keeps as they are: A-Z a-z 0-9 and
// - _ . ! ~ * ' ( ).
var unreserved = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.!~*'()") {
		t[c] = true
	}
	return t
}()

const upperHex = "0123456789ABCDEF"

// Segment encodes one caller-controlled key segment. Every byte outside
// A-Z a-z 0-9 - _ . ! ~ * ' ( ) becomes %XX with upper-case hex, byte by
// byte, so multi-byte UTF-8 and invalid UTF-8 alike are encoded exactly. When
// the encoding is longer than MaxSegment bytes, the result is instead
// DigestPrefix followed by the lower-case hex SHA-256 of raw's bytes
// (DigestLen bytes). An empty raw is an error matching ErrEmptySegment.
func Segment(raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("%w: give a non-empty value", ErrEmptySegment)
	}
	return encode(raw), nil
}

// encode is Segment for a non-empty raw.
func encode(raw string) string {
	n := encodedLen(raw)
	if n > MaxSegment {
		return Digest(raw)
	}
	if n == len(raw) {
		return raw
	}
	return percentEncode(raw, n)
}

// Digest returns the digest segment of raw: DigestPrefix and the lower-case
// hex SHA-256 of raw's bytes. Segment returns it for raw values whose
// encoding is too long; it is exported for stores that keep the raw value in
// their records and want to check it against a key.
func Digest(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return DigestPrefix + hex.EncodeToString(sum[:])
}

// encodedLen is the length of raw's percent-encoding.
func encodedLen(raw string) int {
	n := len(raw)
	for i := 0; i < len(raw); i++ {
		if !unreserved[raw[i]] {
			n += 2
		}
	}
	return n
}

// percentEncode encodes raw, whose encoding is n bytes long, with no bound.
func percentEncode(raw string, n int) string {
	var b strings.Builder
	b.Grow(n)
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if unreserved[c] {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0xf])
	}
	return b.String()
}

// IsDigest reports whether seg is a digest segment: DigestPrefix followed by
// 64 lower-case hex digits.
func IsDigest(seg string) bool {
	if len(seg) != DigestLen || !strings.HasPrefix(seg, DigestPrefix) {
		return false
	}
	for i := len(DigestPrefix); i < len(seg); i++ {
		c := seg[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Unsegment reverses Segment: it returns the raw value of an encoded
// segment. It accepts exactly the strings Segment returns, so
// Segment(Unsegment(s)) == s whenever Unsegment succeeds. A digest segment
// gives an error matching ErrDigest (the raw value is not in the key; stores
// that need it keep it in the record); anything Segment could not have
// returned, such as "%41" for "A", lower-case hex, a stray "%" or a "/",
// gives an error matching ErrMalformed.
func Unsegment(seg string) (string, error) {
	switch {
	case seg == "":
		return "", fmt.Errorf("%w: the segment is empty", ErrEmptySegment)
	case IsDigest(seg):
		return "", fmt.Errorf("%w: %q stands for a value too long to keep in a key; read the value from the stored record", ErrDigest, seg)
	case len(seg) > MaxSegment:
		return "", fmt.Errorf("%w: segment of %d bytes is longer than %d", ErrMalformed, len(seg), MaxSegment)
	}
	if encodedLen(seg) == len(seg) {
		return seg, nil // nothing encoded
	}
	out := make([]byte, 0, len(seg))
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if unreserved[c] {
			out = append(out, c)
			continue
		}
		if c != '%' {
			return "", fmt.Errorf("%w: segment %q has %q at byte %d, which Segment never emits", ErrMalformed, seg, c, i)
		}
		if i+2 >= len(seg) {
			return "", fmt.Errorf("%w: segment %q ends inside an escape", ErrMalformed, seg)
		}
		hi, lo := unhex(seg[i+1]), unhex(seg[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("%w: segment %q has a bad escape at byte %d (Segment writes %%XX with upper-case hex)", ErrMalformed, seg, i)
		}
		d := byte(hi<<4 | lo)
		if unreserved[d] {
			return "", fmt.Errorf("%w: segment %q escapes %q at byte %d, which Segment keeps as it is", ErrMalformed, seg, d, i)
		}
		out = append(out, d)
		i += 2
	}
	return string(out), nil
}

// unhex decodes an upper-case hex digit, or returns -1.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
