package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentkit/internal/testenv"
	"agentkit/internal/testenv/pgtest"
)

func oneLine(s string) bool { return strings.Count(strings.TrimRight(s, "\n"), "\n") == 0 }

func TestKVWithoutSubcommandIsUsage(t *testing.T) {
	dir := t.TempDir()
	r := run(t, dir, nil, "", "kv")
	if r.code != 2 || r.stdout != "" || !oneLine(r.stderr) || !strings.Contains(r.stderr, "ls, get, put or rm") {
		t.Errorf("agentkit kv: exit %d, stdout %q, stderr %q; want exit 2 and one line naming the subcommands", r.code, r.stdout, r.stderr)
	}
	for _, h := range []string{"-h", "--help", "help"} {
		r := run(t, dir, nil, "", "kv", h)
		if r.code != 0 {
			t.Errorf("agentkit kv %s: exit %d", h, r.code)
		}
		// The flag lines as the flag package prints them, not just words
		// of the usage text.
		for _, flag := range []string{"\n  -storage string\n", "\n  -state-root string\n", "\n  -values\n", "ls [PREFIX]", "create nothing"} {
			if !strings.Contains(r.stdout, flag) {
				t.Errorf("agentkit kv %s does not show %q:\n%s", h, flag, r.stdout)
			}
		}
	}
}

func TestKVStorageMistakesAreUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		storage string
		want    []string
		never   []string
	}{
		{"bogus://x", []string{`no driver for "bogus"`, "sqlite", "postgres", "--storage sqlite:"}, []string{"import the driver package", "boguskv"}},
		{"host=db.internal user=app password=hunter2", []string{"postgres://", "file:PATH"}, []string{"hunter2", "db.internal"}},
		{"mem://?x=1", []string{"x", "takes no parameters"}, nil},
		{"sqlite:" + filepath.Join(dir, "kv.db") + "?journal=delete", []string{`"journal"`}, nil},
	} {
		r := run(t, dir, nil, "", "kv", "ls", "--storage", c.storage)
		if r.code != 2 || !oneLine(r.stderr) {
			t.Errorf("kv ls --storage %q: exit %d, stderr %q; want exit 2 and one line", c.storage, r.code, r.stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("kv ls --storage %q: stderr %q does not say %q", c.storage, r.stderr, w)
			}
		}
		for _, n := range c.never {
			if strings.Contains(r.stderr, n) {
				t.Errorf("kv ls --storage %q: stderr %q says %q", c.storage, r.stderr, n)
			}
		}
	}
	// Nothing was created for any of them (the settings string above once
	// became a folder named after its password).
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the working folder holds %d entries after refused commands, e.g. %q", len(entries), entries[0].Name())
	}
}

// ls and get only read: on a store that does not exist yet they fail, and
// leave no database file, folder, table, bucket or marker behind.
func TestKVReadCommandsCreateNothing(t *testing.T) {
	dir := t.TempDir()
	check := func(t *testing.T, storage string) {
		t.Helper()
		for _, args := range [][]string{{"kv", "ls", "--storage", storage}, {"kv", "get", "--storage", storage, "k"}, {"kv", "ls", "--values", "--storage", storage, "p/"}} {
			r := run(t, dir, nil, "", args...)
			if r.code == 0 {
				t.Errorf("agentkit %q on a store that does not exist: exit 0, want a failure", args)
			}
		}
	}
	t.Run("sqlite", func(t *testing.T) {
		check(t, "sqlite:"+filepath.Join(dir, "sub", "kv.db"))
		if _, err := os.Stat(filepath.Join(dir, "sub")); err == nil {
			t.Error("kv ls created the sqlite database's folder")
		}
	})
	t.Run("file", func(t *testing.T) {
		check(t, "file:"+filepath.Join(dir, "store"))
		if _, err := os.Stat(filepath.Join(dir, "store")); err == nil {
			t.Error("kv ls created the file store's folder")
		}
	})
	t.Run("postgres", func(t *testing.T) {
		raw := pgtest.TableURL(t)
		check(t, raw)
		u, _ := url.Parse(raw)
		conn, err := pgx.Connect(context.Background(), pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var exists bool
		if err := conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", u.Query().Get("table")).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			t.Error("kv ls created the PostgreSQL table")
		}
	})
	t.Run("nats", func(t *testing.T) {
		raw := testenv.Getenv("AGENTKIT_TEST_NATS", "nats://127.0.0.1:4222")
		nc, err := nats.Connect(raw, nats.Timeout(2*time.Second))
		if err != nil {
			testenv.Unavailable(t, "NATS at "+raw, "Start nats-server -js or set AGENTKIT_TEST_NATS.", err)
		}
		defer nc.Close()
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		bucket := "kvtest_cli_" + hex.EncodeToString(b)
		check(t, raw+"?bucket="+bucket)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.KeyValue(context.Background(), bucket); err == nil {
			t.Error("kv ls created the NATS bucket")
			_ = js.DeleteKeyValue(context.Background(), bucket)
		}
	})
	t.Run("s3", func(t *testing.T) {
		raw := testenv.Getenv("AGENTKIT_TEST_S3", "")
		if raw == "" {
			testenv.Unavailable(t, "an S3 server", `eval "$(scripts/versitygw.sh start)" sets AGENTKIT_TEST_S3`, os.ErrNotExist)
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal("AGENTKIT_TEST_S3 does not parse")
		}
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		u.Host = "kvtest-cli-" + hex.EncodeToString(b)
		check(t, u.String())
		// The bucket was not created: a read-only ls still finds none.
		r := run(t, dir, nil, "", "kv", "ls", "--storage", u.String())
		if r.code == 0 || !strings.Contains(r.stderr, "does not exist") {
			t.Errorf("kv ls of a missing bucket, again: exit %d, stderr %q; want it still missing", r.code, r.stderr)
		}
	})
}

