package s3kv

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"agentkit/kv/internal/driverkit"
)

// Object names. S3-class servers rewrite or refuse some names: `a/../x`
// becomes `x`, `//` collapses, a file `x` and a folder `x/` cannot both
// exist on a posix backend, a path component over 255 bytes is refused,
// XML 1.0 cannot carry control characters or U+FFFE and U+FFFF in a
// listing, and a name is at most 1,024 bytes. Every key is mapped to a name
// none of this touches, and back:
//
//   - The key is split at '/', and each segment becomes one or more path
//     components, so the server's folders follow the key's structure and a
//     prefix ending in '/' lists one folder.
//   - In a segment, bytes stand for themselves except those a server
//     mangles, written as '!' and two upper-case hex digits: '!' itself,
//     control characters (0x00–0x1F, 0x7F), '\', the three bytes of U+FFFE
//     and U+FFFF, and a '.' that starts a component (so no component is
//     "." or ".." or hidden).
//   - An empty segment becomes "!-".
//   - An escaped segment longer than maxPiece bytes is cut into pieces of at
//     most maxPiece bytes (never inside an escape or a character); every
//     piece but the last ends with "!_", so components stay well under 255
//     bytes.
//   - The key's last component ends with '!'. Folders never do, so the key
//     `x` (object `x!`) and the key `x/y` (object `x/y!`, in folder `x`)
//     never clash.
//
// Since '!' is always followed by two hex digits inside a segment, the
// markers "!-", "!_" and a final '!' are unambiguous. Decoding accepts only
// names that encode back to themselves, so the mapping is injective both
// ways and foreign objects are ignored.
//
// The rare name that would pass the 1,024-byte limit (with the store's
// prefix) is stored under a bounded one instead: as much of the name as
// fits, cut at a token boundary, then "!#", 32 hex digits of the key's
// SHA-256 and '!' (see longName). The object's body carries the key, so a
// listing reads it back, and the bounded name starts with every listing
// prefix it must match (see listPrefix), so the same ListObjectsV2 finds
// it and the listing merges it in order.
//
// Stores written before this mapping (key format 1) escaped every byte but
// A-Z a-z 0-9 '-' '_'; they keep that mapping (encodeV1) until migrated.
// The mapping does not keep key order; listings sort after decoding.

const (
	// maxPiece is the longest escaped piece of a segment in one component;
	// with its marker a component is at most maxPiece+2 bytes.
	maxPiece = 200
	emptySeg = "!-"
	contMark = "!_"
	termMark = "!"
	// maxName is S3's limit on an object name, prefix included.
	maxName = 1024
	// hashHex is how many hex digits of the key's SHA-256 a bounded name
	// carries (128 bits).
	hashHex = 32
	// longMark starts the tail of a bounded name; longTail is the length
	// of that tail: "!#", the hash and the final '!'.
	longMark = "!#"
	longTail = len(longMark) + hashHex + 1
)

// esc is the escape of format 2: bytes stand for themselves but for the
// few a server mangles.
var esc = driverkit.Escaper{Mark: '!', Keep: func(c byte) bool {
	return c >= 0x20 && c != 0x7f && c != '!' && c != '\\'
}}

// escV1 is the escape of key format 1: A-Z a-z 0-9 '-' '_' only.
var escV1 = driverkit.Escaper{Mark: '!', Keep: driverkit.AlphaNum}

// keyCodec is one key format's mapping between keys and object names
// (relative to the store's prefix).
type keyCodec struct {
	// token appends the spelling of the character starting seg[i] and
	// returns the index after it. pieceStart says the character starts a
	// component.
	token func(b []byte, seg string, i int, pieceStart bool) ([]byte, int)
}

// tokenV2 spells one character in format 2: a kept character as it is;
// '!', a control character, '\', U+FFFE, U+FFFF and a '.' starting a
// component escaped byte by byte.
func tokenV2(b []byte, seg string, i int, pieceStart bool) ([]byte, int) {
	c := seg[i]
	if c < utf8.RuneSelf {
		if esc.Keep(c) && !(c == '.' && pieceStart) {
			return append(b, c), i + 1
		}
		x := esc.Escaped(c)
		return append(b, x[:]...), i + 1
	}
	r, n := utf8.DecodeRuneInString(seg[i:])
	if n <= 1 || r == 0xFFFE || r == 0xFFFF {
		// U+FFFE and U+FFFF are not XML characters; a stray byte (not
		// in a valid key) is escaped alone.
		n = max(n, 1)
		for j := i; j < i+n; j++ {
			x := esc.Escaped(seg[j])
			b = append(b, x[:]...)
		}
		return b, i + n
	}
	return append(b, seg[i:i+n]...), i + n
}

