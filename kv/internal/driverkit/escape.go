package driverkit

import "strings"

// HexDigits are the digits an escape is written with: upper case only, so
// every byte has exactly one spelling.
const HexDigits = "0123456789ABCDEF"

// Escaper spells a byte it does not keep as Mark and two upper-case hex
// digits (with Mark '!', the byte '.' is "!2E"). The mark itself is never
// kept. Drivers build their key mappings from it: which bytes a backend
// takes as they are is the driver's choice, the spelling of the rest is
// shared.
type Escaper struct {
	// Mark starts an escape.
	Mark byte
	// Keep reports whether a byte stands for itself. It must report false
	// for Mark.
	Keep func(c byte) bool
}

// Escaped returns the escape of c: Mark and two hex digits.
func (e Escaper) Escaped(c byte) [3]byte {
	return [3]byte{e.Mark, HexDigits[c>>4], HexDigits[c&15]}
}

// Put writes c to b, escaped unless Keep(c) and not force.
func (e Escaper) Put(b *strings.Builder, c byte, force bool) {
	if !force && e.Keep(c) {
		b.WriteByte(c)
		return
	}
	x := e.Escaped(c)
	b.Write(x[:])
}

// Write writes s to b with every byte Keep refuses escaped.
func (e Escaper) Write(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		e.Put(b, s[i], false)
	}
}

// Escape returns s with every byte Keep refuses escaped.
func (e Escaper) Escape(s string) string {
	n := e.Len(s)
	if n == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(n)
	e.Write(&b, s)
	return b.String()
}

// Len returns the length of Escape(s).
func (e Escaper) Len(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !e.Keep(s[i]) {
			n += 2
		}
	}
	return n
}

// Unescape reverses Write leniently: it decodes every escape and keeps every
// byte Keep accepts, and reports false for a Mark not followed by two
// upper-case hex digits or for a byte Keep refuses. Whether the spelling was
// canonical (no byte escaped that need not be) is the caller's to check,
// usually by encoding the result again.
func (e Escaper) Unescape(s string) (string, bool) {
	if strings.IndexByte(s, e.Mark) < 0 {
		for i := 0; i < len(s); i++ {
			if !e.Keep(s[i]) {
				return "", false
			}
		}
		return s, true
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != e.Mark {
			if !e.Keep(c) {
				return "", false
			}
			out = append(out, c)
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		hi, ok1 := Unhex(s[i+1])
		lo, ok2 := Unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		out = append(out, hi<<4|lo)
		i += 2
	}
	return string(out), true
}

// Unhex returns the value of an upper-case hex digit.
func Unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// AlphaNum reports whether c is an ASCII letter, a digit, '-' or '_': the
// bytes every backend's key alphabet shares.
func AlphaNum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}
