package mergepatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRFC7396AppendixA runs every example of RFC 7396's Appendix A, and
// the example of its section 3, comparing bytes: the result keeps the
// target's key order and appends new keys in the patch's order.
func TestRFC7396AppendixA(t *testing.T) {
	cases := []struct{ target, patch, want string }{
		{`{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
		{`{"a":"b"}`, `{"a":null}`, `{}`},
		{`{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
		{`{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
		{`{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
		{`["a","b"]`, `["c","d"]`, `["c","d"]`},
		{`{"a":"b"}`, `["c"]`, `["c"]`},
		{`{"a":"foo"}`, `null`, `null`},
		{`{"a":"foo"}`, `"bar"`, `"bar"`},
		{`{"e":null}`, `{"a":1}`, `{"e":null,"a":1}`},
		{`[1,2]`, `{"a":"b","c":null}`, `{"a":"b"}`},
		{`{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
		// Section 3.
		{
			`{"title":"Goodbye!","author":{"givenName":"John","familyName":"Doe"},"tags":["example","sample"],"content":"This will be unchanged"}`,
			`{"title":"Hello!","phoneNumber":"+01-123-456-7890","author":{"familyName":null},"tags":["example"]}`,
			`{"title":"Hello!","author":{"givenName":"John"},"tags":["example"],"content":"This will be unchanged","phoneNumber":"+01-123-456-7890"}`,
		},
	}
	for _, c := range cases {
		got, err := Apply([]byte(c.target), []byte(c.patch))
		if err != nil {
			t.Errorf("Apply(%s, %s): %v", c.target, c.patch, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("Apply(%s, %s) = %s, want %s", c.target, c.patch, got, c.want)
		}
	}
}

// TestNullsInsideArraysAreKept: an array in the patch replaces the target's
// value as it is, nulls (and objects holding nulls) included.
func TestNullsInsideArraysAreKept(t *testing.T) {
	for _, target := range []string{`{"a":[0]}`, `{}`, `{"a":{"x":1}}`, ``} {
		got, err := Apply([]byte(target), []byte(`{"a":[1,null,{"x":null}]}`))
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"a":[1,null,{"x":null}]}`; string(got) != want {
			t.Errorf("target %q: got %s, want %s", target, got, want)
		}
	}
	got, err := Apply([]byte(`{"a":1}`), []byte(`[null,{"b":null},[null]]`))
	if err != nil || string(got) != `[null,{"b":null},[null]]` {
		t.Errorf("top-level array patch: %s, %v", got, err)
	}
}

// TestObjectPatchOnNonObjectTarget: an object patch on null, a scalar or an
// array treats the target as {} (nulls of the patch then delete nothing and
// vanish).
func TestObjectPatchOnNonObjectTarget(t *testing.T) {
	for _, target := range []string{`null`, `true`, `7`, `"s"`, `[1]`, ``} {
		got, err := Apply([]byte(target), []byte(`{"a":{"b":null,"c":1},"d":null}`))
		if err != nil {
			t.Fatalf("target %q: %v", target, err)
		}
		if want := `{"a":{"c":1}}`; string(got) != want {
			t.Errorf("target %q: got %s, want %s", target, got, want)
		}
	}
	// Nested: the member's value is a scalar, the patch's an object.
	got, err := Apply([]byte(`{"a":5,"b":null}`), []byte(`{"a":{"x":1},"b":{"y":null}}`))
	if err != nil || string(got) != `{"a":{"x":1},"b":{}}` {
		t.Errorf("nested: %s, %v", got, err)
	}
}

// TestNumbersKeepTheirDigits: numbers never pass through float64.
func TestNumbersKeepTheirDigits(t *testing.T) {
	nums := []string{
		`12345678901234567890`,
		`0.1000000000000000055511151231257827`,
		`-0`, `1.0`, `1E400`, `-123.4500e-0007`, `9007199254740993`,
		`340282366920938463463374607431768211457`,
	}
	for _, n := range nums {
		got, err := Apply([]byte(`{"keep":`+n+`}`), []byte(`{"set":`+n+`,"arr":[`+n+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		want := `{"keep":` + n + `,"set":` + n + `,"arr":[` + n + `]}`
		if string(got) != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

// TestStringsKeepTheirBytes: escapes are kept as written, while keys are
// compared by their unescaped value.
func TestStringsKeepTheirBytes(t *testing.T) {
	got, err := Apply([]byte(`{"\u0061":"x\/y","é":"\ud83d\ude00"}`), []byte(`{"a":"\u00e9","b":"tab\there"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"\u0061":"\u00e9","é":"\ud83d\ude00","b":"tab\there"}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
	got, err = Apply([]byte(`{"a":1,"b":2}`), []byte(`{"\u0061":null}`))
	if err != nil || string(got) != `{"b":2}` {
		t.Errorf("escaped null key: %s, %v", got, err)
	}
}

// TestWhitespaceIsDropped: the result is compact, strings untouched.
func TestWhitespaceIsDropped(t *testing.T) {
	got, err := Apply([]byte(" {\n \"a\" : [ 1 , { \"b\" : \" x \" } ] \r\n}\t"), []byte("\n{ \"c\" :\t{ } }\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":[1,{"b":" x "}],"c":{}}`; string(got) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestInputsAreNotModified: Apply builds a new slice.
func TestInputsAreNotModified(t *testing.T) {
	target := []byte(`{"a":{"b":1},"c":[1]}`)
	patch := []byte(`{"a":{"b":null,"d":2},"c":null}`)
	t0, p0 := bytes.Clone(target), bytes.Clone(patch)
	if _, err := Apply(target, patch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(target, t0) || !bytes.Equal(patch, p0) {
		t.Errorf("inputs changed: %s %s", target, patch)
	}
}

// TestInvalidJSONNamesThePosition: every refusal is a *SyntaxError naming
// the document and where the problem is.
func TestInvalidJSONNamesThePosition(t *testing.T) {
	cases := []struct {
		target, patch string
		doc           string
		line, col     int
		msg           string
	}{
		{`{}`, `{"a":1,}`, "patch", 1, 8, "looking for an object key"},
		{`{}`, "{\n  \"a\": tru\n}", "patch", 2, 8, "looking for a value"},
		{`{}`, ``, "patch", 1, 1, "end of input"},
		{`{}`, `{"a":1} x`, "patch", 1, 9, "after the end of the value"},
		{`{}`, `{"a":01}`, "patch", 1, 6, "start with 0"},
		{`{}`, `{"a":1.}`, "patch", 1, 8, "decimal point"},
		{`{}`, `{"a":"x`, "patch", 1, 6, "string not closed"},
		{`{}`, "{\"a\":\"\x01\"}", "patch", 1, 7, "control character"},
		{`{}`, "{\"a\":\"\xff\"}", "patch", 1, 7, "invalid UTF-8"},
		{`{}`, `{"a":"\q"}`, "patch", 1, 7, "invalid escape"},
		{`{}`, `{"a":"\u12"}`, "patch", 1, 7, "four hex digits"},
		{`{}`, `{"a":1,"a":2}`, "patch", 1, 8, `duplicate key "a"`},
		{`{}`, `[{"a":1,"\u0061":2}]`, "patch", 1, 9, `duplicate key "\u0061"`},
		{`{}`, strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), "patch", 1, MaxDepth + 1, "nesting deeper"},
		{"{\n\"a\" 1}", `{}`, "target", 2, 5, "looking for ':'"},
	}
	for _, c := range cases {
		_, err := Apply([]byte(c.target), []byte(c.patch))
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Apply(%q, %q) = %v, want a *SyntaxError", c.target, c.patch, err)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%v does not match ErrInvalid", err)
		}
		if se.Doc != c.doc || se.Line != c.line || se.Column != c.col || !strings.Contains(se.Msg, c.msg) {
			t.Errorf("Apply(%q, %q): %s (doc %s line %d col %d); want doc %s line %d col %d and %q", c.target, c.patch, err, se.Doc, se.Line, se.Column, c.doc, c.line, c.col, c.msg)
		}
		if !strings.Contains(err.Error(), "line ") || !strings.Contains(err.Error(), c.doc) {
			t.Errorf("error %q does not name the document and position", err)
		}
	}
}

func TestDeepButAllowedNesting(t *testing.T) {
	deep := strings.Repeat(`{"a":`, MaxDepth-1) + "1" + strings.Repeat("}", MaxDepth-1)
	got, err := Apply([]byte(`{}`), []byte(deep))
	if err != nil || string(got) != deep {
		t.Fatalf("nesting of %d levels: %v", MaxDepth-1, err)
	}
}

// model is RFC 7396's pseudo-code over encoding/json values, the reference
// the fuzz test compares against.
func model(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
		} else {
			t[k] = model(t[k], v)
		}
	}
	return t
}

func decodeNumbers(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// hasDuplicateKeys reports whether some object of the valid JSON doc holds
// a key twice (after unescaping), which encoding/json accepts and Apply
// refuses.
func hasDuplicateKeys(doc []byte) bool {
	d := json.NewDecoder(bytes.NewReader(doc))
	type frame struct {
		obj    bool
		keys   map[string]bool
		expect bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		top := func() *frame {
			if len(stack) == 0 {
				return nil
			}
			return stack[len(stack)-1]
		}
		f := top()
		isKey := f != nil && f.obj && f.expect
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if f != nil && f.obj {
					f.expect = true
				}
				stack = append(stack, &frame{obj: v == '{', keys: map[string]bool{}, expect: v == '{'})
				continue
			default:
				stack = stack[:len(stack)-1]
				if g := top(); g != nil && g.obj {
					g.expect = true
				}
				continue
			}
		case string:
			if isKey {
				if f.keys[v] {
					return true
				}
				f.keys[v] = true
				f.expect = false
				continue
			}
		}
		if f != nil && f.obj {
			f.expect = true
		}
	}
}

// FuzzApplyMatchesModel compares Apply with the RFC's pseudo-code on
// encoding/json values: the same result for valid input, a refusal for
// invalid input, and refusals of valid input only for what Apply refuses on
// purpose (duplicate keys, invalid UTF-8, nesting past MaxDepth).
func FuzzApplyMatchesModel(f *testing.F) {
	seeds := [][2]string{
		{`{"a":"b"}`, `{"a":"c"}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`},
		{`{}`, `{"a":{"bb":{"ccc":null}}}`},
		{`[1,2]`, `{"a":"b","c":null}`},
		{`{"a":[1,null,{"x":null}]}`, `{"a":[1,null,{"x":null}],"b":null}`},
		{`null`, `{"a":12345678901234567890}`},
		{`{"a":0.1000000000000000055511151231257827}`, `{"b":"\u00e9"}`},
		{`{"a":1,"a":2}`, `{}`},
		{`{"a":1}`, `{"a":`},
		{``, `{"x":{"y":{"z":null}}}`},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, target, patch []byte) {
		got, err := Apply(target, patch)
		validT := len(target) == 0 || json.Valid(target)
		validP := json.Valid(patch)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SyntaxError", err)
			}
			doc := patch
			if se.Doc == "target" {
				doc = target
			}
			if se.Offset < 0 || se.Offset > len(doc) {
				t.Fatalf("error offset %d outside the %d-byte %s", se.Offset, len(doc), se.Doc)
			}
			if (se.Doc == "patch" && !validP) || (se.Doc == "target" && !validT) {
				return
			}
			switch {
			case strings.Contains(se.Msg, "duplicate key") && hasDuplicateKeys(doc):
			case strings.Contains(se.Msg, "invalid UTF-8") && !utf8.Valid(doc):
			case strings.Contains(se.Msg, "nesting deeper"):
			default:
				t.Fatalf("Apply(%q, %q) refused valid JSON: %v", target, patch, err)
			}
			return
		}
		if !validT || !validP {
			t.Fatalf("Apply(%q, %q) accepted invalid JSON, returning %s", target, patch, got)
		}
		if !json.Valid(got) {
			t.Fatalf("Apply(%q, %q) = %q, not valid JSON", target, patch, got)
		}
		var tv any
		if len(target) > 0 {
			var err error
			if tv, err = decodeNumbers(target); err != nil {
				t.Fatal(err)
			}
		}
		pv, err := decodeNumbers(patch)
		if err != nil {
			t.Fatal(err)
		}
		want := model(tv, pv)
		gv, err := decodeNumbers(got)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(gv, want) {
			wb, _ := json.Marshal(want)
			t.Fatalf("Apply(%s, %s) = %s, the model gives %s", target, patch, got, wb)
		}
	})
}
