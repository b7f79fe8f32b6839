package hosted

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"agentkit/kv"
)

// kvStore is the generic backend: any kv store with the whole CAS group
// (Redis, NATS, files, S3, memory), used through *kv.DB. It keeps the
// service's promises with single-key compare-and-set only; nothing spans
// two backend keys atomically.
//
// Every key of the service lives under the root "hosted/" of the backend:
//
//	hosted/meta                          format and epoch
//	hosted/kv/{ns}/{key}                 a key's envelope (value, counter, recent request ids)
//	hosted/blob/{ns}/{random}            a value over blobThreshold, named by its envelope
//	hosted/rq/{ns}/k/{id}                a request id pushed out of its key's envelope
//	hosted/rq/{ns}/m/{agent}/{id}        the same for a memory append
//	hosted/ev/{ns}/{agent}/{run}         an eval run (an envelope holding the snapshot)
//	hosted/ab/{ns}/{agent}               an A/B snapshot
//	hosted/as/{ns}/{sample}              an A/B sample (sample: a digest of agent, experiment, session, time)
//	hosted/mem/{ns}/{agent}/c            the memory journal's head: the newest record and recent request ids
//	hosted/mem/{ns}/{agent}/r/{seq}      an older record (seq: 16 hex digits)
//
// {agent} is the first 32 hex digits of the SHA-256 of the agent's name.
// {key} and {run} are the names themselves when short enough; a longer one
// is cut after its first treeHead bytes (at the first character boundary
// from there) and followed by "~" and 32 hex digits of its SHA-256, and
// its envelope holds the whole name (see treeKey).
//
// A key's envelope is one backend value (see envelope): the value, a
// per-key counter that is the version number the service hands out, a
// tombstone flag, and the request ids of the key's recent writes. The
// counter only grows: a delete leaves a tombstone keeping it, so a version
// is never reused for a key. Every write reads the envelope, decides, and
// replaces it with PutIfVersion (PutIfAbsent when there is none), trying
// again when another writer got there first: that compare-and-set is the
// write's one atomic step, and the request id goes in with it.
type kvStore struct {
	db     *kv.DB
	name   string
	ep     string
	window time.Duration // the de-duplication window
	// maxValue is the store's own value limit (MaxValueSize of its
	// driver, such as NATS's max_payload less a reserve), 0 when it has
	// none the service needs to know.
	maxValue int64
}

const (
	kvRoot        = "hosted/"
	kvStoreFormat = 1
	// recentIDs is how many request ids an envelope keeps; an older one
	// still inside the window moves to a request record of its own.
	recentIDs = 8
	// treeHead is how many leading bytes of a long key stay readable in
	// its backend key; the rest is a digest. Every tree prefix is short
	// enough that head, marker and digest fit kv.MaxKeyLength.
	treeHead   = 880
	digestHex  = 32
	maxTreePfx = kv.MaxKeyLength - treeHead - 3 - 1 - digestHex
)

