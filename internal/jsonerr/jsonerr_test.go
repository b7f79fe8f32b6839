package jsonerr_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"agentkit/internal/jsonerr"
)

type expect struct {
	Exact *string `json:"exact"`
}

type doc struct {
	Name   string            `json:"name"`
	N      int               `json:"n"`
	U      uint8             `json:"u"`
	F      float64           `json:"f"`
	On     bool              `json:"on"`
	Tags   []string          `json:"tags"`
	Meta   map[string]string `json:"meta"`
	Expect expect            `json:"expect"`
}

// Each row decodes a document into doc; the description must be the one
// given, and never name a Go type, package or struct.
func TestDescribeSpeaksJSON(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"name":5}`, "name: expected a string, found a JSON number"},
		{`{"n":"x"}`, "n: expected a whole number, found a JSON string"},
		{`{"n":1.5}`, "n: 1.5 is not a whole number from -9223372036854775808 to 9223372036854775807"},
		{`{"n":1e20}`, "n: 1e20 is not a whole number from -9223372036854775808 to 9223372036854775807"},
		{`{"u":300}`, "u: 300 is not a whole number from 0 to 255"},
		{`{"f":1e400}`, "f: 1e400 is out of range"},
		{`{"on":"yes"}`, "on: expected true or false, found a JSON string"},
		{`{"tags":{}}`, "tags: expected an array, found a JSON object"},
		{`{"meta":[]}`, "meta: expected an object, found a JSON array"},
		{`{"expect":"x"}`, "expect: expected an object, found a JSON string"},
		{`{"expect":{"exact":5}}`, "expect.exact: expected a string, found a JSON number"},
		{`[1]`, "the case must be an object, not a JSON array"},
		{`"x"`, "the case must be an object, not a JSON string"},
		{`{"name":`, "the case is cut short: it is not a complete JSON value"},
		{`{"name" 1}`, "the case is not valid JSON (at byte 9): invalid character '1' after object key"},
		{`{"other":1}`, `unknown field "other"`},
	} {
		dec := json.NewDecoder(bytes.NewReader([]byte(c.in)))
		dec.DisallowUnknownFields()
		var d doc
		err := dec.Decode(&d)
		if err == nil {
			t.Fatalf("%s decoded", c.in)
		}
		got := jsonerr.Describe(err, "the case")
		if got != c.want {
			t.Errorf("Describe(%s)\n got %q\nwant %q", c.in, got, c.want)
		}
		for _, goName := range []string{"Go ", "jsonerr_test", "doc.", "expect.Exact", "struct", "[]string", "map["} {
			if strings.Contains(got, goName) {
				t.Errorf("Describe(%s) = %q names Go's %q", c.in, got, goName)
			}
		}
	}
}
