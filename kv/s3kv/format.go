package s3kv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"agentkit/kv"
)

// The key format marker: one object under the prefix, named so that no key
// maps to it ('!' followed by a lower-case letter is never an escape),
// holding "agentkit s3kv key format N". A prefix without it that already
// holds objects of format 1 (written before the marker existed) is a format
// 1 store; any other prefix becomes format 2 on its first open.
const (
	formatName   = "!format"
	formatPrefix = "agentkit s3kv key format "
	formatLatest = 2
)

// setFormat selects the key mapping.
func (s *Store) setFormat(f int) {
	s.format = f
	s.codec = codecV2
	if f == 1 {
		s.codec = codecV1
	}
}

// loadFormat reads the store's key format from its marker. Without one,
// a prefix holding format 1 objects is format 1 and any other is format 2;
// the marker is then written (If-None-Match: *, so racing openers agree),
// unless readOnly.
func (s *Store) loadFormat(ctx context.Context, readOnly bool) error {
	for attempt := 0; attempt < 3; attempt++ {
		f, err := s.readFormat(ctx)
		if err != nil {
			return err
		}
		if f != 0 {
			s.setFormat(f)
			return nil
		}
		legacy, err := s.holdsFormat1(ctx)
		if err != nil {
			return err
		}
		f = formatLatest
		if legacy {
			f = 1
		}
		s.setFormat(f)
		if readOnly {
			return nil
		}
		_, err = s.write(ctx, s.prefix+formatName, []byte(formatPrefix+strconv.Itoa(f)+"\n"), nil, aws.String("*"))
		if !errors.Is(err, kv.ErrConflict) {
			if err != nil {
				return fmt.Errorf("s3kv: write the key format marker %s: %w", s.prefix+formatName, err)
			}
			return nil
		}
		// Another client wrote it first: read what it decided.
	}
	return fmt.Errorf("s3kv: the key format marker %s keeps changing; is another program writing it?", s.prefix+formatName)
}

// readFormat returns the format the marker names, or 0 without a marker.
func (s *Store) readFormat(ctx context.Context) (int, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: aws.String(s.prefix + formatName)})
	if err != nil {
		if missingKey(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("s3kv: read the key format marker: %w", err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(io.LimitReader(out.Body, 256))
	if err != nil {
		return 0, fmt.Errorf("s3kv: read the key format marker: %w", err)
	}
	line := strings.TrimSpace(string(b))
	n, err := strconv.Atoi(strings.TrimPrefix(line, formatPrefix))
	switch {
	case !strings.HasPrefix(line, formatPrefix) || err != nil || n < 1:
		return 0, fmt.Errorf("s3kv: %s is not a key format marker of this driver (it reads %q); is the prefix another program's?", s.prefix+formatName, line)
	case n > formatLatest:
		return 0, fmt.Errorf("s3kv: the store under %q was written by a newer agentkit (key format %d; this build reads formats 1 and %d); upgrade agentkit", s.prefix, n, formatLatest)
	}
	return n, nil
}

// holdsFormat1 reports whether the prefix holds an object whose name is a
// key's name in format 1.
func (s *Store) holdsFormat1(ctx context.Context) (bool, error) {
	found := false
	err := s.eachObject(ctx, func(name string, _ int64) bool {
		_, found = codecV1.decode(name)
		return !found
	})
	return found, err
}

// eachObject calls fn with the name (relative to the prefix) and size of
// every object under the prefix, until fn returns false.
func (s *Store) eachObject(ctx context.Context, fn func(name string, size int64) bool) error {
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: &s.bucket, Prefix: &s.prefix})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("s3kv: list objects: %w", err)
		}
		for _, o := range page.Contents {
			name, ok := strings.CutPrefix(aws.ToString(o.Key), s.prefix)
			if ok && !fn(name, aws.ToInt64(o.Size)) {
				return nil
			}
		}
	}
	return nil
}

// MigrateKeyFormat moves a store of key format 1 (written by an agentkit
// before format 2) to format 2: every key's object is copied to its format
// 2 name (a server-side copy: the value and its version are kept, except
// for keys whose name needs the bounded form, which are rewritten and get
// a new version), the format 1 object and the tombstones are removed, and
// the marker is set to 2. It returns how many keys moved.
//
// Run it while no other client uses the store: a client still on format 1
// would not see the moved keys. It can be run again after an interruption;
// on a store already at format 2 it does nothing.
func (s *Store) MigrateKeyFormat(ctx context.Context) (int, error) {
	if s.format != 1 {
		return 0, nil
	}
	type object struct {
		name string
		size int64
	}
	var objs []object
	if err := s.eachObject(ctx, func(name string, size int64) bool {
		objs = append(objs, object{name, size})
		return true
	}); err != nil {
		return 0, err
	}
	moved := 0
	for _, o := range objs {
		key, ok := codecV1.decode(o.name)
		if !ok {
			continue // foreign, or already moved under a name format 1 cannot read
		}
		to, long := s.objectIn(2, key)
		from := s.prefix + o.name
		if to == from {
			continue
		}
		if o.size >= int64(headerLen) {
			if err := s.move(ctx, key, from, to, long); err != nil {
				return moved, err
			}
			moved++
		}
		if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &from}); err != nil && !missingKey(err) {
			return moved, fmt.Errorf("s3kv: migrate %q: remove the format 1 object: %w", key, err)
		}
	}
	marker := s.prefix + formatName
	if _, err := s.client.PutObject(ctx, &s3.PutObjectInput{Bucket: &s.bucket, Key: &marker, Body: strings.NewReader(formatPrefix + "2\n")}); err != nil {
		return moved, fmt.Errorf("s3kv: migrate: write the key format marker: %w", err)
	}
	s.setFormat(2)
	return moved, nil
}

// objectIn is object for a given format.
func (s *Store) objectIn(format int, key string) (string, bool) {
	saved, savedCodec := s.format, s.codec
	s.setFormat(format)
	name, long := s.object(key)
	s.format, s.codec = saved, savedCodec
	return name, long
}

// move copies key's format 1 object to its format 2 name.
func (s *Store) move(ctx context.Context, key, from, to string, long bool) error {
	if !long {
		src := s.bucket + "/" + urlPathEscape(from)
		_, err := s.client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &s.bucket, Key: &to, CopySource: &src, MetadataDirective: types.MetadataDirectiveCopy})
		if err != nil {
			return fmt.Errorf("s3kv: migrate %q: copy to its new name: %w", key, err)
		}
		return nil
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &from})
	if err != nil {
		return fmt.Errorf("s3kv: migrate %q: read: %w", key, err)
	}
	b, err := io.ReadAll(out.Body)
	out.Body.Close()
	if err != nil || len(b) < headerLen {
		return fmt.Errorf("s3kv: migrate %q: read: %v", key, err)
	}
	nb, err := body(key, true, b[headerLen:])
	if err != nil {
		return err
	}
	if _, err := s.write(ctx, to, nb, nil, nil); err != nil {
		return fmt.Errorf("s3kv: migrate %q: write: %w", key, err)
	}
	return nil
}

// urlPathEscape escapes an object name for CopySource, keeping '/'.
func urlPathEscape(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '/' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}
