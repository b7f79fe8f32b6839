package natskv

import (
	"strings"
)

// JetStream keys are subjects: the alphabet is [-/_=.a-zA-Z0-9], a dot
// separates tokens, and no token may be empty. The mapping below turns any
// kv key into such a subject, reversibly and injectively:
//
//   - the key is split at '/' and each segment becomes one token, so a
//     prefix ending in '/' can be listed with a token filter ("a.b.>");
//   - within a segment, the bytes A-Z a-z 0-9 '-' '_' stay as they are and
//     every other byte (the '.' and the '=' included) becomes '=' and two
//     upper-case hex digits;
//   - an empty segment becomes the token "=", which no non-empty segment
//     produces (its escapes always carry two hex digits).
//
// The mapping does not keep the order of keys, so listings sort after
// decoding.

const hexDigits = "0123456789ABCDEF"

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// encodeKey maps a kv key (or a '/'-terminated part of one) to a JetStream key.
func encodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + len(key)/2)
	start := true
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == '/' {
			if start {
				b.WriteByte('=')
			}
			b.WriteByte('.')
			start = true
			continue
		}
		start = false
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	if start {
		b.WriteByte('=')
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// decodeKey reverses encodeKey. It reports false for a JetStream key this
// driver did not write (one outside the image of encodeKey).
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
		case "=":
			continue // an empty segment
		}
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if plain(c) {
				b.WriteByte(c)
				continue
			}
			if c != '=' || i+2 >= len(tok) {
				return "", false
			}
			hi, ok1 := unhex(tok[i+1])
			lo, ok2 := unhex(tok[i+2])
			v := hi<<4 | lo
			// Only the canonical form decodes, so the mapping stays
			// injective in both directions.
			if !ok1 || !ok2 || plain(v) || v == '/' {
				return "", false
			}
			b.WriteByte(v)
			i += 2
		}
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
