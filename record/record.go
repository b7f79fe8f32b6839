// Package record is the one codec of agentkit's versioned records: every
// record the runtime, the storage layer, the ledger and the actor host
// write carries a format version, and every reader applies the same rule
// to it and answers with the same errors.
//
// The rule: a stored record is a JSON object whose "v" field is its format
// version, an integer from 1 (a record kind whose version lives in another
// field, such as the actor migration marker's "format", is checked by the
// same rule with Check). A writer writes the lowest version that describes
// the record exactly, so an older build keeps reading every record it can
// read correctly. A reader accepts every version from 1 up to its kind's
// Version and refuses a higher one with an error matching ErrNewerFormat
// that says to upgrade, never misreading it; a record without a version,
// or one that does not decode, is ErrBadRecord. A version is raised only
// when an older reader would misread the record (a field it ignores
// changes the meaning); fields an older reader may safely ignore are added
// without raising it.
//
// Who builds keys is not this package's business: it sees bytes and a
// "where" (a key or a file name) to name in its errors, shown through
// keys.Redact so that a token in a key never reaches a log.
package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"agentkit/keys"
)

// Errors of reading a record, matched with errors.Is. Every error of
// Unmarshal and Check is an *Error matching ErrUnreadable and one of
// ErrNewerFormat or ErrBadRecord.
var (
	// ErrUnreadable means a record this build cannot read, for either
	// reason below.
	ErrUnreadable = errors.New("record: unreadable record")
	// ErrNewerFormat means the record has a format version newer than this
	// build reads: upgrade the host.
	ErrNewerFormat = errors.New("record: written by a newer agentkit")
	// ErrBadRecord means the data is not a record of its kind: not a JSON
	// object, no format version, or fields that do not decode.
	ErrBadRecord = errors.New("record: not a record agentkit wrote")
)

// Error is a record this build cannot read.
type Error struct {
	// Kind and Where name the record and where it was read (a key,
	// redacted, or a file).
	Kind, Where string
	// Newer is set when the record's format is newer than this build's.
	Newer bool
	// Msg says what is wrong and what to do.
	Msg string
}

// Error says which record, where, and what is wrong.
func (e *Error) Error() string { return e.Msg }

// Is makes errors.Is match ErrUnreadable, and ErrNewerFormat or
// ErrBadRecord as the case is.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnreadable:
		return true
	case ErrNewerFormat:
		return e.Newer
	case ErrBadRecord:
		return !e.Newer
	}
	return false
}

// Kind is a kind of record with the newest format version this build
// reads and writes of it.
type Kind struct {
	name    string
	version int
}

// NewKind returns the kind named name (as errors name it: "session
// head", "control record") whose newest format version is version.
func NewKind(name string, version int) Kind { return Kind{name: name, version: version} }

// String returns the kind's name.
func (k Kind) String() string { return k.name }

// Version returns the newest format version of the kind this build reads
// and writes.
func (k Kind) Version() int { return k.version }

// Versioned is implemented by a record that needs a format version above
// 1 (a batch stored in parts, say).
type Versioned interface{ RecordVersion() int }

// Marshal encodes rec as a record of kind k: rec's JSON object with the
// format version "v" in front. rec must encode as a JSON object. The
// version is 1 unless rec is Versioned; a record type that carries its
// version itself, in a field tagged `json:"v"` that comes first (records
// nested in other records do: the ledger's turn records), is encoded as
// it is, once its version is checked against k.
func Marshal(k Kind, rec any) ([]byte, error) {
	v := 1
	if r, ok := rec.(Versioned); ok {
		v = r.RecordVersion()
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("record: encoding the %s: %w", k, err)
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("record: encoding the %s: it is not a JSON object", k)
	}
	if own, ok := leadingVersion(body); ok {
		if own < 1 || own > k.version {
			return nil, fmt.Errorf("record: encoding the %s: it carries format version %d; set it from 1 to %d", k, own, k.version)
		}
		return body, nil
	}
	var b bytes.Buffer
	b.Grow(len(body) + 8)
	fmt.Fprintf(&b, `{"v":%d`, v)
	if len(body) > 2 {
		b.WriteByte(',')
	}
	b.Write(body[1:])
	return b.Bytes(), nil
}

// Unmarshal checks the format version of a record of kind k, read from
// where (its key, or a file), and decodes it into rec. It returns the
// record's version. Errors are *Error values naming where and the kind.
func Unmarshal(k Kind, where string, data []byte, rec any) (int, error) {
	v, ok := leadingVersion(data)
	if !ok {
		var head struct {
			V *int `json:"v"`
		}
		if err := json.Unmarshal(data, &head); err != nil {
			return 0, bad(k, where, "is not a JSON object (%v); it was not written by agentkit, or it is damaged", err)
		}
		if head.V == nil {
			return 0, bad(k, where, `has no format version ("v"); it was not written by agentkit`)
		}
		v = *head.V
	}
	if err := Check(k, where, v); err != nil {
		return 0, err
	}
	if err := json.Unmarshal(data, rec); err != nil {
		return 0, bad(k, where, "does not decode: %v", err)
	}
	return v, nil
}

// Check applies the version rule to a record of kind k whose version v
// was read already (from a field other than "v").
func Check(k Kind, where string, v int) error {
	switch {
	case v > k.version:
		return &Error{Kind: k.name, Where: keys.Redact(where), Newer: true,
			Msg: fmt.Sprintf("the %s at %q has format version %d, and this build reads versions up to %d; upgrade agentkit on this host", k, keys.Redact(where), v, k.version)}
	case v < 1:
		return bad(k, where, "has format version %d; versions start at 1", v)
	}
	return nil
}

// bad is an ErrBadRecord about the record of kind k at where.
func bad(k Kind, where, format string, args ...any) *Error {
	w := keys.Redact(where)
	return &Error{Kind: k.name, Where: w, Msg: fmt.Sprintf("the %s at %q ", k, w) + fmt.Sprintf(format, args...)}
}

// leadingVersion reads the format version of a record as Marshal writes
// it, `{"v":N,` or `{"v":N}` at the start, without decoding the rest; ok
// is false for anything else (the caller then decodes it).
func leadingVersion(data []byte) (int, bool) {
	const prefix = `{"v":`
	if len(data) < len(prefix)+2 || string(data[:len(prefix)]) != prefix {
		return 0, false
	}
	v, i := 0, len(prefix)
	for ; i < len(data) && data[i] >= '0' && data[i] <= '9'; i++ {
		if i-len(prefix) >= 9 {
			return 0, false
		}
		v = v*10 + int(data[i]-'0')
	}
	if i == len(prefix) || i >= len(data) || (data[i] != ',' && data[i] != '}') {
		return 0, false
	}
	return v, true
}
