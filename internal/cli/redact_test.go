package cli_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestKVNeverPrintsTheStorageToken runs agentkit kv ls against a real
// storaged with its token in every place a URL can carry it, through every
// error the command can meet on the way (refused token, wrong namespace,
// bad path, unknown parameter, unreachable host, user information cut
// short by an unescaped character): neither the token nor a part of it
// appears on standard output or standard error.
func TestKVNeverPrintsTheStorageToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	creds := filepath.Join(dir, "creds.json")
	add := run(t, dir, nil, "", "storaged", "credentials", "add", "acme", "--credentials", creds)
	token := strings.TrimSpace(add.stdout)
	if add.code != 0 || !strings.HasPrefix(token, "akst_") {
		t.Fatalf("credentials add: exit %d, %q %q", add.code, add.stdout, add.stderr)
	}
	sd := startServing(t, agentkitBin, dir, nil, "storaged", "--backend", "sqlite:"+filepath.Join(dir, "hosted.db"),
		"--credentials", creds, "--addr", "127.0.0.1:0")
	host := strings.TrimPrefix(sd.url, "http://")
	// The token's secret part, after its public id: no piece of it may show.
	secret := token[strings.LastIndex(token, "_")+1:]

	if r := run(t, dir, nil, "", "kv", "ls", "--storage", "agentkit+http://"+token+"@"+host+"/acme"); r.code != 0 {
		t.Fatalf("kv ls with the token as the user: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, c := range []struct {
		storage, want string
	}{
		// The password is the token the driver sends: "x" is refused.
		{"agentkit+http://" + token + ":x@" + host + "/acme", "REDACTED:REDACTED@" + host},
		{"agentkit+http://x:" + token + "@" + host + "/other", "REDACTED:REDACTED@" + host},
		{"agentkit+http://" + token + "@" + host + "/acme/extra", "namespace"},
		{"agentkit+http://" + token + "@" + host + "/acme?bogus=1", `"bogus"`},
		{"agentkit+http://" + host + "/acme?token=" + token, "token=REDACTED"},
		{"agentkit+http://" + token + ":x@127.0.0.1:1/acme", "REDACTED:REDACTED@127.0.0.1:1"},
		{"agentkit+http://" + token[:9] + "/" + token[9:] + "@" + host + "/acme", "percent-encoded"},
		{"agentkit+http://" + token[:9] + "?" + token[9:] + "@" + host + "/acme", "percent-encoded"},
		{"agentkit+http://" + token[:9] + "#" + token[9:] + "@" + host + "/acme", "percent-encoded"},
		{"agentkit+http:" + token + "@" + host + "/acme", "percent-encoded"},
	} {
		r := run(t, dir, nil, "", "kv", "ls", "--storage", c.storage)
		out := r.stdout + r.stderr
		if r.code == 0 {
			t.Errorf("kv ls --storage %s succeeded; want an error", strings.ReplaceAll(c.storage, token, "TOKEN"))
			continue
		}
		if strings.Contains(out, secret[:12]) || strings.Contains(out, secret[len(secret)-12:]) {
			t.Errorf("kv ls --storage %s printed the token:\n%s", strings.ReplaceAll(c.storage, token, "TOKEN"), out)
		}
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("kv ls --storage %s: stderr %q does not say %q", strings.ReplaceAll(c.storage, token, "TOKEN"), r.stderr, c.want)
		}
	}
	if strings.Contains(sd.stderr.String(), secret[:12]) {
		t.Error("storaged's log holds the token")
	}
}

// TestKVNeverPrintsAStorePassword does the same for the drivers whose URL
// holds a password: PostgreSQL, Redis and NATS on closed ports (the
// connection error path), and a URL whose password holds an unescaped '#'.
func TestKVNeverPrintsAStorePassword(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pw = "Pa55w0rdSecret"
	for _, c := range []struct{ storage, want string }{
		{"postgres://app:" + pw + "@127.0.0.1:1/db", "postgres://app:REDACTED@127.0.0.1:1/db"},
		{"redis://:" + pw + "@127.0.0.1:1/0", "redis://:REDACTED@127.0.0.1:1/0"},
		{"redis://" + pw + "@127.0.0.1:1/0", "redis://REDACTED@127.0.0.1:1/0"},
		{"nats://" + pw + "@127.0.0.1:1", "nats://REDACTED@127.0.0.1:1"},
		{"nats://agent:" + pw + "@127.0.0.1:1", "nats://agent:REDACTED@127.0.0.1:1"},
		{"s3://AKIA" + pw + ":" + pw + "@bucket/p?endpoint=http://127.0.0.1:1&bogus=1", "s3://REDACTED:REDACTED@bucket"},
		{"mem://?password=" + pw, "password=REDACTED"},
	} {
		r := run(t, dir, nil, "", "kv", "ls", "--storage", c.storage)
		if r.code == 0 {
			t.Errorf("kv ls --storage %s succeeded; want an error", c.want)
			continue
		}
		if strings.Contains(r.stdout+r.stderr, pw) {
			t.Errorf("kv ls printed the password:\n%s%s", r.stdout, r.stderr)
		}
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("kv ls --storage %s: stderr %q does not say %q", strings.ReplaceAll(c.storage, pw, "PW"), r.stderr, c.want)
		}
	}
}
