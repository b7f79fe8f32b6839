package kv_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"agentkit/kv"
	_ "agentkit/kv/memkv" // registers the mem:// scheme
)

func ExampleOpen() {
	ctx := context.Background()
	db, err := kv.Open(ctx, "mem://")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	if err := db.Put(ctx, "agentkit/v1/demo/greeting", []byte("hello")); err != nil {
		fmt.Println(err)
		return
	}
	v, err := db.Get(ctx, "agentkit/v1/demo/greeting")
	fmt.Printf("%s %v\n", v, err)

	_, err = db.Get(ctx, "agentkit/v1/demo/missing")
	fmt.Println(errors.Is(err, kv.ErrNotFound))
	fmt.Println(err)
	// Output:
	// hello <nil>
	// true
	// mem: get "agentkit/v1/demo/missing": kv: key not found
}

func ExampleFuncs() {
	// An existing client, here a map behind a mutex, adapted in a few
	// lines. Fields left nil are reported as missing capabilities.
	var (
		mu   sync.Mutex
		data = map[string][]byte{}
	)
	backend := kv.Funcs{
		Put: func(_ context.Context, key string, value []byte) error {
			mu.Lock()
			defer mu.Unlock()
			data[key] = append([]byte(nil), value...)
			return nil
		},
		Get: func(_ context.Context, key string) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			v, ok := data[key]
			if !ok {
				return nil, kv.ErrNotFound
			}
			return append([]byte(nil), v...), nil
		},
	}
	db, err := kv.New("mapdb", backend)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	_ = db.Put(ctx, "k", []byte("v"))
	v, _ := db.Get(ctx, "k")
	fmt.Println(string(v), db.Capabilities())

	err = db.Delete(ctx, "k")
	fmt.Println(errors.Is(err, errors.ErrUnsupported))
	// Output:
	// v put,get
	// true
}

func ExampleDB_PutIfVersion() {
	ctx := context.Background()
	db, err := kv.Open(ctx, "mem://")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	// increment adds one to a counter with a compare-and-set loop: read the
	// value and its version, write only if nobody wrote in between, and
	// retry on a conflict.
	increment := func(key string) error {
		for {
			v, ver, err := db.GetWithVersion(ctx, key)
			if errors.Is(err, kv.ErrNotFound) {
				_, err = db.PutIfAbsent(ctx, key, []byte("1"))
				if errors.Is(err, kv.ErrConflict) {
					continue // another writer created it first
				}
				return err
			}
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(string(v))
			if err != nil {
				return err
			}
			_, err = db.PutIfVersion(ctx, key, []byte(strconv.Itoa(n+1)), ver)
			if errors.Is(err, kv.ErrConflict) {
				continue // lost the race: read again
			}
			return err
		}
	}

	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if err := increment("visits"); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	v, _ := db.Get(ctx, "visits")
	fmt.Println(string(v))
	// Output:
	// 10
}
