package s3kv_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"agentkit/kv/kvtest"
	"agentkit/kv/s3kv"
)

// BenchmarkS3 runs the shared benchmarks through the driver
// (impl=driver) and the same operations through the raw SDK client
// (impl=raw), with the same client settings, server and payloads, so
//
//	go test -run '^$' -bench S3 -count 6 ./kv/s3kv/ | tee s3.txt
//	benchstat -col /impl s3.txt
//
// shows the driver's overhead as a ratio.
func BenchmarkS3(b *testing.B) {
	b.Run("impl=driver", func(b *testing.B) {
		kvtest.RunBenchmarks(b, harness(baseURL(b)))
	})
	b.Run("impl=raw", benchRaw)
}

func benchRaw(b *testing.B) {
	db := namespace(b)(b)
	defer db.Close()
	st := db.Backend().(*s3kv.Store)
	client, bucket := st.Client(), aws.String(st.Bucket())
	ctx := context.Background()
	value := kvtest.BenchValue(kvtest.BenchValueSize)
	name := func(dir string, i int) *string { return aws.String(st.Prefix() + dir + "/" + kvtest.BenchKey(i)) }
	put := func(key *string, ifMatch *string) *string {
		out, err := client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: bucket, Key: key, Body: bytes.NewReader(value),
			ContentLength: aws.Int64(int64(len(value))), ContentType: aws.String("application/octet-stream"),
			IfMatch: ifMatch,
		})
		if err != nil {
			b.Fatal(err)
		}
		return out.ETag
	}
	get := func(key *string) {
		out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: key})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, out.Body); err != nil {
			b.Fatal(err)
		}
		out.Body.Close()
	}
	const keys = 1000

	b.Run("Put", func(b *testing.B) {
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			put(name("put", i%keys), nil)
			i++
		}
	})
	b.Run("Get", func(b *testing.B) {
		for i := range keys {
			put(name("get", i), nil)
		}
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			get(name("get", i%keys))
			i++
		}
	})
	b.Run("PutIfVersion", func(b *testing.B) {
		etag := put(name("cas", 0), nil)
		b.SetBytes(kvtest.BenchValueSize)
		b.ReportAllocs()
		for b.Loop() {
			etag = put(name("cas", 0), etag)
		}
	})
	b.Run("List1000", func(b *testing.B) {
		for i := range kvtest.BenchListSize {
			put(name("list", i), nil)
		}
		put(aws.String(st.Prefix()+"list/agentkit/v1/other/x"), nil)
		prefix := aws.String(st.Prefix() + "list/agentkit/v1/bench/")
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			pages := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: bucket, Prefix: prefix})
			for pages.HasMorePages() {
				page, err := pages.NextPage(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for _, o := range page.Contents {
					if strings.HasSuffix(*o.Key, "/") {
						continue
					}
					get(o.Key)
					n++
				}
			}
			if n != kvtest.BenchListSize {
				b.Fatalf("listed %d objects, want %d", n, kvtest.BenchListSize)
			}
		}
	})
}
