package driverkit

import "unicode/utf8"

// PrefixEnd returns the least valid UTF-8 string greater, in bytewise
// order, than every valid UTF-8 string that starts with prefix: the
// exclusive upper bound of a range scan (key >= prefix AND key < end),
// which lists a prefix without LIKE or pattern matching. It increments the
// last code point that can be incremented (UTF-8 sorts bytewise in code
// point order), skipping the surrogates, and reports false when there is no
// bound (the empty prefix, or one made only of U+10FFFF): then scan to the
// end. The bound is valid UTF-8, so a text column or parameter that refuses
// invalid UTF-8 (PostgreSQL's) takes it.
func PrefixEnd(prefix string) (string, bool) {
	for prefix != "" {
		r, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
		if r == utf8.RuneError && size == 1 {
			continue // not a valid key; drop the byte
		}
		r++
		if r == 0xD800 {
			r = 0xE000 // the surrogates have no UTF-8 spelling
		}
		if r <= utf8.MaxRune {
			return prefix + string(r), true
		}
	}
	return "", false
}
