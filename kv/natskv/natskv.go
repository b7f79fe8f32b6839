// Package natskv is the kv driver for a NATS JetStream key-value bucket,
// built on nats.go's jetstream package.
//
// It registers the "nats" scheme:
//
//	nats://[user:password@]host:port?bucket=NAME&creds=FILE
//
// Open connects, creates the bucket (History 1) when it is missing, and
// returns a store whose every client of the same bucket shares its data and
// its compare-and-set guarantees: conditional writes are decided by the
// JetStream server, so they hold across processes and hosts.
//
// Versions are JetStream revisions, the stream sequence numbers of the
// writes: every write, a plain Put of identical bytes included, gets a new
// one, and they never restart after a delete. Keys are mapped onto
// JetStream's key alphabet reversibly (see docs/drivers/nats.md). Values are
// capped by the server's max_payload (1 MiB by default) less a 1 KiB
// reserve for headers; MaxValueSize reports the limit and a larger value
// fails with kv.ErrTooLarge. Listing reads the bucket's keys with a
// JetStream watcher, checks them against the stream's list of subjects,
// then sorts and deduplicates them, so a listing costs time and memory in
// proportion to the keys under the prefix's last '/'.
package natskv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

func init() {
	kv.RegisterOptions("nats", openURL)
}

// DefaultBucket is the bucket used when the URL names none.
const DefaultBucket = "agentkit"

// headerReserve is the part of the server's max_payload kept for the
// headers a conditional write carries (Nats-Expected-Last-Subject-Sequence
// and the like take under 100 bytes).
const headerReserve = 1024

// Options configure a store over an existing connection. The zero value
// uses DefaultBucket, file storage and one replica.
type Options struct {
	// Bucket is the key-value bucket; it is created when missing.
	Bucket string
	// Replicas is the bucket's replica count when it is created (1 when
	// zero). An existing bucket keeps its own.
	Replicas int
	// Memory selects memory storage for a bucket this call creates.
	Memory bool
	// ReadOnly opens without creating the bucket: a missing bucket is an
	// error (kv.OpenOptions.ReadOnly sets it).
	ReadOnly bool
}

// Store is the JetStream backend. It implements the full core and the CAS
// group, and is safe for concurrent use. Use Open or kv.Open for the
// portable handle.
type Store struct {
	nc       *nats.Conn
	ownsConn bool
	bucket   string
	kv       jetstream.KeyValue
	stream   jetstream.Stream
	// subjectPrefix is "$KV.<bucket>.", the subjects of the bucket's keys.
	subjectPrefix string
	maxValue      int
	// listIdle is how long a listing waits for the consumer's next entry
	// (defaultListIdle; tests shorten it).
	listIdle time.Duration
	// testStall, when above zero, makes a listing ignore the consumer's
	// entries after that many, as a stalled subscription would (tests).
	testStall int
}

// defaultListIdle is how long a listing waits for the consumer's next
// entry before it stops reading and completes the listing from the
// stream's own list of subjects instead.
const defaultListIdle = 2 * time.Second

var (
	_ kv.Store = (*Store)(nil)
	_ kv.CAS   = (*Store)(nil)
)

// Open returns the portable handle over a store on the bucket opts names,
// through an existing connection, creating the bucket when it is missing.
// Closing the store does not close nc. nil opts mean defaults.
func Open(ctx context.Context, nc *nats.Conn, opts *Options) (*kv.DB, error) {
	s, err := NewStore(ctx, nc, opts)
	if err != nil {
		return nil, err
	}
	return kv.New("nats", s)
}

