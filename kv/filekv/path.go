package filekv

import (
	"strings"

	"agentkit/kv/internal/driverkit"
)

// How keys become paths.
//
// A key is split at '/' into segments. Every segment but the last names a
// directory; the last names a file whose name ends in ".kv". Each segment is
// spelled with the bytes of the key's alphabet that are safe in file names
// (letters, digits and - _ . ! ~ * ' ( ) % :) kept as they are, and every
// other byte written as '+' and two upper-case hex digits. A '.' that starts
// a name is escaped too, so no name is ".", ".." or hidden, and the driver's
// own files (all starting with '.') never meet a key. A segment whose text
// ends in ".kv" has that dot escaped, so a directory name never ends in
// ".kv" and never equals a file name: "x" (x.kv) and "x/y" (x/y.kv) both
// exist. The empty segment is spelled "+".
//
// A segment longer than maxPiece encoded bytes is cut into pieces; every
// piece but the last is a directory whose name ends in ',' (a byte the
// spelling never produces), and the rest of the segment continues below it.
// So no name exceeds 255 bytes, and the mapping stays injective: decoding a
// path gives back the key, and only canonical spellings are accepted.

const (
	fileSuffix = ".kv"
	// contSuffix ends the name of a directory holding the continuation of
	// a segment too long for one name.
	contSuffix = ","
	// emptySegment spells the empty segment (as in "a//b" or "a/").
	emptySegment = "+"
	// maxPiece bounds the encoded bytes of one piece. With the two bytes
	// the trailing-".kv" escape can add and a three-byte suffix, a name
	// stays well under the 255-byte limit of common file systems.
	maxPiece = 240
)

// esc spells a byte that is not literal as '+' and two hex digits.
var esc = driverkit.Escaper{Mark: '+', Keep: literal}

// literal reports whether c is kept as itself in a name.
func literal(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '_', '.', '!', '~', '*', '\'', '(', ')', '%', ':':
		return true
	}
	return false
}

// keyPath returns the directory (slash-separated, relative to the root, ""
// for the root itself) and the file name holding key.
func keyPath(key string) (dir, file string) {
	segs := strings.Split(key, "/")
	var b strings.Builder
	b.Grow(len(key) + len(key)/2 + 8)
	for _, s := range segs[:len(segs)-1] {
		appendSegment(&b, s, "")
		b.WriteByte('/')
	}
	appendSegment(&b, segs[len(segs)-1], fileSuffix)
	p := b.String()
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

// dirPath returns the directory, relative to the root, that holds the keys
// whose first segments are segs.
func dirPath(segs []string) string {
	var b strings.Builder
	for i, s := range segs {
		if i > 0 {
			b.WriteByte('/')
		}
		appendSegment(&b, s, "")
	}
	return b.String()
}

// appendSegment writes the names spelling one segment, joined by '/', the
// last with suffix.
func appendSegment(b *strings.Builder, seg, suffix string) {
	if seg == "" {
		b.WriteString(emptySegment)
		b.WriteString(suffix)
		return
	}
	start := 0
	for start < len(seg) {
		end, n := start, 0
		for end < len(seg) {
			c := 1
			if !literal(seg[end]) || (seg[end] == '.' && end == start) {
				c = 3
			}
			if n+c > maxPiece {
				break
			}
			n += c
			end++
		}
		last := end == len(seg)
		appendPiece(b, seg[start:end], last)
		if last {
			b.WriteString(suffix)
		} else {
			b.WriteString(contSuffix)
			b.WriteByte('/')
		}
		start = end
	}
}

// appendPiece spells raw bytes of one piece. last marks the segment's final
// piece, whose trailing ".kv" gets its dot escaped.
func appendPiece(b *strings.Builder, raw string, last bool) {
	kvDot := -1
	if last && strings.HasSuffix(raw, fileSuffix) {
		kvDot = len(raw) - len(fileSuffix)
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		esc.Put(b, c, c == '.' && (i == 0 || i == kvDot))
	}
}

// decodeText reverses appendPiece leniently (callers check canonical form
// by encoding the whole key again). It reports false for text no encoder
// would write a byte of.
func decodeText(s string) (string, bool) {
	if s == emptySegment {
		return "", true
	}
	return esc.Unescape(s)
}

// entryKind is what a directory entry's name says it is.
type entryKind int

const (
	kindForeign entryKind = iota // not written by this driver
	kindFile                     // a key's file: the last piece of the last segment
	kindDir                      // the last piece of a segment followed by more segments
	kindCont                     // a piece of a long segment that continues below
)

// classify reads a directory entry's name. text is the decoded piece.
func classify(name string, isDir, isRegular bool) (entryKind, string) {
	if name == "" || name[0] == '.' {
		return kindForeign, ""
	}
	var kind entryKind
	var enc string
	switch {
	case isRegular && strings.HasSuffix(name, fileSuffix):
		kind, enc = kindFile, name[:len(name)-len(fileSuffix)]
	case isDir && strings.HasSuffix(name, contSuffix):
		kind, enc = kindCont, name[:len(name)-len(contSuffix)]
		if enc == emptySegment || enc == "" {
			return kindForeign, ""
		}
	case isDir && !strings.HasSuffix(name, fileSuffix):
		kind, enc = kindDir, name
	default:
		return kindForeign, ""
	}
	text, ok := decodeText(enc)
	if !ok {
		return kindForeign, ""
	}
	return kind, text
}
