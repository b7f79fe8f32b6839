// Package s3kv is the kv driver for S3-class object storage (any server
// with conditional writes: If-None-Match and If-Match on PutObject), built on
// aws-sdk-go-v2.
//
// It registers the "s3" scheme:
//
//	s3://[ACCESS_KEY:SECRET_KEY@]BUCKET/PREFIX?endpoint=http://127.0.0.1:7070&region=us-east-1
//
// Each key is one object under PREFIX. PutIfAbsent is a PutObject with
// If-None-Match: *, PutIfVersion one with If-Match: the version, which is
// the object's ETag. Because an ETag is the MD5 of the body, every object
// starts with a 20-byte header holding a random nonce, stripped on read, so
// writing identical bytes twice still changes the version. Delete writes a
// 12-byte tombstone object rather than calling DeleteObject, so deletes are
// ordered with conditional writes on servers whose DeleteObject bypasses
// the lock of their conditional writes (versitygw's posix backend); the
// tombstones stay behind. Keys are mapped to object names that no server
// rewrites or refuses (see docs/drivers/s3.md), and listings decode and
// sort them, so List and ListKeys return keys in bytewise order whatever
// order the server lists names in.
//
// Credentials come from the URL's user information or from the SDK's usual
// sources (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, shared files, roles).
// They never appear in errors.
package s3kv

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

func init() {
	kv.RegisterOptions("s3", openURL)
}

// The stored body: magic, a random nonce, then the value. The object of a
// key stored under a bounded name (see longName) has longMagic instead, and
// the key (its length in two bytes, then its bytes) between the nonce and
// the value. A deleted key is a tombstone: tombMagic and a shorter nonce,
// shorter than any value's body, so a listing tells the two apart by size
// alone.
const (
	magic        = "akv\x01"
	longMagic    = "akv\x02"
	nonceLen     = 16
	headerLen    = len(magic) + nonceLen
	tombMagic    = "akv\x00"
	tombNonceLen = 8
	tombLen      = len(tombMagic) + tombNonceLen
	// maxObject is the largest object a single PutObject may write.
	maxObject = 5 << 30
	// listWindow is how many values List reads at once.
	listWindow = 16
)

// Options configure a store over an existing client.
type Options struct {
	// Bucket holds the store's objects; it is created when missing.
	Bucket string
	// Prefix is the folder, inside the bucket, that holds the store's
	// objects: "" for the whole bucket, or a '/'-separated path (a
	// trailing '/' is added).
	Prefix string
	// Region is the region for a bucket this call creates; "" or
	// "us-east-1" creates it without a location constraint.
	Region string
	// ReadOnly opens the store without creating anything: a missing
	// bucket is an error, and the key format marker is read, never
	// written (kv.OpenOptions.ReadOnly sets it).
	ReadOnly bool
}

// Store is the S3 backend. It implements the full core and the CAS group,
// and is safe for concurrent use. Use Open or kv.Open for the portable
// handle.
type Store struct {
	client *s3.Client
	bucket string
	prefix string
	conns  *idleCloser // closed by Close when the store made the client
	// md5ETags is set once the server has shown that its ETags are the
	// MD5 of the body (see GetWithVersion).
	md5ETags atomic.Bool
	// format is the key format (1 or 2) and codec its mapping; room is
	// how many bytes of object name are left after the prefix.
	format int
	codec  keyCodec
	room   int
}

var (
	_ kv.Store       = (*Store)(nil)
	_ kv.CAS         = (*Store)(nil)
	_ kv.AfterLister = (*Store)(nil)
)

// Open returns the portable handle over a store in opts.Bucket under
// opts.Prefix, through an existing client, creating the bucket when it is
// missing. opts must name a bucket.
func Open(ctx context.Context, client *s3.Client, opts *Options) (*kv.DB, error) {
	s, err := NewStore(ctx, client, opts)
	if err != nil {
		return nil, err
	}
	return kv.New("s3", s)
}

// NewStore is Open without the portable handle.
func NewStore(ctx context.Context, client *s3.Client, opts *Options) (*Store, error) {
	if opts == nil || opts.Bucket == "" {
		return nil, errors.New("s3kv: no bucket given; use s3://BUCKET/PREFIX")
	}
	prefix, err := cleanPrefix(opts.Prefix)
	if err != nil {
		return nil, err
	}
	s := &Store{client: client, bucket: opts.Bucket, prefix: prefix, room: maxName - len(prefix)}
	if err := s.ensureBucket(ctx, opts.Region, opts.ReadOnly); err != nil {
		return nil, err
	}
	if err := s.loadFormat(ctx, opts.ReadOnly); err != nil {
		return nil, err
	}
	return s, nil
}

