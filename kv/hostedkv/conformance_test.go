package hostedkv_test

import (
	"path/filepath"
	"testing"

	"agentkit/kv"
	"agentkit/kv/hostedkv"
	"agentkit/kv/kvtest"
)

// harness runs every check through one storaged process: a fresh namespace
// (and credential) per test, and a client with its own connections per
// Opener call, so the cross-client checks race two independent clients.
func harness(svc *service) kvtest.Harness {
	return kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener {
			ns, token := svc.namespace(t)
			return func(t testing.TB) *kv.DB { return svc.open(t, ns, token, nil) }
		},
		Shared: true,
	}
}

func TestConformancePostgres(t *testing.T) {
	svc := startService(t, pgBackend(t, true))
	kvtest.Run(t, harness(svc))
}

func TestConformanceSQLite(t *testing.T) {
	svc := startService(t, "sqlite:"+filepath.Join(t.TempDir(), "hosted.db")+"?synchronous=normal")
	kvtest.Run(t, harness(svc))
}

// The generic backend: storaged over kv drivers other than SQL, on a real
// Redis and on the memory driver. (A file: backend passes too, but takes
// 40 s under -race: filekv syncs every envelope.)

func TestConformanceRedis(t *testing.T) {
	svc := startService(t, redisBackend(t))
	kvtest.Run(t, harness(svc))
}

func TestConformanceMem(t *testing.T) {
	svc := startService(t, "mem://")
	kvtest.Run(t, harness(svc))
}

// TestConformanceNATS runs the suite on NATS JetStream, whose values are
// limited to the server's max_payload less a reserve: the service lowers
// its own limit to that and says so in info, and values over 256 KiB go
// to keys of their own, so the envelope adds nothing to the limit.
func TestConformanceNATS(t *testing.T) {
	svc := startService(t, natsBackend(t))
	h := harness(svc)
	ns, tok := svc.namespace(t)
	db := svc.open(t, ns, tok, nil)
	h.MaxValueSize = db.Backend().(*hostedkv.Store).MaxValueSize()
	db.Close()
	if h.MaxValueSize < 1<<20-4<<10 || h.MaxValueSize > 1<<20 {
		t.Fatalf("the service's value limit over NATS is %d, want the driver's (about 1 MiB)", h.MaxValueSize)
	}
	kvtest.Run(t, h)
}
