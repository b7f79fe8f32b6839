// Package rediskv is the Redis kv driver, built on go-redis v9. A store is a
// namespace of Redis keys under one prefix; several processes and hosts can
// share it, and its compare-and-set operations are atomic across all of them.
//
// It registers the "redis" and "rediss" (TLS) URL schemes. The URL is a
// go-redis URL (redis.ParseURL) with one extra query parameter, prefix, which
// names the namespace (default "agentkit:") and is removed before the rest
// reaches go-redis:
//
//	rediss://:secret@cache.internal:6380/2?prefix=agent-state:
//
// Under the prefix P the store keeps:
//
//	P d:KEY   a hash per key: field v holds the value, field r its version
//	P idx     a sorted set of every key (all scores 0), for ordered listing
//	P seq     the counter versions are drawn from
//
// Each write (Put, Delete and the conditional writes) is one Lua script that
// checks its condition and updates the hash, the index and the counter
// atomically, so the index always matches the data. A version is the
// counter's next value and a random nonce ("42-3k9x1m0q2zp7"): deleting keys
// never resets the counter, and the nonce keeps versions unique even when a
// restart or failover rolls the counter back. Listing walks the index by lexical range (ZRANGE BYLEX) in pages: complete and in
// bytewise order, never SCAN.
//
// Redis keeps data in memory: unless the server is configured to persist
// (appendonly yes, ideally with appendfsync everysec or always, or RDB
// snapshots), a restart loses writes that were acknowledged.
package rediskv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

// DefaultPrefix is the namespace a store uses when neither the URL nor
// Options names one.
const DefaultPrefix = "agentkit:"

// MaxValueSize is the largest value the driver stores: Redis's default limit
// for one argument (proto-max-bulk-len, 512 MB). Larger values fail with an
// error matching kv.ErrTooLarge before anything is sent. A server configured
// with a lower limit refuses larger values itself.
const MaxValueSize = 512 << 20

// DefaultPageSize is how many keys one listing step reads from the index.
const DefaultPageSize = 1000

func init() {
	// Opening creates nothing (keys appear with the first write), so a
	// read-only open is an ordinary one.
	open := func(ctx context.Context, u *url.URL, _ kv.OpenOptions) (*kv.DB, error) {
		rest, opts, err := splitURL(u)
		if err != nil {
			return nil, err
		}
		return Open(ctx, rest, opts)
	}
	kv.RegisterOptions("redis", open)
	kv.RegisterOptions("rediss", open)
}

// Options configures a store. The zero value (or nil) means the defaults.
type Options struct {
	// Prefix is the namespace: every Redis key of the store starts with
	// it. DefaultPrefix when empty. Two stores whose prefixes start one
	// another (app: and app:d:) can collide; give each a prefix that no
	// other begins with.
	Prefix string
	// PageSize is how many keys one listing step reads from the index,
	// DefaultPageSize when zero. List holds one page of values in memory,
	// so stores of large values want a smaller page.
	PageSize int
}

// splitURL removes the prefix parameter from a kv URL and returns the URL
// for go-redis.
func splitURL(u *url.URL) (string, *Options, error) {
	own, rest, err := driverkit.SplitParams(u, "prefix")
	if err != nil {
		return "", nil, fmt.Errorf("rediskv: %w (the default prefix is %s)", err, DefaultPrefix)
	}
	return rest.String(), &Options{Prefix: own["prefix"]}, nil
}

// Store is the Redis backend for one prefix. It implements the full core and
// the CAS group, and is safe for concurrent use. Use Open for the portable
// handle; (*kv.DB).Backend returns the *Store.
type Store struct {
	client   *redis.Client
	prefix   string
	index    string // prefix + "idx"
	seq      string // prefix + "seq"
	pageSize int
	maxValue int               // MaxValueSize; lowered by tests
	secrets  driverkit.Secrets // passwords to scrub from errors

	// testHookPage, when set by tests, runs after List reads a page of
	// the index and before it fetches the values.
	testHookPage func(page []string)
}

var (
	_ kv.Store       = (*Store)(nil)
	_ kv.CAS         = (*Store)(nil)
	_ kv.AfterLister = (*Store)(nil)
)

// Open connects to Redis and returns the store under opts.Prefix (nil opts
// mean the defaults). redisURL is a redis:// or rediss:// URL as
// redis.ParseURL reads it, without the prefix parameter. The driver never
// retries a command (max_retries must be unset, 0 or -1): a retried
// conditional write whose first attempt landed would report a false
// conflict. Errors never contain the password. Close the returned DB to
// close the client.
func Open(ctx context.Context, redisURL string, opts *Options) (*kv.DB, error) {
	s, err := open(ctx, redisURL, opts)
	if err != nil {
		return nil, err
	}
	return kv.New("redis", s)
}

