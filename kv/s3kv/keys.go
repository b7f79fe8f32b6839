package s3kv

import (
	"strings"
)

// Object names. S3-class servers rewrite or refuse some names (`a/../x`
// becomes `x`, `//` collapses, a file `x` and a folder `x/` cannot both
// exist on a posix backend, a path component longer than 255 bytes is
// refused), so every key is mapped to a name none of them touches, and back:
//
//   - The key is split at '/', and each segment becomes one or more path
//     components, so the server's folders follow the key's structure and a
//     prefix ending in '/' lists one folder.
//   - In a segment, A-Z a-z 0-9 '-' '_' stay as they are; every other byte
//     (the '.' included, so no component is "." or ".." or hidden) becomes
//     '!' and two upper-case hex digits.
//   - An empty segment becomes "!-".
//   - An escaped segment longer than maxPiece bytes is cut into pieces of at
//     most maxPiece bytes (never inside an escape); every piece but the last
//     ends with "!_", so components stay well under 255 bytes.
//   - The key's last component ends with '!'. Folders never do, so the key
//     `x` (object `x!`) and the key `x/y` (object `x/y!`, in folder `x`)
//     never clash.
//
// Since '!' is always followed by two hex digits inside a segment, the
// markers "!-", "!_" and a final '!' are unambiguous. Decoding accepts only
// names that encode back to themselves, so the mapping is injective both
// ways and foreign objects are ignored. The mapping does not keep key
// order; listings sort after decoding.

const (
	hexDigits = "0123456789ABCDEF"
	// maxPiece is the longest escaped piece of a segment in one component;
	// with its marker a component is at most maxPiece+2 bytes.
	maxPiece = 200
	emptySeg = "!-"
	contMark = "!_"
	termMark = "!"
)

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func escapeSegment(seg string) string {
	n := 0
	for i := 0; i < len(seg); i++ {
		if !plain(seg[i]) {
			n++
		}
	}
	if n == 0 {
		return seg
	}
	var b strings.Builder
	b.Grow(len(seg) + 2*n)
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('!')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// cut returns where the first piece of an escaped segment ends: the last
// token boundary at or before maxPiece.
func cut(e string) int {
	b := maxPiece
	// An escape is 3 bytes starting with '!': back off if b splits one.
	if e[b-1] == '!' {
		b--
	} else if e[b-2] == '!' {
		b -= 2
	}
	return b
}

// writeSegment writes an escaped segment as components, with continuation
// marks between its pieces; the last piece is written without a mark.
func writeSegment(b *strings.Builder, e string) {
	if e == "" {
		b.WriteString(emptySeg)
		return
	}
	for len(e) > maxPiece {
		n := cut(e)
		b.WriteString(e[:n])
		b.WriteString(contMark)
		b.WriteByte('/')
		e = e[n:]
	}
	b.WriteString(e)
}

// encodeKey maps a key to its object name (relative to the store's prefix).
func encodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + len(key)/4 + 2)
	first := true
	for seg := range strings.SplitSeq(key, "/") {
		if !first {
			b.WriteByte('/')
		}
		first = false
		writeSegment(&b, escapeSegment(seg))
	}
	b.WriteString(termMark)
	return b.String()
}

// listPrefix returns the object-name prefix shared by the names of every
// key that starts with prefix. Complete segments (up to the last '/') map
// to their folders; the rest of the prefix is escaped and cut the way a
// longer segment starting with it would be.
func listPrefix(prefix string) string {
	var b strings.Builder
	rest := prefix
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		first := true
		for seg := range strings.SplitSeq(prefix[:i], "/") {
			if !first {
				b.WriteByte('/')
			}
			first = false
			writeSegment(&b, escapeSegment(seg))
		}
		b.WriteByte('/')
		rest = prefix[i+1:]
	}
	e := escapeSegment(rest)
	for len(e) > maxPiece {
		n := cut(e)
		b.WriteString(e[:n])
		b.WriteString(contMark)
		b.WriteByte('/')
		e = e[n:]
	}
	b.WriteString(e)
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

// decodeKey reverses encodeKey. It reports false for a name encodeKey does
// not produce (an object this driver did not write).
func decodeKey(name string) (string, bool) {
	body, ok := strings.CutSuffix(name, termMark)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(body))
	comps := strings.Split(body, "/")
	for i, c := range comps {
		piece, cont := strings.CutSuffix(c, contMark)
		if cont && i == len(comps)-1 {
			return "", false
		}
		if piece == emptySeg && !cont {
			piece = ""
		}
		for j := 0; j < len(piece); j++ {
			ch := piece[j]
			if plain(ch) {
				b.WriteByte(ch)
				continue
			}
			if ch != '!' || j+2 >= len(piece) {
				return "", false
			}
			hi, ok1 := unhex(piece[j+1])
			lo, ok2 := unhex(piece[j+2])
			if !ok1 || !ok2 {
				return "", false
			}
			b.WriteByte(hi<<4 | lo)
			j += 2
		}
		if !cont && i < len(comps)-1 {
			b.WriteByte('/')
		}
	}
	key := b.String()
	if encodeKey(key) != name {
		return "", false
	}
	return key, true
}