// NewStore is Open without the portable handle, for drivers' tests and for
// reaching the bucket directly.
func NewStore(ctx context.Context, nc *nats.Conn, opts *Options) (*Store, error) {
	if opts == nil {
		opts = &Options{}
	}
	bucket := cmp.Or(opts.Bucket, DefaultBucket)
	if !validBucket(bucket) {
		return nil, fmt.Errorf("natskv: bucket name %q is not valid; use letters, digits, '-' and '_'", bucket)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natskv: %w", err)
	}
	b, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && opts.ReadOnly {
		return nil, fmt.Errorf("natskv: the bucket %q does not exist (opened read-only, so it was not created)", bucket)
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg := jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "agentkit kv store",
			History:     1,
			Replicas:    max(opts.Replicas, 1),
			Storage:     jetstream.FileStorage,
		}
		if opts.Memory {
			cfg.Storage = jetstream.MemoryStorage
		}
		b, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			// Another client created it first, perhaps with another
			// configuration: use it as it is.
			b, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		if errors.Is(err, nats.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
			return nil, fmt.Errorf("natskv: JetStream is not enabled on the server; start nats-server with -js: %w", err)
		}
		return nil, fmt.Errorf("natskv: open bucket %q: %w", bucket, err)
	}
	limit := int(nc.MaxPayload()) - headerReserve
	stream, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("natskv: read the configuration of bucket %q: %w", bucket, err)
	}
	if m := stream.CachedInfo().Config.MaxMsgSize; m > 0 {
		limit = min(limit, int(m)-headerReserve)
	}
	if limit < 1 {
		return nil, fmt.Errorf("natskv: bucket %q allows no values (max_payload %d, bucket max value size %d)",
			bucket, nc.MaxPayload(), stream.CachedInfo().Config.MaxMsgSize)
	}
	return &Store{nc: nc, bucket: bucket, kv: b, stream: stream, subjectPrefix: "$KV." + bucket + ".", maxValue: limit}, nil
}

func validBucket(b string) bool {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !driverkit.AlphaNum(c) {
			return false
		}
	}
	return b != ""
}

// openURL is the Opener for nats:// URLs.
func openURL(ctx context.Context, u *url.URL, o kv.OpenOptions) (*kv.DB, error) {
	opts := Options{ReadOnly: o.ReadOnly}
	var natsOpts []nats.Option
	q, err := driverkit.Params(u, "bucket", "creds", "nkey", "replicas", "storage", "name")
	if err != nil {
		return nil, fmt.Errorf("natskv: %w", err)
	}
	for name, v := range q {
		switch name {
		case "bucket":
			opts.Bucket = v
		case "creds":
			natsOpts = append(natsOpts, nats.UserCredentials(v))
		case "nkey":
			o, err := nats.NkeyOptionFromSeed(v)
			if err != nil {
				return nil, fmt.Errorf("natskv: the nkey seed file given by the nkey parameter does not load: %w", err)
			}
			natsOpts = append(natsOpts, o)
		case "replicas":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 5 {
				return nil, fmt.Errorf("natskv: replicas=%q: want a number from 1 to 5", v)
			}
			opts.Replicas = n
		case "storage":
			switch v {
			case "file":
			case "memory":
				opts.Memory = true
			default:
				return nil, fmt.Errorf("natskv: storage=%q: want file or memory", v)
			}
		case "name":
			natsOpts = append(natsOpts, nats.Name(v))
		}
	}
	if u.Host == "" {
		return nil, errors.New("natskv: the URL names no server; use nats://host:4222?bucket=NAME")
	}
	if u.Path != "" && u.Path != "/" {
		return nil, errors.New("natskv: the URL has a path; name the bucket with ?bucket=NAME instead")
	}
	// Credentials go to the client as options, never in the server URL,
	// so no error or log line of the client can show them.
	var secrets driverkit.Secrets
	if u.User != nil {
		user := u.User.Username()
		if pw, ok := u.User.Password(); ok {
			natsOpts = append(natsOpts, nats.UserInfo(user, pw))
			secrets.Add(pw)
		} else {
			natsOpts = append(natsOpts, nats.Token(user))
			secrets.Add(user)
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		natsOpts = append(natsOpts, nats.Timeout(max(time.Until(dl), time.Millisecond)))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	nc, err := nats.Connect("nats://"+u.Host, natsOpts...)
	if err != nil {
		return nil, fmt.Errorf("natskv: connect to %s: %w", u.Host, redact(err, secrets))
	}
	s, err := NewStore(ctx, nc, &opts)
	if err != nil {
		nc.Close()
		return nil, redact(err, secrets)
	}
	s.ownsConn = true
	return kv.New("nats", s)
}

// redact hides any secret an error message might repeat.
func redact(err error, secrets driverkit.Secrets) error { return secrets.Scrub(err) }

// Bucket returns the bucket's name.
func (s *Store) Bucket() string { return s.bucket }

// KeyValue returns the underlying jetstream bucket, for benchmarks and
// operations the contract does not cover. Keys in it are encoded.
func (s *Store) KeyValue() jetstream.KeyValue { return s.kv }

// MaxValueSize returns the largest value, in bytes, the store accepts.
func (s *Store) MaxValueSize() int { return s.maxValue }

// Close closes the connection when the store opened it (kv.Open); a
// connection passed to Open stays open.
func (s *Store) Close() error {
	if s.ownsConn {
		s.nc.Close()
	}
	return nil
}

func (s *Store) checkSize(value []byte) error {
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: %d bytes is over the %d-byte limit of this NATS server (max_payload less %d bytes for headers); raise max_payload in the server configuration",
			kv.ErrTooLarge, len(value), s.maxValue, headerReserve)
	}
	return nil
}