// cleanPrefix checks a prefix folder and gives it a trailing '/'.
func cleanPrefix(p string) (string, error) {
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return "", nil
	}
	p = strings.TrimSuffix(p, "/")
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "" || c == "." || c == "..":
			return "", fmt.Errorf("s3kv: the prefix %q has an empty, '.' or '..' folder, which servers rewrite; use plain folder names", p)
		case len(c) > 200:
			return "", fmt.Errorf("s3kv: the prefix %q has a folder name over 200 bytes", p)
		}
	}
	if len(p) > maxPrefix {
		return "", fmt.Errorf("s3kv: the prefix is %d bytes long; keep it under %d, so keys have room in S3's 1,024-byte object names", len(p), maxPrefix)
	}
	return p + "/", nil
}

// maxPrefix bounds the store's prefix, leaving keys most of S3's 1,024
// bytes of object name.
const maxPrefix = 512

func (s *Store) ensureBucket(ctx context.Context, region string, readOnly bool) error {
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.bucket})
	if err == nil {
		return nil
	}
	switch httpStatus(err) {
	case http.StatusNotFound:
		if readOnly {
			return fmt.Errorf("s3kv: the bucket %q does not exist (opened read-only, so it was not created)", s.bucket)
		}
	case http.StatusForbidden:
		return fmt.Errorf("s3kv: the server refused access to bucket %q (403): check the access key and secret, and the bucket's policy: %w", s.bucket, err)
	default:
		return fmt.Errorf("s3kv: check bucket %q: %w", s.bucket, err)
	}
	in := &s3.CreateBucketInput{Bucket: &s.bucket}
	if region != "" && region != "us-east-1" {
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{
			LocationConstraint: types.BucketLocationConstraint(region),
		}
	}
	_, err = s.client.CreateBucket(ctx, in)
	var owned *types.BucketAlreadyOwnedByYou
	if err != nil && !errors.As(err, &owned) && errCode(err) != "BucketAlreadyOwnedByYou" {
		return fmt.Errorf("s3kv: create bucket %q: %w", s.bucket, err)
	}
	return nil
}

