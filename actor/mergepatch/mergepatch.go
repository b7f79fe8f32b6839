// Package mergepatch applies JSON merge patches (RFC 7396) to JSON
// documents, byte-exact where the RFC leaves bytes alone.
//
// A merge patch is a JSON document describing changes: keys of an object
// patch are merged into the target, nested objects merge recursively, a null
// value deletes its key, and anything else (an array, a string, a number,
// true, false) replaces the target's value whole:
//
//	target: {"a":"b","c":{"d":"e","f":"g"}}
//	patch:  {"a":"z","c":{"f":null}}
//	result: {"a":"z","c":{"d":"e"}}
//
// The package follows the RFC's algorithm to the letter, including the two
// cases popular Go libraries get wrong: a null inside an array of the patch
// is kept (arrays replace as they are: {"a":[1,null,{"x":null}]} sets a to
// exactly that array), and an object patch applied to a null, a scalar or an
// array treats the target as {}.
//
// Values are never decoded into Go numbers or re-encoded strings: numbers
// keep their digits (12345678901234567890 and
// 0.1000000000000000055511151231257827 come back byte for byte) and strings
// keep their escapes. The result is compact (no whitespace between tokens);
// an object keeps the target's key order, with keys the patch adds appended
// in the patch's order.
//
// Input is checked strictly (RFC 8259): invalid JSON, invalid UTF-8, a
// duplicate key in one object and nesting deeper than MaxDepth are refused
// with a *SyntaxError naming the document, the line, the column and the byte
// offset.
package mergepatch

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects accepted in a
// document.
const MaxDepth = 1000

// ErrInvalid matches every *SyntaxError through errors.Is.
var ErrInvalid = errors.New("mergepatch: invalid JSON")

// SyntaxError says where a document is not valid JSON.
type SyntaxError struct {
	// Doc names the document: "patch", "target" or "document".
	Doc string
	// Offset is the byte offset of the problem, from 0.
	Offset int
	// Line and Column locate the offset, from 1; Column counts bytes.
	Line, Column int
	// Msg says what is wrong.
	Msg string
}

// Error names the document, the position and the problem.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON in the %s at line %d, column %d (byte %d): %s", e.Doc, e.Line, e.Column, e.Offset, e.Msg)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *SyntaxError) Is(target error) bool { return target == ErrInvalid }

// Apply returns target with patch merged in (RFC 7396). An empty target
// (nil or no bytes) stands for a missing document and is treated as null.
// Neither argument is modified; the result is a new slice.
func Apply(target, patch []byte) ([]byte, error) {
	p, err := parse(patch, "patch")
	if err != nil {
		return nil, err
	}
	var t *value
	if len(target) > 0 {
		if t, err = parse(target, "target"); err != nil {
			return nil, err
		}
	}
	out := make([]byte, 0, len(target)+len(patch))
	return merge(t, p).appendTo(out), nil
}

// Validate checks that doc is one valid JSON value by the rules Apply
// holds a patch to. which names the document in the error.
func Validate(doc []byte, which string) error {
	_, err := parse(doc, which)
	return err
}

// Compact returns doc without whitespace between tokens, after checking it
// as Validate does. Numbers and strings keep their bytes.
func Compact(doc []byte, which string) ([]byte, error) {
	v, err := parse(doc, which)
	if err != nil {
		return nil, err
	}
	return v.appendTo(make([]byte, 0, len(doc))), nil
}

// kind is the type of a parsed value.
type kind uint8

const (
	kindNull kind = iota
	kindScalar
	kindArray
	kindObject
)

// value is a parsed JSON value. Only objects are split into members (they
// are what a merge walks); every other value is its compact bytes.
type value struct {
	kind    kind
	raw     []byte   // compact bytes, for every kind but kindObject
	members []member // for kindObject, in document order
}

// member is one name/value pair of an object.
type member struct {
	name string // the unescaped name, for comparisons
	raw  []byte // the quoted name as written
	val  *value
}