// mapErr turns jetstream errors into the contract's sentinels.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: %w", kv.ErrNotFound, err)
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %w", kv.ErrTooLarge, err)
	case isWrongLastSequence(err):
		return fmt.Errorf("%w: %w", kv.ErrConflict, err)
	}
	return err
}

// isWrongLastSequence reports a lost conditional write: the server's
// "wrong last sequence" answer (10071, or 10164 on replicated streams).
func isWrongLastSequence(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func version(rev uint64) kv.Version { return kv.Version(strconv.FormatUint(rev, 10)) }

// parseVersion returns the revision a token names, or false for a token
// this driver never issues.
func parseVersion(v kv.Version) (uint64, bool) {
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil || n == 0 || version(n) != v {
		return 0, false
	}
	return n, true
}

// Put creates or overwrites key; the write gets a new revision.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.checkSize(value); err != nil {
		return err
	}
	_, err := s.kv.Put(ctx, encodeKey(key), value)
	return mapErr(err)
}

// Get returns the value of key, or an error matching kv.ErrNotFound when it
// is missing or deleted.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := s.GetWithVersion(ctx, key)
	return v, err
}

// Delete removes key by writing a delete marker. A missing key is not an
// error.
func (s *Store) Delete(ctx context.Context, key string) error {
	return mapErr(s.kv.Delete(ctx, encodeKey(key)))
}

// GetWithVersion returns the value of key and its revision.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	e, err := s.kv.Get(ctx, encodeKey(key))
	if err != nil {
		return nil, "", mapErr(err)
	}
	return e.Value(), version(e.Revision()), nil
}

// PutIfAbsent writes key only if it does not exist (a deleted key counts as
// absent); otherwise it returns an error matching kv.ErrConflict.
//
// jetstream's own Create is not used: it reads a delete marker's revision
// and then writes conditionally on it, so a concurrent Delete (a new marker)
// in between makes it report "exists" for a key that was absent all along.
// Here a lost write is retried for as long as the latest message is a
// delete marker, and a conflict is reported only when a value is present.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	enc := encodeKey(key)
	var last uint64 // 0: the key has no message at all
	for attempt := 0; ; attempt++ {
		rev, err := s.kv.Update(ctx, enc, value, last)
		if err == nil {
			return version(rev), nil
		}
		if !isWrongLastSequence(err) {
			return "", mapErr(err)
		}
		m, gerr := s.stream.GetLastMsgForSubject(ctx, s.subjectPrefix+enc)
		switch {
		case errors.Is(gerr, jetstream.ErrMsgNotFound):
			last = 0 // purged meanwhile
		case gerr != nil:
			return "", fmt.Errorf("natskv: read the key after a lost create: %w", gerr)
		case isDeleteMarker(m.Header):
			last = m.Sequence
		default:
			return "", fmt.Errorf("%w: %w", kv.ErrConflict, err)
		}
		if attempt == maxCreateAttempts {
			// Deletes keep racing this create; the key is absent, so this is
			// no conflict, and the write did not happen.
			return "", fmt.Errorf("natskv: create lost %d races with concurrent deletes of the key; try again", attempt+1)
		}
	}
}

