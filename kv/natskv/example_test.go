package natskv_test

import (
	"context"
	"fmt"
	"log"

	"agentkit/kv"
	_ "agentkit/kv/natskv"
)

// Open a store on a JetStream bucket (created when missing) and update a
// key with compare-and-set.
func Example() {
	ctx := context.Background()
	db, err := kv.Open(ctx, "nats://127.0.0.1:4222?bucket=agentkit")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ver, err := db.PutIfAbsent(ctx, "agentkit/v1/bot/counter", []byte("1"))
	if err != nil {
		log.Fatal(err) // kv.ErrConflict when the key exists
	}
	ver, err = db.PutIfVersion(ctx, "agentkit/v1/bot/counter", []byte("2"), ver)
	fmt.Println(ver != "", err)
}