var nullValue = &value{kind: kindNull, raw: []byte("null")}

// merge is the RFC's MergePatch(Target, Patch), without mutating either.
func merge(target, patch *value) *value {
	if patch.kind != kindObject {
		return patch
	}
	var out []member
	if target != nil && target.kind == kindObject {
		out = make([]member, len(target.members), len(target.members)+len(patch.members))
		copy(out, target.members)
	}
	for _, pm := range patch.members {
		i := indexOf(out, pm.name)
		if pm.val.kind == kindNull {
			if i >= 0 {
				out = append(out[:i], out[i+1:]...)
			}
			continue
		}
		if i >= 0 {
			out[i] = member{name: out[i].name, raw: out[i].raw, val: merge(out[i].val, pm.val)}
		} else {
			out = append(out, member{name: pm.name, raw: pm.raw, val: merge(nil, pm.val)})
		}
	}
	return &value{kind: kindObject, members: out}
}

func indexOf(ms []member, name string) int {
	for i := range ms {
		if ms[i].name == name {
			return i
		}
	}
	return -1
}

// appendTo appends the value's compact JSON to b.
func (v *value) appendTo(b []byte) []byte {
	if v.kind != kindObject {
		return append(b, v.raw...)
	}
	b = append(b, '{')
	for i, m := range v.members {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m.raw...)
		b = append(b, ':')
		b = m.val.appendTo(b)
	}
	return append(b, '}')
}

// parser reads one document.
type parser struct {
	doc   []byte
	which string
	pos   int
	depth int
}

func parse(doc []byte, which string) (*value, error) {
	p := &parser{doc: doc, which: which}
	p.skipSpace()
	v, err := p.value(true)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos < len(p.doc) {
		return nil, p.errorf(p.pos, "unexpected %s after the end of the value", p.describe(p.pos))
	}
	return v, nil
}