// openURL is the Opener for s3:// URLs.
func openURL(ctx context.Context, u *url.URL, o kv.OpenOptions) (*kv.DB, error) {
	bucket := u.Host
	if bucket == "" {
		return nil, errors.New("s3kv: the URL names no bucket; use s3://BUCKET/PREFIX?endpoint=…&region=…")
	}
	var (
		endpoint, region string
		pathStyle        *bool
	)
	params, err := driverkit.Params(u, "endpoint", "region", "path_style")
	if err != nil {
		return nil, fmt.Errorf("s3kv: %w", err)
	}
	for name, v := range params {
		switch name {
		case "endpoint":
			e, err := url.Parse(v)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return nil, errors.New("s3kv: endpoint must be an http:// or https:// URL such as http://127.0.0.1:7070")
			}
			if e.User != nil {
				return nil, errors.New("s3kv: put credentials in the s3:// URL (s3://KEY:SECRET@BUCKET/…), not in the endpoint")
			}
			endpoint = v
		case "region":
			region = v
		case "path_style":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return nil, fmt.Errorf("s3kv: path_style=%q: want true or false", v)
			}
			pathStyle = &b
		}
	}
	// The SDK's buildable client, so AWS_CA_BUNDLE and the like still
	// apply; the transport it builds is kept for Close.
	conns := new(idleCloser)
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConns = 256
		tr.MaxIdleConnsPerHost = 64
		conns.add(tr)
	})
	loadOpts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(httpClient),
	}
	if region != "" {
		loadOpts = append(loadOpts, config.WithRegion(region))
	}
	if u.User != nil {
		secret, ok := u.User.Password()
		if !ok || u.User.Username() == "" {
			return nil, errors.New("s3kv: the URL has user information without a secret; use s3://ACCESS_KEY:SECRET_KEY@BUCKET/… or the AWS_* environment variables")
		}
		loadOpts = append(loadOpts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(u.User.Username(), secret, "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("s3kv: load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
			o.UsePathStyle = true
		}
		if pathStyle != nil {
			o.UsePathStyle = *pathStyle
		}
		// Checksums only where the API requires them: the body already
		// carries the SigV4 payload hash, and trailing checksums are not
		// supported by every S3-class server.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	s, err := NewStore(ctx, client, &Options{Bucket: bucket, Prefix: u.Path, Region: cfg.Region, ReadOnly: o.ReadOnly})
	if err != nil {
		conns.CloseIdleConnections()
		return nil, err
	}
	s.conns = conns
	return kv.New("s3", s)
}

// Client returns the S3 client, for benchmarks and operations the
// contract does not cover.
func (s *Store) Client() *s3.Client { return s.client }

// Bucket returns the bucket's name.
func (s *Store) Bucket() string { return s.bucket }

// Prefix returns the folder of the store's objects ("" or ending in '/').
func (s *Store) Prefix() string { return s.prefix }

// ObjectName returns the name of the object that holds key.
func (s *Store) ObjectName(key string) string {
	name, _ := s.object(key)
	return name
}

// KeyFormat returns the store's key format: 2, or 1 for a store written by
// an agentkit before key format 2 and not migrated (see MigrateKeyFormat).
func (s *Store) KeyFormat() int { return s.format }

// object returns the name of key's object and whether it is a bounded
// name (the key's own name would pass S3's 1,024-byte limit).
func (s *Store) object(key string) (string, bool) {
	enc := s.codec.encode(key)
	if s.format == 1 || len(enc) <= s.room {
		return s.prefix + enc, false
	}
	return s.prefix + longName(key, enc, s.room), true
}

// Close releases the HTTP connections of a store opened by kv.Open. A
// client passed to Open is left alone.
func (s *Store) Close() error {
	if s.conns != nil {
		s.conns.CloseIdleConnections()
	}
	return nil
}

// idleCloser remembers the transports the SDK builds for one client.
type idleCloser struct {
	mu  sync.Mutex
	trs []*http.Transport
}

func (c *idleCloser) add(tr *http.Transport) {
	c.mu.Lock()
	c.trs = append(c.trs, tr)
	c.mu.Unlock()
}

// CloseIdleConnections closes the idle connections of every transport.
func (c *idleCloser) CloseIdleConnections() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tr := range c.trs {
		tr.CloseIdleConnections()
	}
}

// httpStatus returns the HTTP status of a failed request, or 0.
func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// errCode returns the S3 error code, such as "NoSuchKey", or "".
func errCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// missingKey reports a 404 about the object (not about the bucket).
func missingKey(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nsk) || errors.As(err, &nf) {
		return true
	}
	return httpStatus(err) == http.StatusNotFound && errCode(err) != "NoSuchBucket"
}

// mapWriteErr maps the answers to a PutObject. For a conditional one, 412
// (the condition failed), 409 (a concurrent conditional write won) and 404
// (If-Match on a missing key) are conflicts. Transport errors stay
// themselves: the write may have landed.
func mapWriteErr(err error, conditional bool) error {
	switch st := httpStatus(err); {
	case conditional && (st == http.StatusPreconditionFailed || st == http.StatusConflict || missingKey(err)):
		return fmt.Errorf("%w: %w", kv.ErrConflict, err)
	case st == http.StatusRequestEntityTooLarge || errCode(err) == "EntityTooLarge":
		return fmt.Errorf("%w: %w", kv.ErrTooLarge, err)
	}
	return err
}

// normETag strips the quotes (and a weak marker) from an ETag.
func normETag(p *string) kv.Version {
	if p == nil {
		return ""
	}
	return kv.Version(strings.Trim(strings.TrimPrefix(*p, "W/"), `"`))
}

func md5hex(b []byte) kv.Version {
	sum := md5.Sum(b)
	return kv.Version(hex.EncodeToString(sum[:]))
}

// tombstone returns a fresh tombstone body.
func tombstone() ([]byte, error) {
	b := make([]byte, tombLen)
	copy(b, tombMagic)
	if _, err := rand.Read(b[len(tombMagic):]); err != nil {
		return nil, fmt.Errorf("s3kv: nonce: %w", err)
	}
	return b, nil
}

func isTombstone(b []byte) bool {
	return len(b) == tombLen && string(b[:len(tombMagic)]) == tombMagic
}