func open(ctx context.Context, redisURL string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.PageSize < 0 {
		return nil, fmt.Errorf("rediskv: PageSize %d is negative; use 0 for the default %d", o.PageSize, DefaultPageSize)
	}
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	var secrets driverkit.Secrets
	if u, err := url.Parse(redisURL); err != nil {
		// url.Parse's error quotes the input, password included.
		return nil, errors.New("rediskv: the URL does not parse; check its escaping")
	} else if u.User != nil {
		p, _ := u.User.Password()
		secrets.Add(p)
	}
	ro, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, secrets.Scrub(fmt.Errorf("rediskv: %w", err))
	}
	secrets.Add(ro.Password)
	if ro.MaxRetries > 0 {
		return nil, fmt.Errorf("rediskv: max_retries=%d is not allowed: a retried conditional write whose first attempt landed would report a false conflict; remove the parameter", ro.MaxRetries)
	}
	ro.MaxRetries = -1
	ro.ContextTimeoutEnabled = true
	// Reach the server before go-redis tries: its pool prints a line of
	// its own to standard error (through a logger global to the process)
	// when it cannot dial, beside the error returned here.
	if err := reach(ctx, ro); err != nil {
		return nil, secrets.Scrub(fmt.Errorf("rediskv: connect to %s: %w", ro.Addr, err))
	}
	client := redis.NewClient(ro)
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, secrets.Scrub(fmt.Errorf("rediskv: connect to %s: %w", ro.Addr, err))
	}
	return &Store{
		client:   client,
		prefix:   o.Prefix,
		index:    o.Prefix + "idx",
		seq:      o.Prefix + "seq",
		pageSize: o.PageSize,
		maxValue: MaxValueSize,
		secrets:  secrets,
	}, nil
}

// reach opens and closes one connection to the server the options name,
// with the options' dialer and dial timeout.
func reach(ctx context.Context, ro *redis.Options) error {
	if ro.Dialer != nil {
		return nil // a custom dialer: let the client use it
	}
	d := net.Dialer{Timeout: ro.DialTimeout}
	if d.Timeout == 0 {
		d.Timeout = 5 * time.Second
	}
	c, err := d.DialContext(ctx, cmp.Or(ro.Network, "tcp"), ro.Addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// Close closes the client and its connections.
func (s *Store) Close() error {
	return s.err(context.Background(), s.client.Close())
}

// Prefix returns the store's namespace.
func (s *Store) Prefix() string { return s.prefix }

// dataKey is the Redis key of the hash holding key's value and version.
func (s *Store) dataKey(key string) string { return s.prefix + "d:" + key }

// The write scripts. KEYS are the data hash, the index and the counter;
// ARGV[1] is the value, ARGV[2] the key (the index member), ARGV[3] a random
// nonce. The new version is the counter's next value and the nonce: the
// counter keeps versions apart while the server keeps its data, and the
// nonce keeps them apart when it does not (a restart from an older snapshot
// or a failover to a replica that missed writes rolls the counter back, and
// the same number is handed out again). A script answers the new version,
// or nil when its condition fails.
var (
	putScript = redis.NewScript(`
local r = string.format('%d-%s', redis.call('INCR', KEYS[3]), ARGV[3])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'r', r)
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return r`)
	putIfAbsentScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local r = string.format('%d-%s', redis.call('INCR', KEYS[3]), ARGV[3])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'r', r)
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return r`)
	// ARGV[4] is the expected version.
	putIfVersionScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'r') ~= ARGV[4] then return false end
local r = string.format('%d-%s', redis.call('INCR', KEYS[3]), ARGV[3])
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'r', r)
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return r`)
	// KEYS are the data hash and the index; ARGV[1] is the key.
	deleteScript = redis.NewScript(`
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1`)
)

// nonce returns the random part of a new version.
func nonce() string { return strconv.FormatUint(rand.Uint64(), 36) }

func (s *Store) checkSize(value []byte) error {
	if len(value) > s.maxValue {
		return fmt.Errorf("%w: %d bytes is over the Redis driver's limit of %d bytes", kv.ErrTooLarge, len(value), s.maxValue)
	}
	return nil
}

// write runs a write script on key with the value (and any further
// arguments) and returns the new version; ok is false when the script's
// condition failed.
func (s *Store) write(ctx context.Context, script *redis.Script, key string, value []byte, more ...any) (kv.Version, bool, error) {
	args := append([]any{value, key, nonce()}, more...)
	r, err := script.Run(ctx, s.client, []string{s.dataKey(key), s.index, s.seq}, args...).Text()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, s.err(ctx, err)
	}
	return kv.Version(r), true, nil
}

// Put creates or overwrites key with a new version.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.checkSize(value); err != nil {
		return err
	}
	_, _, err := s.write(ctx, putScript, key, value)
	return err
}

// Get returns the value of key, or an error matching kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	v, err := s.client.HGet(ctx, s.dataKey(key), "v").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, kv.ErrNotFound
	}
	if err != nil {
		return nil, s.err(ctx, err)
	}
	return v, nil
}

// Delete removes key; a missing key is not an error.
func (s *Store) Delete(ctx context.Context, key string) error {
	err := deleteScript.Run(ctx, s.client, []string{s.dataKey(key), s.index}, key).Err()
	return s.err(ctx, err)
}