// errorf builds a *SyntaxError at offset off.
func (p *parser) errorf(off int, format string, args ...any) error {
	line, col := 1, 1
	for i := 0; i < off && i < len(p.doc); i++ {
		if p.doc[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return &SyntaxError{Doc: p.which, Offset: off, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)}
}

// describe names the byte at off for an error message.
func (p *parser) describe(off int) string {
	if off >= len(p.doc) {
		return "end of input"
	}
	c := p.doc[off]
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("character %q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.doc) {
		switch p.doc[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses the value at p.pos (after whitespace). tree asks for objects
// split into members; below an array, values are kept as compact bytes
// only.
func (p *parser) value(tree bool) (*value, error) {
	if p.pos >= len(p.doc) {
		return nil, p.errorf(p.pos, "unexpected end of input, looking for a value")
	}
	switch c := p.doc[p.pos]; {
	case c == '{':
		return p.object(tree)
	case c == '[':
		raw, err := p.compact(nil)
		if err != nil {
			return nil, err
		}
		return &value{kind: kindArray, raw: raw}, nil
	case c == '"':
		start := p.pos
		if _, err := p.str(); err != nil {
			return nil, err
		}
		return &value{kind: kindScalar, raw: p.doc[start:p.pos:p.pos]}, nil
	case c == '-' || c >= '0' && c <= '9':
		start := p.pos
		if err := p.number(); err != nil {
			return nil, err
		}
		return &value{kind: kindScalar, raw: p.doc[start:p.pos:p.pos]}, nil
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if len(p.doc)-p.pos >= len(lit) && string(p.doc[p.pos:p.pos+len(lit)]) == lit {
				p.pos += len(lit)
				if lit == "null" {
					return nullValue, nil
				}
				return &value{kind: kindScalar, raw: []byte(lit)}, nil
			}
		}
		return nil, p.errorf(p.pos, "unexpected %s, looking for a value", p.describe(p.pos))
	}
}

// enter and leave track nesting for MaxDepth.
func (p *parser) enter() error {
	p.depth++
	if p.depth > MaxDepth {
		return p.errorf(p.pos, "nesting deeper than %d levels", MaxDepth)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

// object parses an object, as members when tree is set and as compact
// bytes otherwise.
func (p *parser) object(tree bool) (*value, error) {
	if !tree {
		raw, err := p.compact(nil)
		if err != nil {
			return nil, err
		}
		return &value{kind: kindObject, raw: raw}, nil
	}
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	p.pos++ // {
	v := &value{kind: kindObject}
	p.skipSpace()
	if p.pos < len(p.doc) && p.doc[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.doc) || p.doc[p.pos] != '"' {
			return nil, p.errorf(p.pos, "unexpected %s, looking for an object key", p.describe(p.pos))
		}
		start := p.pos
		name, err := p.str()
		if err != nil {
			return nil, err
		}
		if indexOf(v.members, name) >= 0 {
			return nil, p.errorf(start, "duplicate key %s in one object", p.doc[start:p.pos])
		}
		raw := p.doc[start:p.pos:p.pos]
		p.skipSpace()
		if p.pos >= len(p.doc) || p.doc[p.pos] != ':' {
			return nil, p.errorf(p.pos, "unexpected %s after an object key, looking for ':'", p.describe(p.pos))
		}
		p.pos++
		p.skipSpace()
		val, err := p.value(true)
		if err != nil {
			return nil, err
		}
		v.members = append(v.members, member{name: name, raw: raw, val: val})
		p.skipSpace()
		if p.pos >= len(p.doc) {
			return nil, p.errorf(p.pos, "unexpected end of input in an object, looking for ',' or '}'")
		}
		switch p.doc[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return nil, p.errorf(p.pos, "unexpected %s in an object, looking for ',' or '}'", p.describe(p.pos))
		}
	}
}

// compact parses the array or object at p.pos and appends its compact
// bytes to b. Objects inside are still checked for duplicate keys.
func (p *parser) compact(b []byte) ([]byte, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	open := p.doc[p.pos]
	closer := byte(']')
	if open == '{' {
		closer = '}'
	}
	b = append(b, open)
	p.pos++
	p.skipSpace()
	if p.pos < len(p.doc) && p.doc[p.pos] == closer {
		p.pos++
		return append(b, closer), nil
	}
	var names []string // of an object, for duplicates
	for first := true; ; first = false {
		if !first {
			b = append(b, ',')
		}
		p.skipSpace()
		if open == '{' {
			if p.pos >= len(p.doc) || p.doc[p.pos] != '"' {
				return nil, p.errorf(p.pos, "unexpected %s, looking for an object key", p.describe(p.pos))
			}
			start := p.pos
			name, err := p.str()
			if err != nil {
				return nil, err
			}
			for _, n := range names {
				if n == name {
					return nil, p.errorf(start, "duplicate key %s in one object", p.doc[start:p.pos])
				}
			}
			names = append(names, name)
			b = append(b, p.doc[start:p.pos]...)
			p.skipSpace()
			if p.pos >= len(p.doc) || p.doc[p.pos] != ':' {
				return nil, p.errorf(p.pos, "unexpected %s after an object key, looking for ':'", p.describe(p.pos))
			}
			p.pos++
			b = append(b, ':')
			p.skipSpace()
		}
		if p.pos < len(p.doc) && (p.doc[p.pos] == '[' || p.doc[p.pos] == '{') {
			var err error
			if b, err = p.compact(b); err != nil {
				return nil, err
			}
		} else {
			v, err := p.value(false)
			if err != nil {
				return nil, err
			}
			b = append(b, v.raw...)
		}
		p.skipSpace()
		if p.pos >= len(p.doc) {
			return nil, p.errorf(p.pos, "unexpected end of input, looking for ',' or '%c'", closer)
		}
		switch p.doc[p.pos] {
		case ',':
			p.pos++
		case closer:
			p.pos++
			return append(b, closer), nil
		default:
			return nil, p.errorf(p.pos, "unexpected %s, looking for ',' or '%c'", p.describe(p.pos), closer)
		}
	}
}

// str reads the string at p.pos (on its opening quote) and returns its
// unescaped content.
func (p *parser) str() (string, error) {
	start := p.pos
	p.pos++
	var buf []byte // nil while the string has no escapes
	plain := p.pos
	for {
		if p.pos >= len(p.doc) {
			return "", p.errorf(start, "string not closed")
		}
		c := p.doc[p.pos]
		switch {
		case c == '"':
			var s string
			if buf == nil {
				s = string(p.doc[plain:p.pos])
			} else {
				s = string(append(buf, p.doc[plain:p.pos]...))
			}
			p.pos++
			return s, nil
		case c == '\\':
			buf = append(buf, p.doc[plain:p.pos]...)
			r, n, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
			p.pos += n
			plain = p.pos
		case c < 0x20:
			return "", p.errorf(p.pos, "control character 0x%02x in a string; write it escaped", c)
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.doc[p.pos:])
			if r == utf8.RuneError && n <= 1 {
				return "", p.errorf(p.pos, "invalid UTF-8 in a string")
			}
			p.pos += n
		}
	}
}

// escape reads the escape sequence at p.pos and returns the rune and its
// length in bytes. A surrogate pair is read whole; a lone surrogate stands
// for U+FFFD in the unescaped name (the bytes are kept as written).
func (p *parser) escape() (rune, int, error) {
	if p.pos+1 >= len(p.doc) {
		return 0, 0, p.errorf(p.pos, "string not closed")
	}
	switch c := p.doc[p.pos+1]; c {
	case '"', '\\', '/':
		return rune(c), 2, nil
	case 'b':
		return '\b', 2, nil
	case 'f':
		return '\f', 2, nil
	case 'n':
		return '\n', 2, nil
	case 'r':
		return '\r', 2, nil
	case 't':
		return '\t', 2, nil
	case 'u':
		r, ok := hex4(p.doc, p.pos+2)
		if !ok {
			return 0, 0, p.errorf(p.pos, "invalid \\u escape: it takes four hex digits")
		}
		if r >= 0xD800 && r < 0xDC00 {
			if lo, ok := hex4(p.doc, p.pos+8); ok && p.doc[p.pos+6] == '\\' && p.doc[p.pos+7] == 'u' && lo >= 0xDC00 && lo < 0xE000 {
				return (r-0xD800)<<10 + (lo - 0xDC00) + 0x10000, 12, nil
			}
			return utf8.RuneError, 6, nil
		}
		if r >= 0xDC00 && r < 0xE000 {
			return utf8.RuneError, 6, nil
		}
		return r, 6, nil
	default:
		return 0, 0, p.errorf(p.pos, "invalid escape '\\%c' in a string", c)
	}
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// number reads a number by RFC 8259's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() error {
	start := p.pos
	if p.doc[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.doc) && p.doc[p.pos] >= '0' && p.doc[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	switch {
	case p.pos < len(p.doc) && p.doc[p.pos] == '0':
		p.pos++
	case digits() == 0:
		return p.errorf(p.pos, "unexpected %s in a number, looking for a digit", p.describe(p.pos))
	}
	if p.pos < len(p.doc) && p.doc[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return p.errorf(p.pos, "unexpected %s after the decimal point of a number, looking for a digit", p.describe(p.pos))
		}
	}
	if p.pos < len(p.doc) && (p.doc[p.pos] == 'e' || p.doc[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.doc) && (p.doc[p.pos] == '+' || p.doc[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return p.errorf(p.pos, "unexpected %s in the exponent of a number, looking for a digit", p.describe(p.pos))
		}
	}
	if p.pos < len(p.doc) {
		if c := p.doc[p.pos]; c >= '0' && c <= '9' {
			return p.errorf(start, "a number may not start with 0 followed by digits")
		}
	}
	return nil
}
