package kv_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"agentkit/kv"
	"agentkit/kv/memkv"
)

// opened records the URLs the test drivers below were asked to open.
var (
	openedMu sync.Mutex
	opened   []*url.URL
)

func recordOpen(_ context.Context, u *url.URL) (*kv.DB, error) {
	openedMu.Lock()
	opened = append(opened, u)
	openedMu.Unlock()
	return memkv.New(), nil
}

func lastOpened(t *testing.T) *url.URL {
	t.Helper()
	openedMu.Lock()
	defer openedMu.Unlock()
	if len(opened) == 0 {
		t.Fatal("no driver was opened")
	}
	return opened[len(opened)-1]
}

var registerOnce sync.Once

// registerTestDrivers registers "file" (this test binary links no file
// driver) and two schemes of its own.
func registerTestDrivers() {
	registerOnce.Do(func() {
		kv.Register("file", recordOpen)
		kv.Register("kvtest-rec", recordOpen)
		kv.Register("KVTEST-FAIL", func(_ context.Context, u *url.URL) (*kv.DB, error) {
			return nil, errors.New("connection refused")
		})
	})
}

func TestOpenUnknownSchemeListsSchemes(t *testing.T) {
	registerTestDrivers()
	_, err := kv.Open(context.Background(), "nosuch://user:hunter2@host/db")
	if err == nil {
		t.Fatal("Open of an unregistered scheme succeeded")
	}
	msg := err.Error()
	for _, want := range []string{`"nosuch"`, "mem", "kvtest-rec", "import the driver package"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "hunter2") {
		t.Errorf("error %q contains the password", msg)
	}
}

func TestOpenEmptyURL(t *testing.T) {
	_, err := kv.Open(context.Background(), "")
	if err == nil || !strings.Contains(err.Error(), "mem") {
		t.Errorf("Open(\"\") = %v, want an error listing the schemes", err)
	}
}

func TestOpenBarePathIsFile(t *testing.T) {
	registerTestDrivers()
	for _, path := range []string{"/var/lib/agentkit/kv", "./state", "../state", "~/state", "state/kv", "state", `C\:weird`} {
		db, err := kv.Open(context.Background(), path)
		if err != nil {
			t.Errorf("Open(%q): %v", path, err)
			continue
		}
		_ = db.Close()
		u := lastOpened(t)
		if u.Scheme != "file" || u.Path != path {
			t.Errorf("Open(%q) opened scheme %q path %q, want the file driver with the path as given", path, u.Scheme, u.Path)
		}
	}
	db, err := kv.Open(context.Background(), "file:/srv/kv")
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	if u := lastOpened(t); u.Scheme != "file" || u.Opaque+u.Path != "/srv/kv" {
		t.Errorf("Open(file:/srv/kv) opened %q", u)
	}
}

func TestOpenSchemeIsCaseInsensitive(t *testing.T) {
	registerTestDrivers()
	db, err := kv.Open(context.Background(), "KVTEST-REC://host/x")
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	if u := lastOpened(t); u.Host != "host" {
		t.Errorf("opened %q, want host \"host\"", u)
	}
	// Registered in upper case, found in lower case.
	if _, err := kv.Open(context.Background(), "kvtest-fail://x"); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Open(kvtest-fail://x) = %v, want the driver's error", err)
	}
}

func TestOpenRedactsCredentials(t *testing.T) {
	registerTestDrivers()
	for _, raw := range []string{
		"kvtest-fail://alice:hunter2@db.example:5432/app?table=kv",
		"kvtest-fail://alice:hunter2@db.example/app",
	} {
		_, err := kv.Open(context.Background(), raw)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", raw)
		}
		msg := err.Error()
		if strings.Contains(msg, "hunter2") {
			t.Errorf("Open error %q contains the password", msg)
		}
		// kvtest-fail is no scheme RedactURL knows: the user is hidden too.
		if strings.Contains(msg, "alice") || !strings.Contains(msg, "kvtest-fail://REDACTED:REDACTED@db.example") || !strings.Contains(msg, "connection refused") {
			t.Errorf("Open error %q should name the redacted URL and the driver's error", msg)
		}
	}
	// A URL that does not parse: the parser's message would quote it.
	_, err := kv.Open(context.Background(), "postgres://alice:hun%zzter2@host/db")
	if err == nil {
		t.Fatal("Open of a malformed URL succeeded")
	}
	if msg := err.Error(); strings.Contains(msg, "hun") || !strings.Contains(msg, "postgres") {
		t.Errorf("parse error %q: want the scheme named and no part of the password", msg)
	}
}

