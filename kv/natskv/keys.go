package natskv

import (
	"strings"

	"agentkit/kv/internal/driverkit"
)

// JetStream keys are subjects: the alphabet is [-/_=.a-zA-Z0-9], a dot
// separates tokens, and no token may be empty. The mapping below turns any
// kv key into such a subject, reversibly and injectively:
//
//   - the key is split at '/' and each segment becomes one token, so a
//     prefix ending in '/' can be listed with a token filter ("a.b.>");
//   - within a segment, the bytes A-Z a-z 0-9 '-' '_' stay as they are and
//     every other byte (the '.' and the '=' included) becomes '=' and two
//     upper-case hex digits (driverkit's escape);
//   - an empty segment becomes the token "=", which no non-empty segment
//     produces (its escapes always carry two hex digits).
//
// The mapping does not keep the order of keys, so listings sort after
// decoding.

// esc spells a segment in JetStream's alphabet.
var esc = driverkit.Escaper{Mark: '=', Keep: driverkit.AlphaNum}

// emptyToken spells the empty segment.
const emptyToken = "="

// encodeKey maps a kv key (or a '/'-terminated part of one) to a JetStream key.
func encodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + len(key)/2)
	first := true
	for seg := range strings.SplitSeq(key, "/") {
		if !first {
			b.WriteByte('.')
		}
		first = false
		if seg == "" {
			b.WriteString(emptyToken)
			continue
		}
		esc.Write(&b, seg)
	}
	return b.String()
}

// decodeKey reverses encodeKey. It reports false for a JetStream key this
// driver did not write (one outside the image of encodeKey): only the
// canonical spelling decodes, so the mapping stays injective both ways.
func decodeKey(s string) (string, bool) {
	var b strings.Builder
	b.Grow(len(s))
	first := true
	for tok := range strings.SplitSeq(s, ".") {
		if !first {
			b.WriteByte('/')
		}
		first = false
		switch tok {
		case "":
			return "", false
		case emptyToken:
			continue
		}
		seg, ok := esc.Unescape(tok)
		if !ok || esc.Len(seg) != len(tok) || strings.IndexByte(seg, '/') >= 0 {
			return "", false // a byte escaped that need not be, or a '/'
		}
		b.WriteString(seg)
	}
	return b.String(), true
}

// filterFor returns the JetStream subject filter that selects a superset of
// the keys starting with prefix, or "" when every key must be read. Filters
// match whole tokens only, so the filter covers the prefix's complete
// segments (everything up to its last '/').
func filterFor(prefix string) string {
	i := strings.LastIndexByte(prefix, '/')
	if i < 0 {
		return ""
	}
	return encodeKey(prefix[:i]) + ".>"
}