// openKVStore opens the generic backend on a kv URL.
func openKVStore(ctx context.Context, rawURL string, window time.Duration) (*kvStore, error) {
	db, err := kv.Open(ctx, rawURL)
	var noDriver *kv.NoDriverError
	if errors.As(err, &noDriver) {
		return nil, fmt.Errorf("hosted: %w: %w", ErrBackendUnsupported, err)
	}
	if err != nil {
		return nil, fmt.Errorf("hosted: open the backend: %w", err)
	}
	caps := db.Capabilities()
	if !caps.CAS || !caps.Get || !caps.Delete || !caps.List {
		db.Close()
		return nil, fmt.Errorf("hosted: %w: the store %s lacks the CAS group (GetWithVersion, PutIfAbsent, PutIfVersion, ListKeys) or Get, Delete and List; "+
			"the service keeps versions and request ids with compare-and-set, so it needs a store with all of them", ErrBackendUnsupported, db.Name())
	}
	s := &kvStore{db: db, name: db.Name(), window: window}
	if m, ok := db.Backend().(interface{ MaxValueSize() int }); ok && m.MaxValueSize() > 0 {
		s.maxValue = int64(m.MaxValueSize())
	}
	if err := s.ensureMeta(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// ensureMeta reads the format and epoch, writing them first when missing.
func (s *kvStore) ensureMeta(ctx context.Context) error {
	meta := fmt.Sprintf(`{"format":%d,"epoch":%q}`, kvStoreFormat, newEpoch())
	_, err := s.db.PutIfAbsent(ctx, kvRoot+"meta", []byte(meta))
	if err != nil && !errors.Is(err, kv.ErrConflict) {
		return fmt.Errorf("hosted: write %smeta: %w", kvRoot, err)
	}
	b, err := s.db.Get(ctx, kvRoot+"meta")
	if err != nil {
		return fmt.Errorf("hosted: read %smeta: %w", kvRoot, err)
	}
	var m struct {
		Format int    `json:"format"`
		Epoch  string `json:"epoch"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Epoch == "" {
		return fmt.Errorf("hosted: %smeta in the backend does not decode (is this another program's data?)", kvRoot)
	}
	if m.Format > kvStoreFormat {
		return fmt.Errorf("hosted: the backend was written by a newer agentkit (format %d; this build reads format %d); upgrade agentkit", m.Format, kvStoreFormat)
	}
	s.ep = m.Epoch
	return nil
}

func (s *kvStore) kind() string  { return s.name }
func (s *kvStore) epoch() string { return s.ep }
func (s *kvStore) close()        { s.db.Close() }

// valueLimit is the largest value the store takes, 0 for no limit of its
// own. A value over blobThreshold is stored alone, so this is the store's
// limit itself.
func (s *kvStore) valueLimit() int64 { return s.maxValue }

func (s *kvStore) ping(ctx context.Context) error {
	_, err := s.db.Get(ctx, kvRoot+"meta")
	return err
}

// ---- keys

// digest is the first 32 hex digits of a name's SHA-256.
func digest(name string) string {
	h := sha256.Sum256([]byte(name))
	return hex.EncodeToString(h[:digestHex/2])
}

func kvPrefix(ns string) string          { return kvRoot + "kv/" + ns + "/" }
func evalPrefix(ns, agent string) string { return kvRoot + "ev/" + ns + "/" + digest(agent) + "/" }
func memPrefix(ns, agent string) string  { return kvRoot + "mem/" + ns + "/" + digest(agent) + "/" }
func kvRequestKey(ns, id string) string  { return kvRoot + "rq/" + ns + "/k/" + id }
func memRequestKey(ns, agent, id string) string {
	return kvRoot + "rq/" + ns + "/m/" + digest(agent) + "/" + id
}

// headLen is how many bytes of name its backend key keeps: all of a name
// of at most treeHead bytes, else up to the first character boundary at
// or after treeHead. A name is kept whole exactly when headLen(name) ==
// len(name); a longer name shares its head only with names that are
// longer still, so every name starting with a head other than the head
// itself has a digested backend key under head+"~".
func headLen(name string) int {
	if len(name) <= treeHead {
		return len(name)
	}
	i := treeHead
	for i < len(name) && !utf8.RuneStart(name[i]) {
		i++
	}
	return i
}

// treeKey is the backend key of name under prefix, and whether it is
// digested. Backend keys sort as their names do, except that the digested
// names sharing one head sort among themselves by digest (treeList puts
// them back in order).
func treeKey(prefix, name string) (string, bool) {
	if len(prefix) > maxTreePfx {
		panic("hosted: tree prefix too long: " + prefix)
	}
	n := headLen(name)
	if n == len(name) {
		return prefix + name, false
	}
	h := sha256.Sum256([]byte(name))
	return prefix + name[:n] + "~" + hex.EncodeToString(h[:digestHex/2]), true
}

// treeName returns the name a backend key stands for, when it is not
// digested.
func treeName(rest string) (string, bool) {
	return rest, headLen(rest) == len(rest)
}

// backendPrefix is the backend prefix whose listing holds every name with
// the prefix p (and perhaps more, when p is longer than a head).
func backendPrefix(prefix, p string) (string, bool) {
	if len(p) <= treeHead {
		return prefix + p, true
	}
	cut := treeHead
	for cut > 0 && !utf8.RuneStart(p[cut]) {
		cut--
	}
	return prefix + p[:cut], false
}

// treeFrom is the backend key after which a listing under prefix holds
// every name that sorts after after ("": from the start). A name of at
// most treeHead bytes is its own backend key, and every name after it has
// a backend key after it. A longer one may be digested, and the names
// after it in its head's group sort by digest, so the listing starts
// before the group: after the bytes of after up to the last character
// boundary at or before treeHead, which every backend key of a name after
// after passes (each keeps at least treeHead bytes of its name, or all of
// it). The names read twice are dropped by treeList.
func treeFrom(prefix, after string) string {
	if after == "" {
		return ""
	}
	if len(after) <= treeHead {
		return prefix + after
	}
	cut := treeHead
	for cut > 0 && !utf8.RuneStart(after[cut]) {
		cut--
	}
	return prefix + after[:cut]
}

// ---- envelopes

// recentWrite is a write remembered in its envelope.
type recentWrite struct {
	id      string
	op      writeOp
	status  writeStatus
	version int64
	at      int64 // unix milliseconds
}

// envelope is what the backend holds for a key (and a memory journal's
// head, and an eval run).
type envelope struct {
	tomb    bool
	counter int64  // the last version number given; the next write gets counter+1
	evictAt int64  // the newest write time among ids moved to request records
	name    string // the key, when its backend key is digested
	recent  []recentWrite
	value   []byte
	// blob is the backend key of a value kept out of line (over
	// blobThreshold bytes), and size its length; value is then empty.
	blob string
	size int64
}

// blobThreshold is the largest value an envelope holds inline. A larger
// one goes to a key of its own (hosted/blob/{ns}/{random}), written before
// the envelope that names it and removed after the envelope that replaces
// it, so the envelope stays small to rewrite and fits stores whose values
// are limited to 1 MiB (NATS).
const blobThreshold = 256 << 10

const (
	envFormat   = 1
	envTomb     = 1
	envHasName  = 2
	envBlob     = 4
	envMaxIDLen = 64
)

func (e *envelope) encode() []byte {
	n := 2 + 3*binary.MaxVarintLen64 + len(e.name) + len(e.value) + len(e.recent)*(envMaxIDLen+2+2*binary.MaxVarintLen64)
	b := make([]byte, 0, n)
	var flags byte
	if e.tomb {
		flags |= envTomb
	}
	if e.name != "" {
		flags |= envHasName
	}
	if e.blob != "" {
		flags |= envBlob
	}
	b = append(b, envFormat, flags)
	b = binary.AppendUvarint(b, uint64(e.counter))
	b = binary.AppendVarint(b, e.evictAt)
	b = binary.AppendUvarint(b, uint64(len(e.recent)))
	for _, r := range e.recent {
		b = binary.AppendUvarint(b, uint64(len(r.id)))
		b = append(b, r.id...)
		b = append(b, byte(r.op), byte(r.status))
		b = binary.AppendUvarint(b, uint64(r.version))
		b = binary.AppendVarint(b, r.at)
	}
	if e.name != "" {
		b = binary.AppendUvarint(b, uint64(len(e.name)))
		b = append(b, e.name...)
	}
	if e.blob != "" {
		b = binary.AppendUvarint(b, uint64(len(e.blob)))
		b = append(b, e.blob...)
		b = binary.AppendUvarint(b, uint64(e.size))
	}
	return append(b, e.value...)
}

var errBadEnvelope = errors.New("hosted: a backend value is not an envelope this build reads (written by another program or a newer agentkit?)")

func decodeEnvelope(b []byte) (*envelope, error) {
	if len(b) < 2 || b[0] != envFormat {
		return nil, errBadEnvelope
	}
	e := &envelope{tomb: b[1]&envTomb != 0}
	hasName, hasBlob := b[1]&envHasName != 0, b[1]&envBlob != 0
	b = b[2:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	sv := func() (int64, bool) {
		v, n := binary.Varint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	bytesOf := func(n uint64) (string, bool) {
		if n > uint64(len(b)) {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	c, ok := uv()
	if !ok {
		return nil, errBadEnvelope
	}
	e.counter = int64(c)
	if e.evictAt, ok = sv(); !ok {
		return nil, errBadEnvelope
	}
	nr, ok := uv()
	if !ok || nr > 1024 {
		return nil, errBadEnvelope
	}
	e.recent = make([]recentWrite, 0, nr+1)
	for range nr {
		var r recentWrite
		l, ok := uv()
		if !ok || l > envMaxIDLen {
			return nil, errBadEnvelope
		}
		if r.id, ok = bytesOf(l); !ok || len(b) < 2 {
			return nil, errBadEnvelope
		}
		r.op, r.status = writeOp(b[0]), writeStatus(b[1])
		b = b[2:]
		v, ok := uv()
		if !ok {
			return nil, errBadEnvelope
		}
		r.version = int64(v)
		if r.at, ok = sv(); !ok {
			return nil, errBadEnvelope
		}
		e.recent = append(e.recent, r)
	}
	if hasName {
		l, ok := uv()
		if !ok {
			return nil, errBadEnvelope
		}
		if e.name, ok = bytesOf(l); !ok {
			return nil, errBadEnvelope
		}
	}
	if hasBlob {
		l, ok := uv()
		if !ok {
			return nil, errBadEnvelope
		}
		if e.blob, ok = bytesOf(l); !ok || e.blob == "" {
			return nil, errBadEnvelope
		}
		size, ok := uv()
		if !ok {
			return nil, errBadEnvelope
		}
		e.size = int64(size)
	}
	e.value = b
	return e, nil
}

// find returns the recent write with the request id.
func (e *envelope) find(id string) (recentWrite, bool) {
	if e == nil {
		return recentWrite{}, false
	}
	for _, r := range e.recent {
		if r.id == id {
			return r, true
		}
	}
	return recentWrite{}, false
}

// requestRecord is a request id moved out of its envelope: the write's
// operation and version and a digest of its key, so a reused id is seen.
type requestRecord struct {
	op      writeOp
	status  writeStatus
	version int64
	at      int64
	target  string // digest of the key or agent
}

func (r requestRecord) encode() []byte {
	b := []byte{envFormat, byte(r.op), byte(r.status)}
	b = binary.AppendUvarint(b, uint64(r.version))
	b = binary.AppendVarint(b, r.at)
	return append(b, r.target...)
}

func decodeRequestRecord(b []byte) (requestRecord, error) {
	if len(b) < 3 || b[0] != envFormat {
		return requestRecord{}, errBadEnvelope
	}
	r := requestRecord{op: writeOp(b[1]), status: writeStatus(b[2])}
	b = b[3:]
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return requestRecord{}, errBadEnvelope
	}
	r.version = int64(v)
	b = b[n:]
	at, n := binary.Varint(b)
	if n <= 0 {
		return requestRecord{}, errBadEnvelope
	}
	r.at, r.target = at, string(b[n:])
	return r, nil
}

// readEnvelope reads an envelope and its backend version; nil when the
// key has none.
func (s *kvStore) readEnvelope(ctx context.Context, bk string) (*envelope, kv.Version, error) {
	b, ver, err := s.db.GetWithVersion(ctx, bk)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	e, err := decodeEnvelope(b)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %s", err, trim(bk))
	}
	return e, ver, nil
}

// lookupRequest returns the record of a request id moved out of env, when
// env has moved ids recently enough for id to be one of them.
func (s *kvStore) lookupRequest(ctx context.Context, env *envelope, rk string, now time.Time) (requestRecord, bool, error) {
	if env == nil || env.evictAt == 0 || env.evictAt < now.Add(-s.window).UnixMilli() {
		return requestRecord{}, false, nil
	}
	b, err := s.db.Get(ctx, rk)
	if errors.Is(err, kv.ErrNotFound) {
		return requestRecord{}, false, nil
	}
	if err != nil {
		return requestRecord{}, false, err
	}
	r, err := decodeRequestRecord(b)
	if err != nil {
		return requestRecord{}, false, fmt.Errorf("%w: %s", err, trim(rk))
	}
	return r, true, nil
}

// remember adds a write to next's recent ids, dropping those older than
// the window and moving the oldest beyond recentIDs to request records
// (written before the envelope that drops them, so an id is always in its
// envelope or in a record while it is inside the window). rk names the
// record of an id.
func (s *kvStore) remember(ctx context.Context, prev, next *envelope, w recentWrite, target string, rk func(id string) string) error {
	cutoff := time.UnixMilli(w.at).Add(-s.window).UnixMilli()
	if prev != nil {
		next.evictAt = prev.evictAt
		for _, r := range prev.recent {
			if r.at >= cutoff {
				next.recent = append(next.recent, r)
			}
		}
	}
	next.recent = append(next.recent, w)
	for len(next.recent) > recentIDs {
		old := next.recent[0]
		rec := requestRecord{op: old.op, status: old.status, version: old.version, at: old.at, target: target}
		if err := s.db.Put(ctx, rk(old.id), rec.encode()); err != nil {
			return err
		}
		next.evictAt = max(next.evictAt, old.at)
		next.recent = next.recent[1:]
	}
	if next.evictAt != 0 && next.evictAt < cutoff {
		next.evictAt = 0
	}
	return nil
}

// swap replaces the envelope read at ver (none when prev is nil).
func (s *kvStore) swap(ctx context.Context, bk string, prev *envelope, ver kv.Version, next *envelope) error {
	var err error
	if prev == nil {
		_, err = s.db.PutIfAbsent(ctx, bk, next.encode())
	} else {
		_, err = s.db.PutIfVersion(ctx, bk, next.encode(), ver)
	}
	return err
}

// ---- kv keys

func (s *kvStore) get(ctx context.Context, ns, key string) ([]byte, int64, error) {
	bk, digested := treeKey(kvPrefix(ns), key)
	for {
		e, _, err := s.readEnvelope(ctx, bk)
		if err != nil {
			return nil, 0, err
		}
		if e == nil || e.tomb || digested && e.name != key {
			return nil, 0, errNotFound
		}
		if e.blob == "" {
			return e.value, e.counter, nil
		}
		v, err := s.db.Get(ctx, e.blob)
		if errors.Is(err, kv.ErrNotFound) {
			continue // a write replaced the value since: read the envelope again
		}
		return v, e.counter, err
	}
}

// newBlob writes a value out of line and returns its key.
func (s *kvStore) newBlob(ctx context.Context, ns string, value []byte) (string, error) {
	b := make([]byte, 16)
	rand.Read(b)
	key := kvRoot + "blob/" + ns + "/" + hex.EncodeToString(b)
	return key, s.db.Put(ctx, key, value)
}

// dropBlob removes a value kept out of line that no envelope names any
// more. A failure leaves it behind, unread: it only costs space.
func (s *kvStore) dropBlob(key string) {
	if key == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.db.Delete(ctx, key)
}

// write applies one write in a loop of read, decide, compare-and-set. The
// compare-and-set of the envelope is the write's only effect, and it
// carries the request id, so a copy of the write that comes later finds
// the id (in the envelope, or in the request record written before the id
// left it) and answers with the recorded outcome.
//
// A PutIfAbsent that finds the key and a delete of a missing key change
// nothing, but are recorded all the same (the envelope is rewritten with
// the id; a missing key gets a tombstone): a late copy must not create the
// key after it was deleted, or delete a key created since, after its
// client was told the outcome. A failed PutIfVersion is not recorded: the
// version it expected was issued for the key before the request was sent,
// and a key's versions never come back, so a later copy fails too.
func (s *kvStore) write(ctx context.Context, w writeReq) (writeResult, error) {
	bk, digested := treeKey(kvPrefix(w.ns), w.key)
	target := digest(w.key)
	rk := func(id string) string { return kvRequestKey(w.ns, id) }
	blob := "" // this write's value, when kept out of line
	used := false
	defer func() {
		if !used {
			s.dropBlob(blob)
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return writeResult{}, err
		}
		prev, ver, err := s.readEnvelope(ctx, bk)
		if err != nil {
			return writeResult{}, err
		}
		if prev != nil && digested && prev.name != w.key {
			return writeResult{}, fmt.Errorf("hosted: two keys share the digest %s; cannot store %s", trim(bk), trim(w.key))
		}
		now := time.Now()
		if r, ok := prev.find(w.reqID); ok {
			return replay(r.op, r.status, r.version, w.op, true), nil
		}
		rec, ok, err := s.lookupRequest(ctx, prev, rk(w.reqID), now)
		if err != nil {
			return writeResult{}, err
		}
		if ok {
			return replay(rec.op, rec.status, rec.version, w.op, rec.target == target), nil
		}
		live := prev != nil && !prev.tomb
		var counter int64
		if prev != nil {
			counter = prev.counter
		}
		next := &envelope{counter: counter}
		if digested {
			next.name = w.key
		}
		res := writeResult{}
		switch {
		case w.op == opPutIfAbsent && live:
			res.status = statusExists
			next.value, next.blob, next.size = prev.value, prev.blob, prev.size
		case w.op == opPutIfVersion && (!live || counter != w.expected):
			return writeResult{status: statusMismatch}, nil
		case w.op == opDelete:
			next.tomb = true
		default:
			next.counter = counter + 1
			res.version = next.counter
			if len(w.value) <= blobThreshold {
				next.value = w.value
				break
			}
			if blob == "" {
				if blob, err = s.newBlob(ctx, w.ns, w.value); err != nil {
					return writeResult{}, err
				}
			}
			next.blob, next.size = blob, int64(len(w.value))
		}
		if err := s.remember(ctx, prev, next, recentWrite{id: w.reqID, op: w.op, status: res.status, version: res.version, at: now.UnixMilli()}, target, rk); err != nil {
			return writeResult{}, err
		}
		err = s.swap(ctx, bk, prev, ver, next)
		if errors.Is(err, kv.ErrConflict) {
			continue // another write got there first: decide again
		}
		if err != nil {
			// The swap may have landed: keep the value it may name.
			used = blob != "" && next.blob == blob
			return writeResult{}, err
		}
		used = blob != "" && next.blob == blob
		if prev != nil && prev.blob != next.blob {
			s.dropBlob(prev.blob)
		}
		return res, nil
	}
}

// replay is the answer to a request id seen before: the recorded outcome,
// or statusReused when it was recorded for another operation or key.
func replay(recorded writeOp, status writeStatus, version int64, op writeOp, sameKey bool) writeResult {
	if recorded != op || !sameKey {
		return writeResult{status: statusReused, replayed: true}
	}
	return writeResult{status: status, version: version, replayed: true}
}

// treeEntry is one name of a tree listing with its envelope.
type treeEntry struct {
	name string
	env  *envelope
}

// treeList yields the live names under prefix that start with p and sort
// after after, in bytewise order, with their envelopes. The backend
// listing starts at treeFrom(prefix, after), so a client paging through n
// keys reads each about once on a backend with the start-after capability
// (the rest read from the start of the prefix and drop what comes first).
func (s *kvStore) treeList(ctx context.Context, prefix, p, after string, yield func(treeEntry) (bool, error)) error {
	bp, exact := backendPrefix(prefix, p)
	var group []treeEntry // digested names sharing one head
	groupHead := ""
	emit := func(e treeEntry) (bool, error) {
		if e.env.tomb || e.name <= after || !exact && !strings.HasPrefix(e.name, p) {
			return true, nil
		}
		return yield(e)
	}
	flush := func() (bool, error) {
		slices.SortFunc(group, func(a, b treeEntry) int { return strings.Compare(a.name, b.name) })
		for _, e := range group {
			if ok, err := emit(e); !ok || err != nil {
				return ok, err
			}
		}
		group = group[:0]
		return true, nil
	}
	for ent, err := range s.db.ListAfter(ctx, bp, treeFrom(prefix, after)) {
		if err != nil {
			return err
		}
		env, err := decodeEnvelope(ent.Value)
		if err != nil {
			return fmt.Errorf("%w: %s", err, trim(ent.Key))
		}
		rest := ent.Key[len(prefix):]
		if name, whole := treeName(rest); whole {
			if ok, err := flush(); !ok || err != nil {
				return err
			}
			if ok, err := emit(treeEntry{name, env}); !ok || err != nil {
				return err
			}
			continue
		}
		head := rest[:headLen(rest)]
		if head != groupHead {
			if ok, err := flush(); !ok || err != nil {
				return err
			}
			groupHead = head
		}
		if env.name == "" {
			return fmt.Errorf("%w: %s names no key", errBadEnvelope, trim(ent.Key))
		}
		group = append(group, treeEntry{env.name, env})
	}
	_, err := flush()
	return err
}

func (s *kvStore) list(ctx context.Context, ns, prefix, after string, limit int, values bool) ([]row, bool, error) {
	var page []row
	more, inline := false, 0
	err := s.treeList(ctx, kvPrefix(ns), prefix, after, func(e treeEntry) (bool, error) {
		if len(page) == limit || inline >= pageValueBytes {
			more = true
			return false, nil
		}
		r := row{key: e.name, size: int64(len(e.env.value))}
		if e.env.blob != "" {
			r.size = e.env.size // the handler reads it with get
		} else if values {
			r.value = e.env.value
			if r.value == nil {
				r.value = []byte{}
			}
			inline += len(r.value)
		}
		page = append(page, r)
		return true, nil
	})
	if err != nil {
		return nil, false, err
	}
	return page, more, nil
}

// forgetRequests removes the request records older than before. Envelopes
// drop their own old ids as they are written.
func (s *kvStore) forgetRequests(ctx context.Context, before time.Time) (int64, error) {
	cut := before.UnixMilli()
	var old []string
	for ent, err := range s.db.List(ctx, kvRoot+"rq/") {
		if err != nil {
			return 0, err
		}
		r, err := decodeRequestRecord(ent.Value)
		if err != nil || r.at < cut {
			old = append(old, ent.Key)
		}
	}
	var n int64
	for _, k := range old {
		if err := s.db.Delete(ctx, k); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// ---- native tables

func (s *kvStore) putEval(ctx context.Context, ns, agent, runID string, snapshot []byte) error {
	bk, digested := treeKey(evalPrefix(ns, agent), runID)
	e := &envelope{value: snapshot}
	if digested {
		e.name = runID
	}
	return s.db.Put(ctx, bk, e.encode())
}

func (s *kvStore) deleteEval(ctx context.Context, ns, agent, runID string) error {
	bk, _ := treeKey(evalPrefix(ns, agent), runID)
	return s.db.Delete(ctx, bk)
}

func (s *kvStore) listEvals(ctx context.Context, ns, agent, after string, limit int) ([]evalRow, bool, error) {
	var out []evalRow
	more := false
	err := s.treeList(ctx, evalPrefix(ns, agent), "", after, func(e treeEntry) (bool, error) {
		if len(out) == limit {
			more = true
			return false, nil
		}
		out = append(out, evalRow{runID: e.name, snapshot: e.env.value})
		return true, nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, more, nil
}

func (s *kvStore) putSample(ctx context.Context, ns string, x sample) error {
	at := x.at.UTC().Format(time.RFC3339Nano)
	id := digest(strings.Join([]string{x.agent, x.experiment, x.sessionID, at}, "\x00"))
	doc, err := json.Marshal(map[string]any{
		"agent": x.agent, "experiment": x.experiment, "variant": x.variant, "sessionId": x.sessionID,
		"at": at, "metrics": json.RawMessage(x.metrics),
	})
	if err != nil {
		return err
	}
	_, err = s.db.PutIfAbsent(ctx, kvRoot+"as/"+ns+"/"+id, doc)
	if errors.Is(err, kv.ErrConflict) {
		return nil // stored before: samples are kept once
	}
	return err
}

func (s *kvStore) putSnapshot(ctx context.Context, ns, agent string, doc []byte) error {
	return s.db.Put(ctx, kvRoot+"ab/"+ns+"/"+digest(agent), doc)
}

func (s *kvStore) getSnapshot(ctx context.Context, ns, agent string) ([]byte, error) {
	b, err := s.db.Get(ctx, kvRoot+"ab/"+ns+"/"+digest(agent))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, errNotFound
	}
	return b, err
}

// ---- the memory journal

// seqKey is the backend key of a memory record older than the newest.
func seqKey(prefix string, seq int64) string {
	return prefix + "r/" + fmt.Sprintf("%016x", seq)
}

// appendMemory appends to the journal's head: the head envelope holds the
// newest record (counter is its sequence number) and recent request ids.
// An append first copies the newest record to its own key (PutIfAbsent:
// every copy of it is the same), then replaces the head with
// compare-and-set. So every record but the newest has its key, the newest
// is in the head, and the head's compare-and-set is the append.
func (s *kvStore) appendMemory(ctx context.Context, ns, agent, reqID string, record []byte) (int64, bool, error) {
	prefix := memPrefix(ns, agent)
	head := prefix + "c"
	target := digest(agent)
	rk := func(id string) string { return memRequestKey(ns, agent, id) }
	for {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		prev, ver, err := s.readEnvelope(ctx, head)
		if err != nil {
			return 0, false, err
		}
		now := time.Now()
		if r, ok := prev.find(reqID); ok {
			return r.version, true, nil
		}
		rec, ok, err := s.lookupRequest(ctx, prev, rk(reqID), now)
		if err != nil {
			return 0, false, err
		}
		if ok {
			return rec.version, true, nil
		}
		next := &envelope{counter: 1, value: record}
		if prev != nil {
			if _, err := s.db.PutIfAbsent(ctx, seqKey(prefix, prev.counter), prev.value); err != nil && !errors.Is(err, kv.ErrConflict) {
				return 0, false, err
			}
			next.counter = prev.counter + 1
		}
		if err := s.remember(ctx, prev, next, recentWrite{id: reqID, op: opPut, version: next.counter, at: now.UnixMilli()}, target, rk); err != nil {
			return 0, false, err
		}
		err = s.swap(ctx, head, prev, ver, next)
		if errors.Is(err, kv.ErrConflict) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		return next.counter, false, nil
	}
}

// memBlock is how many records share one listing prefix of seqKey: the
// sequence numbers are dense, so a page reads its blocks only.
const memBlock = 256

// listMemory reads the head first, then the records after `after` block
// by block: every record older than the head's newest was copied before
// the head moved past it.
func (s *kvStore) listMemory(ctx context.Context, ns, agent string, after int64, limit int) ([]memoryRow, bool, error) {
	prefix := memPrefix(ns, agent)
	head, _, err := s.readEnvelope(ctx, prefix+"c")
	if err != nil || head == nil {
		return nil, false, err
	}
	var out []memoryRow
	next := after + 1
	for next < head.counter && len(out) <= limit {
		block := next / memBlock
		bp := seqKey(prefix, block*memBlock)
		bp = bp[:len(bp)-2] // 256 = two hex digits
		for ent, err := range s.db.List(ctx, bp) {
			if err != nil {
				return nil, false, err
			}
			seq, err := strconv.ParseInt(ent.Key[len(prefix)+2:], 16, 64)
			if err != nil || seq < next || seq >= head.counter {
				continue
			}
			if seq != next {
				return nil, false, fmt.Errorf("hosted: the memory journal of %s lacks record %d", trim(agent), next)
			}
			out = append(out, memoryRow{seq: seq, record: ent.Value})
			next++
			if len(out) > limit {
				break
			}
		}
		if len(out) <= limit && next < (block+1)*memBlock && next < head.counter {
			return nil, false, fmt.Errorf("hosted: the memory journal of %s lacks record %d", trim(agent), next)
		}
	}
	if next == head.counter && len(out) <= limit {
		out = append(out, memoryRow{seq: head.counter, record: head.value})
	}
	out, more := page(out, limit)
	return out, more, nil
}
