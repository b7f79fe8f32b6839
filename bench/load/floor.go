package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// floorRecord is what each floor writer writes: about one event's JSON.
const floorRecord = 400

// diskFloor is the floor of the server's tail latency: n writers, each
// writing floorRecord bytes at the start of a preallocated file of its
// own in dir and fsyncing it, as fast as they can for d. Their latencies
// are the disk's own under that many concurrent durable writes, on the
// disk of the server's state root, measured between the levels so that
// drift hits both alike. A turn's events are on disk (fsynced) before it
// answers, so no turn can be steadier than this.
func diskFloor(ctx context.Context, dir string, n int, d time.Duration) (*level, error) {
	l := &level{clients: n}
	files := make([]*os.File, n)
	for i := range files {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("floor-%02d.bin", i)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			return nil, err
		}
		if err := f.Sync(); err != nil {
			return nil, err
		}
		files[i] = f
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	rec := make([]byte, floorRecord)
	start := time.Now()
	deadline := start.Add(d)
	for _, f := range files {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				_, err := f.WriteAt(rec, 0)
				if err == nil {
					err = f.Sync()
				}
				if err != nil {
					mu.Lock()
					l.errors++
					if l.firstErr == nil {
						l.firstErr = err
					}
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			l.latencies = append(l.latencies, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	l.elapsed += time.Since(start)
	return l, nil
}