func TestRegisterPanics(t *testing.T) {
	registerTestDrivers()
	cases := []struct {
		name   string
		scheme string
		open   kv.Opener
		want   string
	}{
		{"duplicate", "mem", recordOpen, "twice"},
		{"duplicate in another case", "MEM", recordOpen, "twice"},
		{"empty scheme", "", recordOpen, "scheme"},
		{"nil opener", "kvtest-nil", nil, "opener"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatalf("Register(%q) did not panic", c.scheme)
				}
				if msg := r.(string); !strings.Contains(msg, c.want) {
					t.Errorf("panic %q does not say %q", msg, c.want)
				}
			}()
			kv.Register(c.scheme, c.open)
		})
	}
	if slices.Contains(kv.Schemes(), "kvtest-nil") {
		t.Error("a failed Register left its scheme registered")
	}
}

func TestSchemesSorted(t *testing.T) {
	registerTestDrivers()
	s := kv.Schemes()
	if !slices.IsSorted(s) {
		t.Errorf("Schemes() = %q, not sorted", s)
	}
	for _, want := range []string{"mem", "file", "kvtest-rec", "kvtest-fail"} {
		if !slices.Contains(s, want) {
			t.Errorf("Schemes() = %q, missing %q", s, want)
		}
	}
}

// RedactURL hides every secret a store URL can hold, per scheme: the
// secret is "s3cr3t" (or akst_… for a token) in every row, and want is
// the whole redacted URL, so a row fails when too little or too much is
// hidden.
func TestRedactURLHidesSecretsPerScheme(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		// agentkit+http(s): the user or the password is the token.
		{"agentkit+http://akst_s3cr3t@host:8470/ns", "agentkit+http://REDACTED@host:8470/ns"},
		{"agentkit+http://akst_s3cr3t:x@host:8470/ns", "agentkit+http://REDACTED:REDACTED@host:8470/ns"},
		{"agentkit+https://x:akst_s3cr3t@host/ns", "agentkit+https://REDACTED:REDACTED@host/ns"},
		{"agentkit+https://:akst_s3cr3t@host/ns", "agentkit+https://:REDACTED@host/ns"},
		{"agentkit+http://host/ns?token_file=/run/s3cr3t&page=5", "agentkit+http://host/ns?token_file=REDACTED&page=5"},
		// PostgreSQL: the user is a role name, the password a secret.
		{"postgres://alice@db/test", "postgres://alice@db/test"},
		{"postgres://alice:s3cr3t@db/test?table=t", "postgres://alice:REDACTED@db/test?table=t"},
		{"postgresql://:s3cr3t@db/test", "postgresql://:REDACTED@db/test"},
		{"postgres://alice@db/test?password=s3cr3t&sslmode=disable", "postgres://alice@db/test?password=REDACTED&sslmode=disable"},
		// Redis: an ACL user beside a password is a name; alone it may be
		// the password.
		{"redis://s3cr3t@h:6379/0", "redis://REDACTED@h:6379/0"},
		{"redis://app:s3cr3t@h:6379/0", "redis://app:REDACTED@h:6379/0"},
		{"rediss://:s3cr3t@h:6379/0", "rediss://:REDACTED@h:6379/0"},
		{"redis://h:6379?password=s3cr3t", "redis://h:6379?password=REDACTED"},
		// NATS: a bare user is a token; beside a password it is a name.
		{"nats://s3cr3t@127.0.0.1:4222?bucket=b", "nats://REDACTED@127.0.0.1:4222?bucket=b"},
		{"nats://agent:s3cr3t@127.0.0.1:4222", "nats://agent:REDACTED@127.0.0.1:4222"},
		{"nats://h:4222?creds=/etc/s3cr3t.creds&nkey=/etc/s3cr3t.nk", "nats://h:4222?creds=REDACTED&nkey=REDACTED"},
		// S3: the user is the access key id.
		{"s3://AKIAs3cr3t:s3cr3t@bucket/p?endpoint=http://x", "s3://REDACTED:REDACTED@bucket/p?endpoint=http://x"},
		{"s3://bucket/p?endpoint=http://x&secret_key=s3cr3t&Access_Key=s3cr3t", "s3://bucket/p?endpoint=http://x&secret_key=REDACTED&Access_Key=REDACTED"},
		// An unknown scheme: nothing is guessed at.
		{"mystore://s3cr3t@h/db", "mystore://REDACTED@h/db"},
		{"mystore://alice:s3cr3t@h/db", "mystore://REDACTED:REDACTED@h/db"},
		// A query net/url would reject, and escaped names.
		{"redis://h/0?a=1;password=s3cr3t", "redis://h/0?a=1;password=REDACTED"},
		{"redis://h/0?pass%77ord=s3cr3t", "redis://h/0?pass%77ord=REDACTED"},
		{"redis://h/0?%zz=1&token=s3cr3t", "redis://h/0?%zz=1&token=REDACTED"},
		// User information cut short by an unescaped '/', '?' or '#'.
		{"agentkit+http://akst_s3/cr3t@host/ns", "agentkit+http://REDACTED@host/ns"},
		{"agentkit+http://akst_s3?cr3t@host/ns", "agentkit+http://REDACTED@host/ns"},
		{"agentkit+http://akst_s3#cr3t@host/ns", "agentkit+http://REDACTED@host/ns"},
		{"agentkit+http:akst_s3cr3t@host/ns", "agentkit+http:REDACTED@host/ns"},
		// Paths keep their '@'; nothing to hide leaves the URL alone.
		{"sqlite:state/s3cr3t@home.db", "sqlite:state/s3cr3t@home.db"},
		{"file:///srv/s3cr3t@kv", "file:///srv/s3cr3t@kv"},
		{"sqlite:kv.db?synchronous=normal", "sqlite:kv.db?synchronous=normal"},
		{"s3://bucket/a%40b?endpoint=http://x", "s3://bucket/a%40b?endpoint=http://x"},
		{"mem://", "mem:"}, // as (*url.URL).String prints it
	} {
		u, err := url.Parse(c.raw)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", c.raw, err)
		}
		if got := kv.RedactURL(u); got != c.want {
			t.Errorf("RedactURL(%q)\n got %q\nwant %q", c.raw, got, c.want)
		}
	}
	if got := kv.RedactURL(nil); got != "" {
		t.Errorf("RedactURL(nil) = %q, want empty", got)
	}
}