// GetWithVersion returns the value of key and its version, or an error
// matching kv.ErrNotFound.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	vals, err := s.client.HMGet(ctx, s.dataKey(key), "v", "r").Result()
	if err != nil {
		return nil, "", s.err(ctx, err)
	}
	v, ok1 := vals[0].(string)
	r, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return nil, "", kv.ErrNotFound
	}
	return []byte(v), kv.Version(r), nil
}

// PutIfAbsent writes key only if it does not exist; otherwise the error
// matches kv.ErrConflict.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	ver, ok, err := s.write(ctx, putIfAbsentScript, key, value)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %w", kv.ErrConflict, kv.ErrExists)
	}
	return ver, err
}

// PutIfVersion writes key only if it exists with version expected; otherwise
// (a missing key and a token this driver never issued included) the error
// matches kv.ErrConflict. A failure whose outcome is unknown, such as a
// timeout, is returned as it is and never as a conflict: the driver does not
// retry, so a lost reply cannot turn into a conflict on the second attempt.
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := s.checkSize(value); err != nil {
		return "", err
	}
	ver, ok, err := s.write(ctx, putIfVersionScript, key, value, string(expected))
	if err == nil && !ok {
		err = fmt.Errorf("%w: the key is missing or its version changed", kv.ErrConflict)
	}
	return ver, err
}

// List yields the entries under prefix in ascending bytewise key order. It
// reads PageSize keys at a time from the index, each step starting after the
// last key of the one before, and fetches their values with one pipeline of
// HGETs; no connection is held while the caller's loop body runs. A key
// deleted between the index read and the value fetch is skipped. One page of
// values is in memory at a time: lower PageSize for stores of large values.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter is List from the first key after after: the first index read
// starts there.
func (s *Store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		for page, err := range s.pages(ctx, prefix, after) {
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			if len(page) == 0 {
				return
			}
			if s.testHookPage != nil {
				s.testHookPage(page)
			}
			cmds, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range page {
					p.HGet(ctx, s.dataKey(k), "v")
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				yield(kv.Entry{}, s.err(ctx, err))
				return
			}
			for i, k := range page {
				v, err := cmds[i].(*redis.StringCmd).Bytes()
				if errors.Is(err, redis.Nil) {
					continue // deleted since the index was read
				}
				if err != nil {
					yield(kv.Entry{}, s.err(ctx, err))
					return
				}
				if !yield(kv.Entry{Key: k, Value: v}, nil) {
					return
				}
			}
		}
	}
}

// ListKeys yields the keys under prefix in ascending bytewise order, read
// from the index as List reads them.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter is ListKeys from the first key after after.
func (s *Store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for page, err := range s.pages(ctx, prefix, after) {
			if err != nil {
				yield("", err)
				return
			}
			for _, k := range page {
				if !yield(k, nil) {
					return
				}
			}
		}
	}
}

// pages walks the index in key order: each ZRANGE BYLEX (ZRANGEBYLEX's
// current spelling, Redis 6.2 and later) reads up to
// PageSize+1 members after the previous page's last one (the extra member
// only tells whether another page follows), bounded above by the prefix's
// successor. The first read starts after from when from sorts at or after
// the prefix.
func (s *Store) pages(ctx context.Context, prefix, from string) iter.Seq2[[]string, error] {
	return func(yield func([]string, error) bool) {
		lo, hi := "-", "+"
		if prefix != "" {
			lo = "[" + prefix
			if up, ok := driverkit.PrefixEnd(prefix); ok {
				hi = "(" + up
			}
		}
		if from != "" && from >= prefix {
			lo = "(" + from
		}
		for {
			page, err := s.client.ZRangeArgs(ctx, redis.ZRangeArgs{Key: s.index, Start: lo, Stop: hi, ByLex: true, Count: int64(s.pageSize + 1)}).Result()
			if err != nil {
				yield(nil, s.err(ctx, err))
				return
			}
			more := len(page) > s.pageSize
			if more {
				page = page[:s.pageSize]
			}
			if !yield(page, nil) || !more {
				return
			}
			lo = "(" + page[len(page)-1]
		}
	}
}

// Drop deletes every key of the store's namespace: the data of each indexed
// key, the index and the version counter. With the counter gone, a store
// used again under the same prefix starts its versions afresh: drop a
// namespace only when no client still holds its versions. Keys written
// during Drop may survive it.
func (s *Store) Drop(ctx context.Context) error {
	for page, err := range s.pages(ctx, "", "") {
		if err != nil {
			return err
		}
		keys := make([]string, 0, len(page))
		for _, k := range page {
			keys = append(keys, s.dataKey(k))
		}
		if err := s.client.Unlink(ctx, keys...).Err(); err != nil {
			return s.err(ctx, err)
		}
	}
	return s.err(ctx, s.client.Del(ctx, s.index, s.seq).Err())
}

// err scrubs credentials from an error (go-redis errors do not carry them,
// but a server or proxy may echo what it was sent), and marks a network
// timeout at or past ctx's deadline as context.DeadlineExceeded: go-redis
// sets the connection's deadline from ctx, and its timeout can fire before
// ctx reports itself done.
func (s *Store) err(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	if dl, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(dl) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return s.secrets.Scrub(err)
}
