package natskv_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// runServer starts an in-process NATS server (nats-server v2.15) with
// JetStream, requiring the user and password when they are not empty, and
// returns its URL. The shared test server is the packaged 2.9 without
// authentication; this one checks credentials and the current release.
func runServer(t testing.TB, user, password string) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		Username:  user,
		Password:  password,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the in-process NATS server did not start")
	}
	return srv.ClientURL()
}
