// Package wire holds the names and shapes of the hosted storage protocol
// that both sides share: the service (package hosted) and its Go client (the
// agentkit+http(s) driver, package kv/hostedkv). docs/hosted-protocol.md
// describes the protocol for implementers in other languages; this package
// is its Go spelling and imports nothing beyond the standard library. It
// lives under the driver, so that no package under kv/ imports anything
// above kv; the service, which sits above kv, imports it downwards.
package wire

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Protocol is the protocol version GET …/info reports.
const Protocol = 1

// Headers of the protocol.
const (
	// HeaderVersion carries a key's version token on answers to reads and
	// writes of one key.
	HeaderVersion = "Agentkit-Version"
	// HeaderIfVersion makes a PUT conditional on the key's current version
	// (PutIfVersion).
	HeaderIfVersion = "Agentkit-If-Version"
	// HeaderIfAbsent, set to "1", makes a PUT conditional on the key being
	// absent (PutIfAbsent).
	HeaderIfAbsent = "Agentkit-If-Absent"
	// HeaderRequestID is the request id every write carries. The service
	// de-duplicates writes by it, so a client may resend a write whose
	// answer it did not get. It is the IETF Idempotency-Key header, which
	// Go's HTTP client also uses to resend a request on a broken idle
	// connection.
	HeaderRequestID = "Idempotency-Key"
	// HeaderReplayed is "true" on the answer to a write the service had
	// already applied under the same request id: the answer is the
	// recorded outcome, not a second write.
	HeaderReplayed = "Agentkit-Replayed"
)

// Content types of the protocol.
const (
	// ContentValue is the type of a key's value in GET and PUT bodies.
	ContentValue = "application/octet-stream"
	// ContentJSON is the type of errors, info and table documents.
	ContentJSON = "application/json"
	// ContentNDJSON is the type of streamed listings: one JSON object a
	// line, ending with a Trailer line.
	ContentNDJSON = "application/x-ndjson"
)

// Error codes in ErrorBody.Code.
const (
	CodeUnauthorized    = "unauthorized" // 401: no token, or not one the service knows
	CodeForbidden       = "forbidden"    // 403: the token belongs to another namespace
	CodeNotFound        = "not_found"    // 404: the key (or snapshot) does not exist
	CodeNoRoute         = "no_route"     // 404: no such path
	CodeMethod          = "method_not_allowed"
	CodeInvalidKey      = "invalid_key"      // 400: the key or prefix breaks the key rules
	CodeKeyTooLong      = "key_too_long"     // 400: past the key limit
	CodeBadRequest      = "bad_request"      // 400: anything else malformed
	CodePageTooLarge    = "page_too_large"   // 400: list limit past the page limit
	CodeExists          = "exists"           // 412: PutIfAbsent found the key
	CodeVersionMismatch = "version_mismatch" // 412: PutIfVersion found another version or no key
	CodeRequestIDReused = "request_id_reused"
	CodeTooLarge        = "value_too_large" // 413: the body is past the value limit
	CodeRateLimited     = "rate_limited"    // 429: too many requests in flight for the namespace
	CodeUnavailable     = "backend_unavailable"
	CodeShuttingDown    = "shutting_down"
	CodeInternal        = "internal"
)

// ErrorBody is the JSON body of every answer with a status of 400 or more:
// {"error": {"code": …, "message": …, "limit": …}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	// Code is one of the Code constants.
	Code string `json:"code"`
	// Message says what went wrong and what to change. It never contains
	// a value or a token.
	Message string `json:"message"`
	// Limit is the limit that was passed, for the codes that name one.
	Limit int64 `json:"limit,omitempty"`
}

// Info is the answer of GET /v1/ns/{ns}/info: who the token is and the
// service's limits.
type Info struct {
	Protocol  int    `json:"protocol"`
	Namespace string `json:"namespace"`
	// Backend is "postgres", "sqlite", or the kv driver's name ("redis", …) on
	// a service over another kv store.
	Backend string `json:"backend"`
	Limits  Limits `json:"limits"`
}

// Limits are the service's bounds, as Info reports them.
type Limits struct {
	MaxKeyBytes   int   `json:"maxKeyBytes"`
	MaxValueBytes int64 `json:"maxValueBytes"`
	MaxPage       int   `json:"maxPage"`
	// DedupWindowSeconds is how long the service remembers a write's
	// request id. A client resends a write for at most a fifth of it
	// after first sending it.
	DedupWindowSeconds int64 `json:"dedupWindowSeconds"`
}

// Entry is one line of a key listing. Value is present (base64 in JSON)
// only when the listing asked for values.
type Entry struct {
	Key   string `json:"key"`
	Value []byte `json:"value,omitempty"`
}

// Trailer is the last line of every streamed listing. Next is the cursor to
// pass as after= for the next page; End is true when there is none. A
// stream without a trailer was cut short and must not be taken as
// complete.
type Trailer struct {
	Next *string `json:"next,omitempty"`
	End  bool    `json:"end,omitempty"`
}

// EvalRun is one line of an eval-run listing: the run id and its snapshot,
// a JSON document.
type EvalRun struct {
	RunID    string          `json:"runId"`
	Snapshot json.RawMessage `json:"snapshot"`
}

// ABSample is the body of POST …/ab-samples: one cumulative metric sample
// of one session in one experiment.
type ABSample struct {
	Agent      string          `json:"agent"`
	Experiment string          `json:"experiment"`
	Variant    string          `json:"variant"`
	SessionID  string          `json:"sessionId"`
	At         time.Time       `json:"at"`
	Metrics    json.RawMessage `json:"metrics"`
}

// MemoryLine is one line of a memory listing: the record's sequence number
// in its agent's journal and the record, a JSON object.
type MemoryLine struct {
	Seq    int64           `json:"seq"`
	Record json.RawMessage `json:"record"`
}

// MemoryAppended is the answer to a memory append.
type MemoryAppended struct {
	Seq int64 `json:"seq"`
}

// nsRe is the namespace rule: a DNS label, 1 to 63 lower-case letters,
// digits and hyphens, starting and ending with a letter or digit.
var nsRe = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidNamespace reports whether ns is a usable namespace name.
func ValidNamespace(ns string) bool { return nsRe.MatchString(ns) }

// NamespaceRule says what a namespace may be, for error messages.
const NamespaceRule = "1 to 63 lower-case letters, digits and hyphens, starting and ending with a letter or digit"

// requestIDRe is what a request id may be.
var requestIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{8,64}$`)

// ValidRequestID reports whether id is a usable request id: 8 to 64
// characters of A-Z, a-z, 0-9, '_' and '-'.
func ValidRequestID(id string) bool { return requestIDRe.MatchString(id) }

// FormatVersion spells a version token: the backend's epoch, a dot and the
// version number, such as "k2m9q4xa.1207".
func FormatVersion(epoch string, n int64) string {
	return epoch + "." + strconv.FormatInt(n, 10)
}

// ParseVersion splits a version token into epoch and number. ok is false
// for anything FormatVersion cannot have made.
func ParseVersion(token string) (epoch string, n int64, ok bool) {
	epoch, num, found := strings.Cut(token, ".")
	if !found || epoch == "" || len(epoch) > 32 || num == "" || len(num) > 19 {
		return "", 0, false
	}
	for _, c := range epoch {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return "", 0, false
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != num {
		return "", 0, false
	}
	return epoch, n, true
}

// Error formats the detail as "code: message".
func (d ErrorDetail) String() string { return fmt.Sprintf("%s: %s", d.Code, d.Message) }
