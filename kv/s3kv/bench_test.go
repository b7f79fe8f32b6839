package s3kv_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"agentkit/kv/kvtest"
	"agentkit/kv/s3kv"
)

// BenchmarkS3 runs the shared benchmarks paired with the SDK client alone
// doing the same work on the same server, client settings and payloads
// (kvtest.RunPaired: one loop alternates a driver operation and a raw one
// and reports driver-ns/op, raw-ns/op and driver/raw), on versitygw. The
// raw listing is the best the SDK offers: ListObjectsV2 of the prefix, then
// the objects' GETs with 16 in flight, as the driver does (a raw listing
// that fetched one object at a time was 1.7–2× slower).
//
//	eval "$(scripts/versitygw.sh start)"
//	go test -run '^$' -bench S3 -count 10 -timeout 60m ./kv/s3kv/ > s3.txt && benchstat s3.txt
func BenchmarkS3(b *testing.B) {
	kvtest.RunPaired(b, harness(baseURL(b)), rawS3())
}

// rawStore opens a fresh namespace through the driver (so the client and
// bucket are set up alike) and returns its client, bucket and prefix.
func rawStore(b *testing.B) (*s3.Client, *string, string) {
	db := namespace(b)(b)
	b.Cleanup(func() { db.Close() })
	st := db.Backend().(*s3kv.Store)
	return st.Client(), aws.String(st.Bucket()), st.Prefix()
}

func rawS3() kvtest.Raw {
	ctx := context.Background()
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	const keys = 1000
	put := func(c *s3.Client, bucket, key *string, ifMatch *string) (*string, error) {
		out, err := c.PutObject(ctx, &s3.PutObjectInput{
			Bucket: bucket, Key: key, Body: bytes.NewReader(value),
			ContentLength: aws.Int64(int64(len(value))), ContentType: aws.String("application/octet-stream"),
			IfMatch: ifMatch,
		})
		if err != nil {
			return nil, err
		}
		return out.ETag, nil
	}
	get := func(c *s3.Client, bucket, key *string) error {
		out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: key})
		if err != nil {
			return err
		}
		defer out.Body.Close()
		_, err = io.Copy(io.Discard, out.Body)
		return err
	}
	name := func(prefix string, i int) *string { return aws.String(prefix + kvtest.BenchKey(i)) }
	fill := func(b *testing.B, c *s3.Client, bucket *string, prefix string, n int) {
		for i := range n {
			if _, err := put(c, bucket, name(prefix, i), nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	return kvtest.Raw{
		Put: func(b *testing.B) func(int) error {
			c, bucket, prefix := rawStore(b)
			return func(i int) error {
				_, err := put(c, bucket, name(prefix, i%keys), nil)
				return err
			}
		},
		Get: func(b *testing.B) func(int) error {
			c, bucket, prefix := rawStore(b)
			fill(b, c, bucket, prefix, keys)
			return func(i int) error { return get(c, bucket, name(prefix, i%keys)) }
		},
		PutIfVersion: func(b *testing.B) func(int) error {
			c, bucket, prefix := rawStore(b)
			etag, err := put(c, bucket, name(prefix, 0), nil)
			if err != nil {
				b.Fatal(err)
			}
			return func(int) (err error) {
				etag, err = put(c, bucket, name(prefix, 0), etag)
				return err
			}
		},
		List1000: func(b *testing.B) func(int) error {
			c, bucket, prefix := rawStore(b)
			fill(b, c, bucket, prefix, kvtest.BenchListSize)
			if _, err := put(c, bucket, aws.String(prefix+"agentkit/v1/other/x"), nil); err != nil {
				b.Fatal(err)
			}
			listPrefix := aws.String(prefix + kvtest.BenchListPrefix)
			return func(int) error {
				var names []*string
				pages := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: bucket, Prefix: listPrefix})
				for pages.HasMorePages() {
					page, err := pages.NextPage(ctx)
					if err != nil {
						return err
					}
					for _, o := range page.Contents {
						names = append(names, o.Key)
					}
				}
				if len(names) != kvtest.BenchListSize {
					return fmt.Errorf("listed %d objects, want %d", len(names), kvtest.BenchListSize)
				}
				var (
					wg    sync.WaitGroup
					mu    sync.Mutex
					first error
					slots = make(chan struct{}, 16)
				)
				for _, n := range names {
					slots <- struct{}{}
					wg.Go(func() {
						defer func() { <-slots }()
						if err := get(c, bucket, n); err != nil {
							mu.Lock()
							first = err
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				return first
			}
		},
	}
}
