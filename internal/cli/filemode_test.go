package cli_test

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"agentkit/internal/privfile/privfiletest"
	"agentkit/kv"
)

// These tests set the umask to 022 for the agentkit processes they start,
// so they do not run in parallel.

// agentkit kv on sqlite:PATH creates the database owner-only, and makes an
// existing world-readable one owner-only with its -wal and -shm files
// (kept here by this test holding the database open), whether the command
// writes (put, rm) or only reads (ls, get); and so for the state root's
// embedded store without --storage. A folder that exists is the user's and
// keeps its mode.
func TestKVSQLiteFilesAreOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	ctx := context.Background()
	dir := t.TempDir()
	storage := "sqlite:" + filepath.Join(dir, "new", "kv.db")
	if r := run(t, dir, nil, "", "kv", "put", "--storage", storage, "sessions/s1", "a transcript"); r.code != 0 {
		t.Fatalf("kv put: exit %d, %s", r.code, r.stderr)
	}
	privfiletest.CheckOwnerOnly(t, dir, "new", "new/kv.db")

	holder, err := kv.Open(ctx, storage)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := holder.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"put", "k2", "v2"}, {"ls"}, {"get", "k"}, {"rm", "k2"}} {
		privfiletest.Loosen(t, dir, false)
		if r := run(t, dir, nil, "", append([]string{"kv", args[0], "--storage", storage}, args[1:]...)...); r.code != 0 {
			t.Fatalf("kv %v: exit %d, %s", args, r.code, r.stderr)
		}
		privfiletest.CheckOwnerOnly(t, dir, "new", "new/kv.db", "new/kv.db-wal", "new/kv.db-shm")
	}

	root := filepath.Join(dir, "root")
	if r := run(t, dir, nil, "", "kv", "put", "--state-root", root, "k", "v"); r.code != 0 {
		t.Fatalf("kv put on the state root: exit %d, %s", r.code, r.stderr)
	}
	privfiletest.CheckOwnerOnly(t, dir, "root", "root/sessions", "root/sessions/sessions.db")
}

// agentkit storaged on its SQLite backend: the database with its -wal and
// -shm files while it serves, the credentials file and the server key are
// owner-only; started again on the same files made world-readable, it
// tightens them all (the folder, which it only created, is left alone).
func TestStoragedSQLiteFilesAreOwnerOnly(t *testing.T) {
	privfiletest.CommonUmask(t)
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	add := run(t, dir, nil, "", "storaged", "credentials", "add", "acme", "--credentials", creds)
	if add.code != 0 {
		t.Fatalf("credentials add: exit %d, %s", add.code, add.stderr)
	}
	token := strings.TrimSpace(add.stdout)
	args := []string{"storaged", "--backend", "sqlite:" + filepath.Join(dir, "data", "hosted.db"), "--credentials", creds, "--addr", "127.0.0.1:0"}
	want := []string{"data", "data/hosted.db", "data/hosted.db-wal", "data/hosted.db-shm", "creds.json", "creds.json.key", "creds.json.lock"}
	for round := range 2 {
		sd := startServing(t, agentkitBin, dir, nil, args...)
		storage := "agentkit+http://" + token + "@" + strings.TrimPrefix(sd.url, "http://") + "/acme"
		if r := run(t, dir, nil, "", "kv", "put", "--storage", storage, "sessions/s1", "a transcript"); r.code != 0 {
			t.Fatalf("round %d: kv put through storaged: exit %d, %s", round, r.code, r.stderr)
		}
		privfiletest.CheckOwnerOnly(t, dir, want...)
		if code := sd.stop(syscall.SIGTERM); code != 0 {
			t.Fatalf("round %d: storaged exited %d", round, code)
		}
		privfiletest.Loosen(t, dir, false) // the -wal and -shm went with the clean stop
	}
}
