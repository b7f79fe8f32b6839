// Package jsonerr words the errors of encoding/json for the people who
// wrote the JSON: in JSON's terms (an object, a string, a number) and with
// the path of the field, never with the Go type the document was decoded
// into (encoding/json says "cannot unmarshal string into Go struct field
// Case.expect of type evals.Expect").
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
)

// Describe returns err, an error of json.Unmarshal or (*json.Decoder).Decode,
// as a sentence about the document. whole names the document as a whole,
// such as "the request body" or "the case", for errors that are not about
// one field.
//
//   - a value of the wrong type: "expect.exact: expected a string, found a
//     JSON number", or "the case must be a JSON object, not a JSON array";
//   - a number out of range or not whole where a whole number belongs:
//     "concurrency: 1e20 is not a whole number from … to …";
//   - a syntax error: "the case is not valid JSON (at byte 12): invalid
//     character …";
//   - a document cut short: "the case is cut short: it is not a complete
//     JSON value";
//   - an unknown field (DisallowUnknownFields): `unknown field "x"`.
//
// Any other error is returned as its text without the "json: " prefix.
func Describe(err error, whole string) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		return typeError(te, whole)
	case errors.As(err, &se):
		return fmt.Sprintf("%s is not valid JSON (at byte %d): %s", whole, se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return whole + " is cut short: it is not a complete JSON value"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func typeError(te *json.UnmarshalTypeError, whole string) string {
	found, number := te.Value, ""
	if n, ok := strings.CutPrefix(te.Value, "number "); ok {
		found, number = "number", n
	}
	if te.Field == "" {
		return fmt.Sprintf("%s must be %s, not a JSON %s", whole, Kind(te.Type), found)
	}
	if number != "" {
		// A number of the right type that the Go type cannot hold: out
		// of range, or a fraction where a whole number belongs.
		switch k := te.Type.Kind(); {
		case k >= reflect.Int && k <= reflect.Int64:
			bits := te.Type.Bits()
			return fmt.Sprintf("%s: %s is not a whole number from %d to %d", te.Field, number, int64(-1)<<(bits-1), int64(1)<<(bits-1)-1)
		case k >= reflect.Uint && k <= reflect.Uintptr:
			return fmt.Sprintf("%s: %s is not a whole number from 0 to %d", te.Field, number, uint64(math.MaxUint64)>>(64-te.Type.Bits()))
		default:
			return fmt.Sprintf("%s: %s is out of range", te.Field, number)
		}
	}
	return fmt.Sprintf("%s: expected %s, found a JSON %s", te.Field, Kind(te.Type), found)
}

// Kind names what a Go type takes in JSON: "a string", "a number", "a
// whole number", "true or false", "an object", "an array".
func Kind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch k := t.Kind(); {
	case k == reflect.String:
		return "a string"
	case k == reflect.Bool:
		return "true or false"
	case k == reflect.Map || k == reflect.Struct:
		return "an object"
	case k == reflect.Slice || k == reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a string" // []byte is base64 text
		}
		return "an array"
	case k >= reflect.Int && k <= reflect.Uintptr:
		return "a whole number"
	case k == reflect.Float32 || k == reflect.Float64:
		return "a number"
	}
	return "a value"
}