// maxCreateAttempts bounds PutIfAbsent's retries under concurrent deletes.
const maxCreateAttempts = 100

// isDeleteMarker reports whether a message's headers mark a deletion, as
// jetstream's own Get decides.
func isDeleteMarker(h nats.Header) bool {
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	case "":
		switch h.Get(jetstream.MarkerReasonHeader) {
		case "MaxAge", "Purge", "Remove":
			return true
		}
	}
	return false
}

// PutIfVersion writes key only if its latest revision is expected. A
// missing key, another revision or a token this driver never issued is an
// error matching kv.ErrConflict.
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	rev, ok := parseVersion(expected)
	if !ok {
		// Revision 0 would mean "create" to the server: never send it.
		return "", fmt.Errorf("%w: %q is not a version this driver issues", kv.ErrConflict, expected)
	}
	next, err := s.kv.Update(ctx, encodeKey(key), value, rev)
	if err != nil {
		return "", mapErr(err)
	}
	return version(next), nil
}

// List yields the entries under prefix in ascending key order. It reads
// the latest value of every key under the prefix's complete segments with
// one watcher, then sorts; the listing is held in memory.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		entries, err := s.scan(ctx, prefix, true)
		if err != nil {
			yield(kv.Entry{}, err)
			return
		}
		for _, e := range entries {
			if !yield(e, nil) {
				return
			}
		}
	}
}

// ListKeys yields the keys under prefix in ascending order, reading only
// the messages' headers.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		entries, err := s.scan(ctx, prefix, false)
		if err != nil {
			yield("", err)
			return
		}
		for _, e := range entries {
			if !yield(e.Key, nil) {
				return
			}
		}
	}
}