// tokenV1 spells one byte in format 1.
func tokenV1(b []byte, seg string, i int, _ bool) ([]byte, int) {
	c := seg[i]
	if escV1.Keep(c) {
		return append(b, c), i + 1
	}
	x := escV1.Escaped(c)
	return append(b, x[:]...), i + 1
}

var (
	codecV2 = keyCodec{token: tokenV2}
	codecV1 = keyCodec{token: tokenV1}
)

// appendSegment writes one segment as its components: pieces of at most
// maxPiece bytes, each but the last followed by "!_/". A complete segment
// (not the partial end of a listing prefix) that is empty is "!-".
func (k keyCodec) appendSegment(b []byte, seg string, complete bool) []byte {
	if seg == "" {
		if complete {
			b = append(b, emptySeg...)
		}
		return b
	}
	n := 0 // bytes in the current piece
	var tok [12]byte
	for i := 0; i < len(seg); {
		t, next := k.token(tok[:0], seg, i, n == 0)
		if n+len(t) > maxPiece {
			b = append(b, contMark...)
			b = append(b, '/')
			n = 0
			t, next = k.token(tok[:0], seg, i, true)
		}
		b = append(b, t...)
		n += len(t)
		i = next
	}
	return b
}

// encode maps a key to its object name.
func (k keyCodec) encode(key string) string {
	b := make([]byte, 0, len(key)+len(key)/4+2)
	first := true
	for seg := range strings.SplitSeq(key, "/") {
		if !first {
			b = append(b, '/')
		}
		first = false
		b = k.appendSegment(b, seg, true)
	}
	b = append(b, termMark...)
	return string(b)
}

// listPrefix returns the object-name prefix shared by the names of every
// key that starts with prefix: the complete segments' folders, then the
// last, partial segment spelled and cut the way a longer segment starting
// with it would be.
func (k keyCodec) listPrefix(prefix string) string {
	var b []byte
	rest := prefix
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		first := true
		for seg := range strings.SplitSeq(prefix[:i], "/") {
			if !first {
				b = append(b, '/')
			}
			first = false
			b = k.appendSegment(b, seg, true)
		}
		b = append(b, '/')
		rest = prefix[i+1:]
	}
	return string(k.appendSegment(b, rest, false))
}

// decode reverses encode. It reports false for a name encode does not
// produce (an object this driver did not write, or a bounded name).
func (k keyCodec) decode(name string) (string, bool) {
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
		text, ok := esc.Unescape(piece)
		if !ok {
			return "", false
		}
		b.WriteString(text)
		if !cont && i < len(comps)-1 {
			b.WriteByte('/')
		}
	}
	key := b.String()
	if !utf8.ValidString(key) || k.encode(key) != name {
		return "", false
	}
	return key, true
}

// longName returns the bounded name of a key whose name enc (relative to
// the store's prefix) is too long for room bytes: enc cut at the last
// token boundary that leaves room for longTail, then "!#", the key's hash
// and '!'. It is never a folder of another name (it ends in '!'), never
// another key's name (no name encode makes holds "!#"), and starts with
// enc[:room-longTail-3].
func longName(key, enc string, room int) string {
	cut := cutAt(enc, room-longTail)
	sum := sha256.Sum256([]byte(key))
	return enc[:cut] + longMark + hex.EncodeToString(sum[:])[:hashHex] + termMark
}

// cutAt returns the largest n <= limit such that enc[:n] ends at a token
// boundary: not inside an escape, a marker or a UTF-8 character.
func cutAt(enc string, limit int) int {
	n := min(max(limit, 0), len(enc))
	for n > 0 && n < len(enc) && !utf8.RuneStart(enc[n]) {
		n--
	}
	switch {
	case n >= 1 && enc[n-1] == '!':
		n-- // between '!' and what follows it
	case n >= 2 && enc[n-2] == '!' && isHex(enc[n-1]):
		n -= 2 // inside an escape
	}
	return n
}

func isHex(c byte) bool {
	_, ok := driverkit.Unhex(c)
	return ok
}

// isLongName reports whether a name (relative to the prefix) is a bounded
// name: its last component ends with "!#", hashHex lower-case hex digits
// and '!'.
func isLongName(name string) bool {
	if len(name) < longTail || !strings.HasSuffix(name, termMark) {
		return false
	}
	tail := name[len(name)-longTail:]
	if !strings.HasPrefix(tail, longMark) {
		return false
	}
	for i := len(longMark); i < len(tail)-1; i++ {
		if c := tail[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
