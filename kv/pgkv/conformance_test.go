package pgkv

import (
	"context"
	"testing"

	"agentkit/kv"
	"agentkit/kv/kvtest"
)

// harness makes a fresh table per test. With fast set, its clients commit
// without waiting for the WAL flush (synchronous_commit=off), which the
// suite cannot tell apart except in speed: no test crashes the server.
// Benchmarks use the server's own setting.
func harness(fast bool) kvtest.Harness {
	return kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener {
			table := newTable(t)
			return func(t testing.TB) *kv.DB {
				conn := server(t)
				if fast {
					conn = fastServer(t)
				}
				db, err := Open(context.Background(), conn, &Options{Table: table})
				if err != nil {
					t.Fatalf("Open table %s: %v", table, err)
				}
				return db
			}
		},
		Shared: true,
	}
}

func TestConformance(t *testing.T) {
	server(t)
	kvtest.Run(t, harness(true))
}