// Control characters in keys are printed escaped, one key a line.
func TestKVListEscapesControlCharacters(t *testing.T) {
	dir := t.TempDir()
	storage := "sqlite:" + filepath.Join(dir, "kv.db")
	keys := []string{"plain", "esc\x1b[31mred", "nl\nkey", `"quoted"`, `back\slash`, "tab\tkey", "é"}
	for _, k := range keys {
		if r := run(t, dir, nil, "", "kv", "put", "--storage", storage, k, "v"); r.code != 0 {
			t.Fatalf("put %q: exit %d, %s", k, r.code, r.stderr)
		}
	}
	r := run(t, dir, nil, "", "kv", "ls", "--storage", storage)
	want := []string{`"\"quoted\""`, `"back\\slash"`, `"esc\u001b[31mred"`, `"nl\nkey"`, "plain", `"tab\tkey"`, "é"}
	if got := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n"); r.code != 0 || !slices.Equal(got, want) {
		t.Errorf("kv ls: exit %d, lines %q; want %q", r.code, got, want)
	}
	if strings.ContainsAny(r.stdout, "\x1b\t") {
		t.Errorf("kv ls printed a raw control character: %q", r.stdout)
	}
	r = run(t, dir, nil, "", "kv", "ls", "--values", "--storage", storage, "nl")
	if r.stdout != "\"nl\\nkey\"\tv\n" {
		t.Errorf("kv ls --values nl = %q", r.stdout)
	}
}

func TestKVPutToMemorySaysItIsGone(t *testing.T) {
	r := run(t, t.TempDir(), nil, "", "kv", "put", "--storage", "mem://", "k", "v")
	if r.code != 0 || !strings.Contains(r.stderr, "gone") || !strings.Contains(r.stderr, "mem://") {
		t.Errorf("kv put --storage mem://: exit %d, stderr %q; want success and a note that the value is gone", r.code, r.stderr)
	}
	r = run(t, t.TempDir(), nil, "", "kv", "put", "--storage", "sqlite:"+filepath.Join(t.TempDir(), "kv.db"), "k", "v")
	if r.code != 0 || r.stderr != "" {
		t.Errorf("kv put to a durable store: exit %d, stderr %q; want silence", r.code, r.stderr)
	}
}

func TestKVLongKeyErrorIsShort(t *testing.T) {
	key := strings.Repeat("k", 10<<10)
	r := run(t, t.TempDir(), nil, "", "kv", "get", "--storage", "mem://", key)
	if r.code == 0 || len(r.stderr) > 500 || !strings.Contains(r.stderr, "10240 bytes") {
		t.Errorf("kv get of a 10 KiB key: exit %d, %d bytes of stderr (%.100q…); want a short error naming the length", r.code, len(r.stderr), r.stderr)
	}
}

// A store that is down is one line of error: go-redis adds nothing.
func TestKVRedisDownIsOneLine(t *testing.T) {
	r := run(t, t.TempDir(), nil, "", "kv", "ls", "--storage", "redis://127.0.0.1:1/0")
	if r.code != 1 || !oneLine(r.stderr) || !strings.Contains(r.stderr, "connection refused") {
		t.Errorf("kv ls on a closed Redis port: exit %d, stderr %q; want exit 1 and one line with the dial error", r.code, r.stderr)
	}
}