// body frames a value with the header and a fresh nonce; the body of a
// key stored under a bounded name carries the key too.
func body(key string, long bool, value []byte) ([]byte, error) {
	head := headerLen
	if long {
		head += 2 + len(key)
	}
	if len(value) > maxObject-head {
		return nil, fmt.Errorf("%w: %d bytes is over the %d-byte limit of one PutObject", kv.ErrTooLarge, len(value), maxObject-head)
	}
	b := make([]byte, head+len(value))
	copy(b, magic)
	if _, err := rand.Read(b[len(magic):headerLen]); err != nil {
		return nil, fmt.Errorf("s3kv: nonce: %w", err)
	}
	if long {
		copy(b, longMagic)
		binary.BigEndian.PutUint16(b[headerLen:], uint16(len(key)))
		copy(b[headerLen+2:], key)
	}
	copy(b[head:], value)
	return b, nil
}

// unframe returns the value in a body read from name, the object of key
// (long when it is a bounded name).
func (s *Store) unframe(name, key string, long bool, b []byte) ([]byte, error) {
	if !long {
		if len(b) < headerLen || string(b[:len(magic)]) != magic {
			return nil, fmt.Errorf("s3kv: object %q was not written by this driver (no %d-byte header); remove it or use another prefix", name, headerLen)
		}
		return b[headerLen:], nil
	}
	k, ok := longKeyOf(b)
	if !ok {
		return nil, fmt.Errorf("s3kv: object %q was not written by this driver (no header naming its key); remove it or use another prefix", name)
	}
	if k != key {
		return nil, fmt.Errorf("s3kv: object %q holds another key whose long name is the same (a hash collision); store one of the two keys under a shorter name", name)
	}
	return b[headerLen+2+len(k):], nil
}

// longKeyOf returns the key a bounded name's body carries.
func longKeyOf(b []byte) (string, bool) {
	if len(b) < headerLen+2 || string(b[:len(longMagic)]) != longMagic {
		return "", false
	}
	n := int(binary.BigEndian.Uint16(b[headerLen:]))
	if len(b) < headerLen+2+n {
		return "", false
	}
	return string(b[headerLen+2 : headerLen+2+n]), true
}

// noRetry makes a conditional write a single attempt: after a lost
// response, a retry would meet its own write and report a false conflict.
func noRetry(o *s3.Options) { o.RetryMaxAttempts = 1 }

// put writes key's object, conditionally when ifMatch or ifNoneMatch is
// set, and returns its version.
func (s *Store) put(ctx context.Context, key string, value []byte, ifMatch, ifNoneMatch *string) (kv.Version, error) {
	name, long := s.object(key)
	b, err := body(key, long, value)
	if err != nil {
		return "", err
	}
	return s.write(ctx, name, b, ifMatch, ifNoneMatch)
}

// write stores one object body as it is under name.
func (s *Store) write(ctx context.Context, name string, b []byte, ifMatch, ifNoneMatch *string) (kv.Version, error) {
	in := &s3.PutObjectInput{
		Bucket:        &s.bucket,
		Key:           aws.String(name),
		Body:          bytes.NewReader(b),
		ContentLength: aws.Int64(int64(len(b))),
		ContentType:   aws.String("application/octet-stream"),
		IfMatch:       ifMatch,
		IfNoneMatch:   ifNoneMatch,
	}
	conditional := ifMatch != nil || ifNoneMatch != nil
	var optFns []func(*s3.Options)
	if conditional {
		optFns = append(optFns, noRetry)
	}
	out, err := s.client.PutObject(ctx, in, optFns...)
	if err != nil {
		return "", mapWriteErr(err, conditional)
	}
	ver := normETag(out.ETag)
	if sum := md5hex(b); ver == sum {
		s.md5ETags.Store(true)
	} else if ver == "" && s.md5ETags.Load() {
		ver = sum
	}
	if ver == "" {
		return "", errors.New("s3kv: the server answered PutObject without an ETag, which conditional writes need")
	}
	return ver, nil
}

// Put creates or overwrites key.
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	_, err := s.put(ctx, key, value, nil, nil)
	return err
}

// Get returns the value of key, or an error matching kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := s.GetWithVersion(ctx, key)
	return v, err
}

// Delete replaces key's object with a tombstone; a missing key is not an
// error.
//
// DeleteObject is not used: servers such as versitygw remove the file
// without the lock their conditional writes take, so a delete racing a
// PutIfVersion could let the write land after the delete returned, and
// strip the new object's ETag. A tombstone is an ordinary PutObject, ordered
// with every other write. Tombstones stay behind, 12 bytes each.
func (s *Store) Delete(ctx context.Context, key string) error {
	b, err := tombstone()
	if err != nil {
		return err
	}
	_, err = s.write(ctx, s.ObjectName(key), b, nil, nil)
	return err
}