// A token or password with an unescaped '/', '?' or '#' makes the URL
// parse with part of the secret as the host, path or query, which a driver
// may quote: Open refuses it before any driver sees it, quoting nothing.
// An '@' written %40 after the host, and paths of file and sqlite URLs,
// are not refused.
func TestOpenRefusesUserInformationCutShort(t *testing.T) {
	registerTestDrivers()
	for _, raw := range []string{
		"kvtest-rec://s3c/r3t@host/db",
		"kvtest-rec://s3c?r3t@host/db",
		"kvtest-rec://s3c#r3t@host/db",
		"kvtest-rec://user:pw@host/db?name=s3c@r3t",
		"kvtest-rec:s3cr3t@host/db",
	} {
		_, err := kv.Open(context.Background(), raw)
		if !errors.Is(err, kv.ErrInvalidURL) {
			t.Errorf("Open(%q) = %v; want ErrInvalidURL", raw, err)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "s3c") || strings.Contains(msg, "r3t") || !strings.Contains(msg, "%2F") {
			t.Errorf("Open(%q) = %q; want the escapes named and nothing of the URL but its scheme", raw, msg)
		}
	}
	for _, raw := range []string{"kvtest-rec://host/a%40b", "file:a@b", "file:///srv/a@b"} {
		db, err := kv.Open(context.Background(), raw)
		if err != nil {
			t.Errorf("Open(%q): %v", raw, err)
			continue
		}
		_ = db.Close()
	}
}

