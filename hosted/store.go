package hosted

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// store is a backend of the service: PostgreSQL (pgStore), SQLite
// (sqliteStore) or any kv store with the CAS group (kvStore). Every method is safe for concurrent use. ns is always a
// valid namespace and every key a valid kv key; the handlers check both
// before calling.
type store interface {
	// kind is "postgres", "sqlite" or the kv driver's name.
	kind() string
	// epoch is the random name of this backend's schema, the first half of
	// every version token.
	epoch() string
	ping(ctx context.Context) error
	close()

	// get returns a key's value and version, or errNotFound.
	get(ctx context.Context, ns, key string) ([]byte, int64, error)
	// write applies one write and records its request id in the same
	// transaction; a request id seen before returns the recorded outcome
	// with replayed set, and applies nothing.
	write(ctx context.Context, w writeReq) (writeResult, error)
	// list reads one page of keys in ns with the prefix, after the key
	// after (exclusive; "" means from the start of the prefix), in
	// bytewise order. With values, rows carry their value inline up to
	// inlineValueLimit bytes and the page stops early past pageValueBytes;
	// larger values have value nil and size set, for the caller to get.
	list(ctx context.Context, ns, prefix, after string, limit int, values bool) (rows []row, more bool, err error)
	// forgetRequests deletes the request ids recorded before the cutoff.
	forgetRequests(ctx context.Context, before time.Time) (int64, error)

	putEval(ctx context.Context, ns, agent, runID string, snapshot []byte) error
	deleteEval(ctx context.Context, ns, agent, runID string) error
	listEvals(ctx context.Context, ns, agent, after string, limit int) (runs []evalRow, more bool, err error)
	putSample(ctx context.Context, ns string, s sample) error
	putSnapshot(ctx context.Context, ns, agent string, doc []byte) error
	// getSnapshot returns errNotFound when the agent has none.
	getSnapshot(ctx context.Context, ns, agent string) ([]byte, error)
	// appendMemory appends one record to the agent's journal and returns
	// its sequence number; a request id seen before returns the number it
	// was given then, and appends nothing.
	appendMemory(ctx context.Context, ns, agent, reqID string, record []byte) (seq int64, replayed bool, err error)
	listMemory(ctx context.Context, ns, agent string, after int64, limit int) (recs []memoryRow, more bool, err error)
}

// ErrBackendUnsupported is wrapped in Open's error when the backend URL
// names no linked driver, another storaged, or a store without the CAS
// group: a configuration to change, not a failure to retry.
var ErrBackendUnsupported = errors.New("the backend cannot serve the service")

// errNotFound is a store's answer for a missing key or snapshot.
var errNotFound = errors.New("not found")

// writeOp is what a write does.
type writeOp int16

const (
	opPut writeOp = iota
	opPutIfAbsent
	opPutIfVersion
	opDelete
)

// writeStatus is a write's outcome, as the request table records it.
type writeStatus int16

const (
	statusOK       writeStatus = iota
	statusExists               // PutIfAbsent found the key
	statusMismatch             // PutIfVersion found another version, or no key
	statusReused               // the request id was recorded for another key or operation
)

// writeReq is one write.
type writeReq struct {
	ns, key  string
	value    []byte
	op       writeOp
	expected int64 // for opPutIfVersion
	reqID    string
}

// writeResult is a write's outcome.
type writeResult struct {
	status   writeStatus
	version  int64 // the new version, for a successful put
	replayed bool  // the outcome was recorded by an earlier request
}

// row is one entry of a listing page.
type row struct {
	key   string
	value []byte // nil when not inline
	size  int64  // the value's length
}

// evalRow is one stored eval run.
type evalRow struct {
	runID    string
	snapshot []byte
}

// sample is one A/B sample.
type sample struct {
	agent, experiment, variant, sessionID string
	at                                    time.Time
	metrics                               []byte
}

// memoryRow is one memory record.
type memoryRow struct {
	seq    int64
	record []byte
}

const (
	// inlineValueLimit is the largest value a listing page reads inline.
	inlineValueLimit = 64 << 10
	// pageValueBytes ends a listing page early once its inline values
	// pass it, so a page of large values never sits in memory at once.
	pageValueBytes = 4 << 20
)

// DefaultTablePrefix names the service's tables when the backend URL has no
// table parameter: agentkit_hosted_kv, agentkit_hosted_requests, ….
const DefaultTablePrefix = "agentkit_hosted"

// openStore opens the backend a URL names: postgres:// or postgresql://
// (a libpq URL; table=PREFIX names the tables), sqlite:PATH, or the URL of
// any other kv driver the program links, with the whole CAS group (the
// generic backend, kvstore.go). kv+URL opens a postgres or sqlite URL
// through the generic backend too, for tests. window is the
// de-duplication window, which the generic backend needs to keep ids.
func openStore(ctx context.Context, rawURL string, window time.Duration) (store, error) {
	if rawURL == "" {
		return nil, errors.New("hosted: no backend given; use a postgres://… URL (production), sqlite:PATH, or the URL of another kv store with the CAS group (redis://…, nats://…, file:PATH, s3://…)")
	}
	if rest, ok := strings.CutPrefix(rawURL, "kv+"); ok {
		return openKVStore(ctx, rest, window)
	}
	scheme, _, _ := strings.Cut(rawURL, ":")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return openPostgres(ctx, rawURL)
	case "sqlite":
		return openSQLite(ctx, rawURL)
	case "agentkit+http", "agentkit+https":
		return nil, fmt.Errorf("hosted: %w: it cannot be another storaged (agentkit+http(s)://); give the database that one uses", ErrBackendUnsupported)
	}
	return openKVStore(ctx, rawURL, window)
}

// checkPrefix checks a table prefix.
func checkPrefix(p string) error {
	if p == "" || len(p) > 40 {
		return fmt.Errorf("hosted: the table prefix %q must be 1 to 40 characters", p)
	}
	for i, c := range p {
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("hosted: the table prefix %q may hold only lower-case letters, digits and underscores, starting with a letter or underscore", p)
		}
	}
	return nil
}

// tablePrefix takes the table parameter out of a backend URL's query.
func tablePrefix(q url.Values) (string, error) {
	p := DefaultTablePrefix
	if q.Has("table") {
		p = q.Get("table")
		q.Del("table")
	}
	return p, checkPrefix(p)
}

// newEpoch returns a fresh random schema name: 8 characters of a-z and 2-7.
func newEpoch() string {
	b := make([]byte, 5)
	rand.Read(b)
	return strings.ToLower(base32.StdEncoding.EncodeToString(b))
}

// successor returns the least string greater than every string starting
// with prefix, and false when there is none (the empty prefix, or one of
// U+10FFFF only). Keys are valid UTF-8, which sorts bytewise in code point
// order.
func successor(prefix string) (string, bool) {
	r := []rune(prefix)
	for len(r) > 0 {
		last := r[len(r)-1]
		r = r[:len(r)-1]
		last++
		if last == 0xD800 {
			last = 0xE000
		}
		if last <= 0x10FFFF {
			return string(append(r, last)), true
		}
	}
	return "", false
}

// page cuts rows read with a limit of limit+1 (one more than a page, to
// know whether another page follows without a query that finds nothing)
// to the page, and reports whether more follow.
func page[T any](rows []T, limit int) ([]T, bool) {
	if len(rows) > limit {
		return rows[:limit], true
	}
	return rows, false
}
