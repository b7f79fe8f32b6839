package server

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// strictCheck finds what encoding/json accepts without a word and a request
// body must not hold: a field given twice (encoding/json keeps the last),
// a field name in another case than the route's (it matches names
// case-insensitively), a key given twice in a nested object, and a lone
// UTF-16 surrogate escape (it turns one into U+FFFD). data is a JSON text
// that decoded into v, a pointer to the route's body struct, whose JSON
// field names are the only ones allowed at the top level. Bytes that are
// not UTF-8 are checked before decoding (checkUTF8).
func strictCheck(data []byte, v any, allowed string) error {
	if err := checkSurrogates(data); err != nil {
		return err
	}
	names := jsonNames(v)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkJSON(dec, "", names, allowed)
}

// checkUTF8 refuses a body that is not UTF-8: encoding/json would replace
// each bad byte with U+FFFD and store text the client never sent.
func checkUTF8(data []byte) error {
	if utf8.Valid(data) {
		return nil
	}
	at := 0
	for at < len(data) {
		r, size := utf8.DecodeRune(data[at:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		at += size
	}
	return badBody("the request body is not valid UTF-8 (byte %d); send text encoded as UTF-8", at)
}

// jsonNames returns the JSON names of the fields of the struct v points
// to.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// walkJSON reads one value from dec, checking object keys: no key twice in
// an object and, at the top (path ""), only the exact names. Decoding
// errors end the walk without an error: the body decoded already, so they
// cannot happen.
func walkJSON(dec *json.Decoder, path string, names []string, allowed string) error {
	tok, err := dec.Token()
	if err != nil {
		return nil
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil
			}
			k, _ := kt.(string)
			if seen[k] {
				if path == "" {
					return badBody("%s: given twice; send each field once", k)
				}
				return badBody("%s: the key %q is given twice; send each key once", path, k)
			}
			seen[k] = true
			child := k
			if path != "" {
				child = path + "." + k
			} else if !slices.Contains(names, k) {
				for _, n := range names {
					if strings.EqualFold(n, k) {
						return badBody("%s: unknown field; field names are case-sensitive: did you mean %q? The allowed fields are %s", k, n, allowed)
					}
				}
			}
			if err := walkJSON(dec, child, names, allowed); err != nil {
				return err
			}
		}
		dec.Token() // the closing brace
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := walkJSON(dec, path+"["+strconv.Itoa(i)+"]", names, allowed); err != nil {
				return err
			}
		}
		dec.Token()
	}
	return nil
}

// checkSurrogates refuses \uD800-\uDFFF escapes that are not a high
// surrogate followed by a low one: they stand for no character, and
// encoding/json would decode them as U+FFFD. data is valid JSON.
func checkSurrogates(data []byte) error {
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(data) && data[i+1] == 'u' {
				r, ok := hex4(data, i+2)
				if ok && utf16.IsSurrogate(r) {
					lo, okLo := rune(0), false
					if i+11 < len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
						lo, okLo = hex4(data, i+8)
					}
					if r >= 0xDC00 || !okLo || lo < 0xDC00 || lo > 0xDFFF {
						return badBody("the request body holds a lone UTF-16 surrogate (\\u%04x at byte %d), which is no character; send valid Unicode text", r, i)
					}
					i += 11 // the pair
					continue
				}
			}
			i++ // the escaped character
		}
	}
	return nil
}

// hex4 reads four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(data[i:i+4]), 16, 16)
	return rune(n), err == nil
}