// A string without a scheme that holds '=' or a space is key=value
// settings more likely than a folder: it is refused, without quoting it
// (it may hold a password), and pointing at the URL form. Explicit paths
// keep working.
func TestOpenRefusesSettingsAsPath(t *testing.T) {
	registerTestDrivers()
	for _, raw := range []string{"host=db.internal user=app password=hunter2", "dbname=x", "my state", "a\tb"} {
		_, err := kv.Open(context.Background(), raw)
		if err == nil {
			t.Errorf("Open(%q) succeeded; want a refusal", raw)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "hunter2") || strings.Contains(msg, "db.internal") {
			t.Errorf("Open(%q) = %q: the error quotes the input", raw, msg)
		}
		for _, want := range []string{"postgres://", "file:PATH"} {
			if !strings.Contains(msg, want) {
				t.Errorf("Open(%q) = %q, want it to show %q", raw, msg, want)
			}
		}
	}
	for _, raw := range []string{"./my state", "/srv/a=b", "~/x y", "file:my state"} {
		db, err := kv.Open(context.Background(), raw)
		if err != nil {
			t.Errorf("Open(%q): %v; an explicit path is a path", raw, err)
			continue
		}
		_ = db.Close()
		if u := lastOpened(t); u.Scheme != "file" {
			t.Errorf("Open(%q) opened scheme %q", raw, u.Scheme)
		}
	}
}

func TestOpenUnknownSchemeIsNoDriverError(t *testing.T) {
	registerTestDrivers()
	_, err := kv.Open(context.Background(), "Bogus://x")
	var nd *kv.NoDriverError
	if !errors.As(err, &nd) || nd.Scheme != "bogus" || !slices.Contains(nd.Schemes, "mem") {
		t.Fatalf("Open(Bogus://x) = %v, want a *kv.NoDriverError for scheme bogus listing mem", err)
	}
}

var optsMu sync.Mutex
var optsSeen []kv.OpenOptions

var registerOptionsOnce sync.Once

func registerOptionsDriver() {
	registerOptionsOnce.Do(func() {
		kv.RegisterOptions("kvtest-opts", func(_ context.Context, _ *url.URL, o kv.OpenOptions) (*kv.DB, error) {
			optsMu.Lock()
			optsSeen = append(optsSeen, o)
			optsMu.Unlock()
			return memkv.New(), nil
		})
	})
}

// OpenWith hands the options to a driver registered with RegisterOptions,
// and a DB opened read-only refuses every write, whatever its driver.
func TestOpenWithReadOnly(t *testing.T) {
	registerTestDrivers()
	registerOptionsDriver()
	ctx := context.Background()
	for _, raw := range []string{"kvtest-opts://x", "kvtest-rec://x"} {
		db, err := kv.OpenWith(ctx, raw, kv.OpenOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = db.PutIfAbsent(ctx, "k", nil)
		for name, err := range map[string]error{
			"Put":          db.Put(ctx, "k", nil),
			"Delete":       db.Delete(ctx, "k"),
			"PutIfAbsent":  err,
			"PutIfVersion": func() error { _, err := db.PutIfVersion(ctx, "k", nil, "1"); return err }(),
		} {
			if !errors.Is(err, kv.ErrReadOnly) {
				t.Errorf("%s: %s through a read-only DB = %v, want kv.ErrReadOnly", raw, name, err)
			}
		}
		if _, err := db.Get(ctx, "k"); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("%s: Get through a read-only DB = %v, want a plain miss", raw, err)
		}
		for _, err := range db.List(ctx, "") {
			if err != nil {
				t.Errorf("%s: List through a read-only DB: %v", raw, err)
			}
		}
		_ = db.Close()
	}
	optsMu.Lock()
	seen := slices.Clone(optsSeen)
	optsMu.Unlock()
	if len(seen) != 1 || !seen[0].ReadOnly {
		t.Errorf("the options driver saw %+v, want one read-only open", seen)
	}
	db, err := kv.Open(ctx, "kvtest-opts://x")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Put(ctx, "k", nil); err != nil {
		t.Errorf("Put through a DB opened by Open: %v", err)
	}
}