// GetWithVersion returns the value of key and its ETag.
//
// A server may read an object's ETag and its data in two steps, so an
// overwrite in between pairs the new data with the old ETag. When the
// server's ETags are MD5 sums of the body (it has answered one write or
// read with exactly that), the version is computed from the data read, so
// the pair is always consistent.
func (s *Store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	name, long := s.object(key)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(name)})
	if err != nil {
		if missingKey(err) {
			return nil, "", fmt.Errorf("%w: %w", kv.ErrNotFound, err)
		}
		return nil, "", err
	}
	b, ver, err := s.read(out)
	if err != nil {
		return nil, "", err
	}
	if isTombstone(b) {
		return nil, "", kv.ErrNotFound
	}
	v, err := s.unframe(name, key, long, b)
	if err != nil {
		return nil, "", err
	}
	return v, ver, nil
}

// read reads a GetObject answer's body and the version that goes with it.
func (s *Store) read(out *s3.GetObjectOutput) ([]byte, kv.Version, error) {
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, "", fmt.Errorf("s3kv: read the object: %w", err)
	}
	ver := normETag(out.ETag)
	sum := md5hex(b)
	switch {
	case ver == sum:
		s.md5ETags.Store(true)
	case s.md5ETags.Load():
		ver = sum
	}
	if ver == "" {
		return nil, "", errors.New("s3kv: the server answered GetObject without an ETag, which conditional writes need")
	}
	return b, ver, nil
}

// PutIfAbsent writes key only if no object holds it (If-None-Match: *) or
// a tombstone does (If-Match: the tombstone's ETag, retried while deletes
// keep replacing the tombstone). A conflict is reported only when a value
// is present.
func (s *Store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	name, long := s.object(key)
	b, err := body(key, long, value)
	if err != nil {
		return "", err
	}
	ifNoneMatch, ifMatch := aws.String("*"), (*string)(nil)
	for attempt := 0; ; attempt++ {
		ver, err := s.write(ctx, name, b, ifMatch, ifNoneMatch)
		if !errors.Is(err, kv.ErrConflict) {
			return ver, err
		}
		// Lost: to a value, or to a tombstone (or its removal)?
		st, tomb, err2 := s.probe(ctx, name)
		switch {
		case err2 != nil:
			return "", err2
		case st == holdsValue:
			return "", err
		case st == holdsNothing:
			ifNoneMatch, ifMatch = aws.String("*"), nil
		default:
			ifNoneMatch, ifMatch = nil, aws.String(`"`+string(tomb)+`"`)
		}
		if attempt == maxCreateAttempts {
			return "", fmt.Errorf("s3kv: create lost %d races with concurrent deletes of the key; try again", attempt+1)
		}
	}
}

// maxCreateAttempts bounds PutIfAbsent's retries under concurrent deletes.
const maxCreateAttempts = 100

// What an object name holds.
const (
	holdsNothing = iota
	holdsValue
	holdsTombstone
)

// probe reads what the object name holds, and a tombstone's version.
func (s *Store) probe(ctx context.Context, name string) (int, kv.Version, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(name)})
	if err != nil {
		if missingKey(err) {
			return holdsNothing, "", nil
		}
		return 0, "", err
	}
	if aws.ToInt64(out.ContentLength) >= int64(headerLen) {
		out.Body.Close() // a value: no need to read it
		return holdsValue, "", nil
	}
	b, ver, err := s.read(out)
	switch {
	case err != nil:
		return 0, "", err
	case isTombstone(b):
		return holdsTombstone, ver, nil
	}
	return holdsValue, "", nil
}

// PutIfVersion writes key only if its ETag is expected (If-Match).
func (s *Store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if !plausibleETag(expected) {
		return "", fmt.Errorf("%w: %q is not a version this driver issues", kv.ErrConflict, expected)
	}
	return s.put(ctx, key, value, aws.String(`"`+string(expected)+`"`), nil)
}

// plausibleETag keeps tokens that cannot be ETags (quotes, control bytes,
// '*' which would mean "any version") out of the If-Match header.
func plausibleETag(v kv.Version) bool {
	if v == "" || len(v) > 200 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; !driverkit.AlphaNum(c) {
			return false
		}
	}
	return true
}