// scan reads the latest entry of every key under prefix with an ordered
// consumer (one message per key, deletions included), keeps the last one
// seen per key, drops deleted keys, decodes, filters and sorts, then checks
// the result against the stream's own list of subjects.
//
// The consumer alone is not enough. The watcher announces the end of the
// initial values (a nil entry) after as many messages as were pending when
// it started, and the pending counts the server reports drift when keys
// are overwritten during the listing (an overwritten key's message moves
// past the end). The scan therefore reads until a message reports nothing
// pending and then, unless the stream did not change meanwhile, asks it for
// every subject under the filter (a snapshot taken after the listing began,
// so it holds every key present before): a subject the consumer did not
// deliver is read directly.
//
// The same check ends a listing whose consumer falls silent for listIdle
// before it reported nothing pending: the subscription can stall (seen on
// a loaded machine, where a listing waited for minutes), or the last
// pending message can leave the stream before it is delivered. Reading the
// missed subjects directly is slower but complete, so the listing never
// waits forever.
func (s *Store) scan(ctx context.Context, prefix string, values bool) ([]kv.Entry, error) {
	filter := filterFor(prefix)
	var filters []string
	if filter != "" {
		filters = []string{filter}
	}
	var opts []jetstream.WatchOpt
	if !values {
		opts = append(opts, jetstream.MetaOnly())
	}
	before, err := s.streamState(ctx)
	if err != nil {
		return nil, err
	}
	w, err := s.kv.WatchFiltered(ctx, filters, opts...)
	if err != nil {
		return nil, fmt.Errorf("natskv: start listing: %w", err)
	}
	defer func() {
		_ = w.Stop()
		// The watcher's callback may be blocked handing over an entry;
		// drain until the subscription closes the channel.
		go func() {
			for range w.Updates() {
			}
		}()
	}()
	// Entries in the order the consumer delivers them, deletions
	// included; sorted and reduced to each key's last one at the end
	// (cheaper than maps for the usual listing of distinct keys).
	var got []found
	add := func(enc string, deleted bool, value []byte) {
		key, ok := decodeKey(enc)
		if !ok || !strings.HasPrefix(key, prefix) {
			got = append(got, found{enc: enc, foreign: true})
			return
		}
		if value == nil {
			value = []byte{}
		}
		got = append(got, found{enc: enc, key: key, value: value, deleted: deleted})
	}
	received := 0
	idle := time.NewTimer(cmp.Or(s.listIdle, defaultListIdle))
	defer idle.Stop()
	silent := false
consume:
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-idle.C:
			silent = true
			break consume
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("natskv: the listing stopped before it was complete (the connection closed)")
			}
			if s.testStall > 0 && received >= s.testStall {
				continue
			}
			idle.Reset(cmp.Or(s.listIdle, defaultListIdle))
			if e == nil {
				if received == 0 {
					break consume // nothing was pending
				}
				continue
			}
			received++
			add(e.Key(), e.Operation() != jetstream.KeyValuePut, e.Value())
			if e.Delta() == 0 {
				break consume
			}
		}
	}
	// A stream that did not change while the consumer read it (no message
	// added or removed) was delivered exactly, unless the consumer fell
	// silent; otherwise check.
	after, err := s.streamState(ctx)
	if err != nil {
		return nil, err
	}
	if after != before || silent {
		seen := make(map[string]bool, len(got))
		for _, f := range got {
			seen[f.enc] = true
		}
		if err := s.complete(ctx, filter, values, seen, add); err != nil {
			return nil, err
		}
	}
	return latest(got), nil
}

// found is one message a listing read: its encoded key, and for a key of
// the listing, the key, the value and whether it marks a deletion.
type found struct {
	enc, key string
	value    []byte
	deleted  bool
	foreign  bool // not a key of this driver, or outside the prefix
}

// latest returns the entries of the keys whose last message (in the order
// read) is a value, in ascending key order.
func latest(got []found) []kv.Entry {
	slices.SortStableFunc(got, func(a, b found) int { return strings.Compare(a.key, b.key) })
	out := make([]kv.Entry, 0, len(got))
	for i, f := range got {
		if f.foreign || f.deleted || i+1 < len(got) && got[i+1].key == f.key && !got[i+1].foreign {
			continue // not ours, deleted, or superseded by a later message
		}
		out = append(out, kv.Entry{Key: f.key, Value: f.value})
	}
	return out
}

// streamState returns the stream's last sequence and message count, which
// together change whenever a message is added or removed.
func (s *Store) streamState(ctx context.Context) ([2]uint64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return [2]uint64{}, fmt.Errorf("natskv: read the bucket's state: %w", err)
	}
	return [2]uint64{info.State.LastSeq, info.State.Msgs}, nil
}

// complete reads directly every subject under the filter that the
// consumer did not deliver.
func (s *Store) complete(ctx context.Context, filter string, values bool, seen map[string]bool, add func(enc string, deleted bool, value []byte)) error {
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(s.subjectPrefix+cmp.Or(filter, ">")))
	if err != nil {
		return fmt.Errorf("natskv: list the bucket's subjects: %w", err)
	}
	for subj := range info.State.Subjects {
		enc, ok := strings.CutPrefix(subj, s.subjectPrefix)
		if !ok || seen[enc] {
			continue
		}
		if _, ok := decodeKey(enc); !ok {
			continue
		}
		m, err := s.stream.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // purged meanwhile
		}
		if err != nil {
			return fmt.Errorf("natskv: read a key the listing missed: %w", err)
		}
		var v []byte
		if values {
			v = m.Data
		}
		add(enc, isDeleteMarker(m.Header), v)
	}
	return nil
}
