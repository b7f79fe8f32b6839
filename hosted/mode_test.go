package hosted

import (
	"context"
	"path/filepath"
	"testing"

	"agentkit/internal/privfile/privfiletest"
)

// The SQLite backend holds every deployment's data and the credentials
// files the tokens' hashes and the server key: all of them are owner-only
// when the service makes them, -wal and -shm included, and a service
// started on files an older version left world-readable tightens them.
func TestServiceFilesAreOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	ts := newTestService(t, Options{}, "alpha")
	ts.put(t, "alpha", "k", "a transcript")
	dir := filepath.Dir(ts.creds)
	privfiletest.CheckOwnerOnly(t, dir, "hosted.db", "hosted.db-wal", "hosted.db-shm", "creds.json", "creds.json.key")

	// Files left wide while the first service still has the database open
	// (so -wal and -shm exist): a second service tightens them.
	privfiletest.Loosen(t, dir, true)
	svc, err := Open(context.Background(), Options{Backend: "sqlite:" + filepath.Join(dir, "hosted.db"), Credentials: ts.creds})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	privfiletest.CheckOwnerOnly(t, dir, "hosted.db", "hosted.db-wal", "hosted.db-shm", "creds.json", "creds.json.key")
}
