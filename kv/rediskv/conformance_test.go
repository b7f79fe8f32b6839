package rediskv

import (
	"context"
	"testing"

	"agentkit/kv"
	"agentkit/kv/kvtest"
)

func harness() kvtest.Harness {
	return kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener {
			prefix := newPrefix(t)
			return func(t testing.TB) *kv.DB {
				db, err := Open(context.Background(), server(t), &Options{Prefix: prefix})
				if err != nil {
					t.Fatalf("Open prefix %s: %v", prefix, err)
				}
				return db
			}
		},
		Shared: true,
	}
}

func TestConformance(t *testing.T) {
	server(t)
	kvtest.Run(t, harness())
}
