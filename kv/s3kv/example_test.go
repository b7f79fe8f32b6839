package s3kv_test

import (
	"context"
	"fmt"
	"log"

	"agentkit/kv"
	_ "agentkit/kv/s3kv"
)

// Open a store under a prefix of a bucket (created when missing) on an
// S3-compatible server, and list what it holds.
func Example() {
	ctx := context.Background()
	db, err := kv.Open(ctx, "s3://KEY:SECRET@agentkit-state/prod/?endpoint=http://127.0.0.1:7070&region=us-east-1")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	if err := db.Put(ctx, "agentkit/v1/bot/sessions/s1/meta", []byte(`{"v":1}`)); err != nil {
		log.Fatal(err)
	}
	for key, err := range db.ListKeys(ctx, "agentkit/v1/bot/sessions/") {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(key)
	}
}