// keys lists the keys under prefix, decoded and sorted: a paginated
// ListObjectsV2 over the longest object-name prefix every such key's
// object shares, then a filter on the decoded keys. Bounded names (keys
// whose own name is too long) share that prefix too; their keys are read
// from their objects' headers and merged in.
func (s *Store) keys(ctx context.Context, prefix string) ([]string, error) {
	lp := s.codec.listPrefix(prefix)
	if s.format != 1 {
		// A bounded name keeps at least this much of the key's name.
		lp = lp[:cutAt(lp, s.room-longTail-3)]
	}
	p := s.prefix + lp
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &p, EncodingType: types.EncodingTypeUrl})
	var out, long []string
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("s3kv: list objects: %w", err)
		}
		for _, o := range page.Contents {
			if o.Key == nil || aws.ToInt64(o.Size) < int64(headerLen) {
				continue // a tombstone
			}
			full := *o.Key
			if page.EncodingType == types.EncodingTypeUrl {
				// Servers that honour encoding-type=url (MinIO, AWS)
				// escape names so any character survives the XML.
				if full, err = url.QueryUnescape(full); err != nil {
					continue
				}
			}
			name, ok := strings.CutPrefix(full, s.prefix)
			if !ok {
				continue
			}
			if k, ok := s.codec.decode(name); ok {
				if strings.HasPrefix(k, prefix) {
					out = append(out, k)
				}
			} else if s.format != 1 && isLongName(name) {
				long = append(long, full)
			}
		}
	}
	for _, name := range long {
		k, err := s.longKey(ctx, name)
		if err != nil {
			return nil, err
		}
		if k != "" && strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// keysAfter is keys without those at or before after.
func (s *Store) keysAfter(ctx context.Context, prefix, after string) ([]string, error) {
	keys, err := s.keys(ctx, prefix)
	if err != nil || after < prefix {
		return keys, err
	}
	i, found := slices.BinarySearch(keys, after)
	if found {
		i++
	}
	return keys[i:], nil
}

// longKey reads the key a bounded name's object carries, with a ranged
// GetObject of its header; "" for an object that is gone, a tombstone, or
// not one this driver wrote under that name.
func (s *Store) longKey(ctx context.Context, name string) (string, error) {
	rng := fmt.Sprintf("bytes=0-%d", headerLen+2+kv.MaxKeyLength-1)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &name, Range: &rng})
	if err != nil {
		if missingKey(err) {
			return "", nil
		}
		return "", fmt.Errorf("s3kv: read the key of a long-named object: %w", err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		return "", fmt.Errorf("s3kv: read the key of a long-named object: %w", err)
	}
	k, ok := longKeyOf(b)
	if !ok {
		return "", nil
	}
	if own, _ := s.object(k); own != name {
		return "", nil
	}
	return k, nil
}

// ListKeys yields the keys under prefix in ascending order. The listing is
// sorted in memory, since object names do not keep key order.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter is ListKeys without the keys at or before after. Object
// names do not keep key order, so the prefix's names are all listed; the
// long-named objects' keys are read as for ListKeys.
func (s *Store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		keys, err := s.keysAfter(ctx, prefix, after)
		if err != nil {
			yield("", err)
			return
		}
		for _, k := range keys {
			if !yield(k, nil) {
				return
			}
		}
	}
}

// List yields the entries under prefix in ascending key order: ListKeys,
// then the values, listWindow reads at a time, yielded in order. A key
// deleted after it was listed is skipped.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter is List without the keys at or before after: the names are
// listed as for ListKeysAfter, and only the values after the point are
// read, so paging through n keys reads each value once.
func (s *Store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		keys, err := s.keysAfter(ctx, prefix, after)
		if err != nil {
			yield(kv.Entry{}, err)
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			value []byte
			err   error
		}
		queue := make([]chan result, 0, listWindow)
		next := 0
		fetch := func() {
			key := keys[next]
			ch := make(chan result, 1)
			go func() {
				v, _, err := s.GetWithVersion(ctx, key)
				ch <- result{v, err}
			}()
			queue = append(queue, ch)
			next++
		}
		for next < len(keys) && len(queue) < listWindow {
			fetch()
		}
		for _, key := range keys {
			r := <-queue[0]
			queue = queue[1:]
			if next < len(keys) {
				fetch()
			}
			if errors.Is(r.err, kv.ErrNotFound) {
				continue
			}
			if r.err != nil {
				yield(kv.Entry{}, r.err)
				return
			}
			if !yield(kv.Entry{Key: key, Value: r.value}, nil) {
				return
			}
		}
	}
}
