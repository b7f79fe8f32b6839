package kv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// Opener opens a store from a parsed URL. Drivers register one per scheme.
// The URL may hold credentials: an Opener never puts them in an error or a
// log (use (*url.URL).Redacted).
type Opener func(ctx context.Context, u *url.URL) (*DB, error)

// OpenOptions are what a caller of OpenWith asks for beyond the URL. The
// zero value opens as Open does.
type OpenOptions struct {
	// ReadOnly opens a store only to read it. The returned DB fails every
	// write with an error matching ErrReadOnly. A driver registered with
	// RegisterOptions also creates nothing while opening (no database
	// file, folder, table or bucket, no format marker) and fails to open
	// a store that does not exist yet, saying so; every driver of this
	// module does. A driver registered with Register opens as usual.
	ReadOnly bool
}

// OptionsOpener is an Opener that honours OpenOptions.
type OptionsOpener func(ctx context.Context, u *url.URL, opts OpenOptions) (*DB, error)

// ErrInvalidURL is matched by Open's error when the storage URL is not
// one: it does not parse, or it is key=value settings with no scheme.
var ErrInvalidURL = errors.New("kv: invalid storage URL")

// NoDriverError is Open's error when no driver is registered for the URL's
// scheme. Check for it with errors.As.
type NoDriverError struct {
	Scheme  string   // the URL's scheme, lower case
	Schemes []string // the registered schemes, sorted
}

// Error names the scheme, the registered ones, and the package to import.
func (e *NoDriverError) Error() string {
	have := strings.Join(e.Schemes, ", ")
	if have == "" {
		have = "no drivers registered"
	}
	return fmt.Sprintf("kv: no driver for %q URLs (have %s); import the driver package, e.g. agentkit/kv/%skv", e.Scheme, have, e.Scheme)
}

type driver struct {
	open    OptionsOpener
	options bool // the opener honours OpenOptions
}

var (
	driversMu sync.RWMutex
	drivers   = map[string]driver{}
)

// Register makes a driver available to Open under a URL scheme, such as
// "sqlite". It panics if the scheme is empty, the opener nil, or the scheme
// already registered, as database/sql does.
func Register(scheme string, open Opener) {
	if open == nil {
		panic("kv: Register needs a scheme and an opener")
	}
	register(scheme, driver{open: func(ctx context.Context, u *url.URL, _ OpenOptions) (*DB, error) {
		return open(ctx, u)
	}})
}

// RegisterOptions is Register for a driver whose opener honours
// OpenOptions (see OpenOptions.ReadOnly for what that promises).
func RegisterOptions(scheme string, open OptionsOpener) {
	if open == nil {
		panic("kv: Register needs a scheme and an opener")
	}
	register(scheme, driver{open: open, options: true})
}

func register(scheme string, d driver) {
	scheme = strings.ToLower(scheme)
	if scheme == "" {
		panic("kv: Register needs a scheme and an opener")
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if _, dup := drivers[scheme]; dup {
		panic("kv: Register called twice for scheme " + scheme)
	}
	drivers[scheme] = d
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	s := make([]string, 0, len(drivers))
	for k := range drivers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Open opens the store a URL names, through the driver registered for its
// scheme: "mem://", "file:/srv/kv", "sqlite:/srv/kv.db",
// "postgres://host/db?table=kv", "redis://host:6379/0?prefix=app/",
// "nats://host:4222?bucket=agentkit", "s3://bucket/prefix?endpoint=…". A
// string with no scheme is a path for the file driver. The program must
// import the driver's package (cmd/agentkit imports them all).
func Open(ctx context.Context, rawURL string) (*DB, error) {
	return OpenWith(ctx, rawURL, OpenOptions{})
}

// OpenWith is Open with options: OpenWith(ctx, url, kv.OpenOptions{ReadOnly:
// true}) opens a store to look into it without creating or changing
// anything.
func OpenWith(ctx context.Context, rawURL string, opts OpenOptions) (*DB, error) {
	if rawURL == "" {
		return nil, fmt.Errorf("kv: no storage URL given; use one of %s, or a path", schemeList())
	}
	scheme, u, err := parseStoreURL(rawURL)
	if err != nil {
		return nil, err
	}
	driversMu.RLock()
	d, ok := drivers[scheme]
	driversMu.RUnlock()
	if !ok {
		return nil, &NoDriverError{Scheme: scheme, Schemes: Schemes()}
	}
	db, err := d.open(ctx, u, opts)
	if err != nil {
		return nil, fmt.Errorf("kv: open %s: %w", RedactURL(u), err)
	}
	if opts.ReadOnly {
		db.readOnly = true
	}
	return db, nil
}

// RedactURL returns u as a string fit for errors, logs and output, with
// every credential it may hold replaced by "REDACTED":
//
//   - the password, always;
//   - the user name, unless the scheme takes it for a login name that is
//     not a secret: postgres and postgresql always, redis, rediss and nats
//     when a password is given too. A bare user on those (nats://TOKEN@host)
//     is a token or a password, and on every other scheme the user is
//     hidden as well: on agentkit+http(s) the user or the password is the
//     deployment token, on s3 the user is the access key id, and an
//     unknown scheme is not guessed at;
//   - the values of query parameters whose names suggest a secret (such as
//     password=, token=, secret_key=, creds=), however the query is
//     separated;
//   - user information that did not parse as such: a token or password
//     holding an unescaped '/', '?' or '#' ends the host there, so an '@'
//     after the host (in the path, query or fragment) hides everything
//     before it, and so does an '@' in the opaque part of a URL that does
//     not name a file (sqlite: and file: URLs are paths).
//
// Open names the store with it in the errors of every driver; agentkit
// (its CLI, server and storaged) prints store URLs in no other way.
func RedactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	c := *u
	scheme := strings.ToLower(c.Scheme)
	if c.User != nil {
		name := c.User.Username()
		_, hasPassword := c.User.Password()
		if name != "" && !userIsName(scheme, hasPassword) {
			name = redacted
		}
		if hasPassword {
			c.User = url.UserPassword(name, redacted)
		} else {
			c.User = url.User(name)
		}
	}
	c.RawQuery = redactQuery(c.RawQuery)
	if !strayAt(&c, scheme) {
		return c.String()
	}
	if c.Opaque != "" {
		c.Opaque = redacted + c.Opaque[strings.LastIndex(c.Opaque, "@"):]
		return c.String()
	}
	// What parsed as the host is the start of the user information.
	c.User = nil
	s := c.String()
	return c.Scheme + "://" + redacted + s[strings.LastIndex(s, "@"):]
}

const redacted = "REDACTED"

// pathSchemes are the schemes whose opaque part is a file's path, where an
// '@' is part of a name.
var pathSchemes = map[string]bool{"file": true, "sqlite": true, "mem": true}

// userIsName reports whether the user part of a URL of the scheme is a
// login name rather than a secret; see RedactURL.
func userIsName(scheme string, hasPassword bool) bool {
	switch scheme {
	case "postgres", "postgresql":
		return true
	case "redis", "rediss", "nats":
		return hasPassword
	}
	return false
}

// secretParams are the parts of query parameter names that mark a secret.
var secretParams = []string{"password", "passwd", "pwd", "secret", "token", "key", "creds", "credential", "auth", "signature"}

// redactQuery replaces the value of every parameter of a raw query whose
// name suggests a secret. It splits on '&' and ';' alike and keeps the rest
// as written, so a query net/url would reject is hidden as well as one it
// reads.
func redactQuery(raw string) string {
	if raw == "" {
		return raw
	}
	var b strings.Builder
	for len(raw) > 0 {
		i := strings.IndexAny(raw, "&;")
		piece, sep := raw, ""
		if i >= 0 {
			piece, sep, raw = raw[:i], raw[i:i+1], raw[i+1:]
		} else {
			raw = ""
		}
		if name, _, ok := strings.Cut(piece, "="); ok && secretName(name) {
			piece = name + "=" + redacted
		}
		b.WriteString(piece)
		b.WriteString(sep)
	}
	return b.String()
}

func secretName(name string) bool {
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	name = strings.ToLower(name)
	for _, s := range secretParams {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

func schemeList() string {
	s := Schemes()
	if len(s) == 0 {
		return "no drivers registered"
	}
	return strings.Join(s, ", ")
}

// parseStoreURL finds the scheme; a bare path becomes a file URL.
func parseStoreURL(raw string) (string, *url.URL, error) {
	if isBarePath(raw) {
		if looksLikeSettings(raw) {
			// Never quote raw: key=value settings may hold a password.
			return "", nil, fmt.Errorf("%w: it has no scheme and holds '=' or a space, so it is not taken as a folder; "+
				"it looks like key=value connection settings. Write a URL, such as postgres://USER:PASSWORD@HOST:5432/DB?sslmode=disable "+
				"or redis://HOST:6379/0; for a folder whose name has '=' or spaces, write file:PATH or ./PATH", ErrInvalidURL)
		}
		return "file", &url.URL{Scheme: "file", Path: raw}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the input, which may hold a password.
		return "", nil, fmt.Errorf("%w: it does not parse; check its escaping (scheme %q)", ErrInvalidURL, schemeOf(raw))
	}
	scheme := strings.ToLower(u.Scheme)
	if strayAt(u, scheme) {
		// Never quote raw: the part before the '@' is a credential.
		return "", nil, fmt.Errorf("%w: an '@' follows the host, or the URL lacks the // of %s://USER@HOST; "+
			"a token or password holding '/', '?' or '#' needs them percent-encoded (%%2F, %%3F, %%23), an '@' after the host is written %%40, "+
			"and credentials go before the host, never in a parameter (such as a user in endpoint=)",
			ErrInvalidURL, scheme)
	}
	return scheme, u, nil
}

// strayAt reports whether u has an '@' that is not the end of its user
// information: one after the host, or in the opaque part of a URL that
// does not name a file. Drivers would read what precedes it as the host,
// path or query and could quote it in an error.
func strayAt(u *url.URL, scheme string) bool {
	if pathSchemes[scheme] {
		return false
	}
	if u.Opaque != "" {
		return strings.Contains(u.Opaque, "@")
	}
	return u.Host != "" && strings.Contains(u.EscapedPath()+u.RawQuery+u.EscapedFragment(), "@")
}

func schemeOf(raw string) string {
	if i := strings.Index(raw, ":"); i > 0 {
		return raw[:i]
	}
	return ""
}

// looksLikeSettings reports whether a string without a scheme is more
// likely key=value settings ("host=db password=…") than a folder: it does
// not start as an explicit path does (/, ., ~) and holds '=' or white
// space.
func looksLikeSettings(s string) bool {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || strings.HasPrefix(s, "~") {
		return false
	}
	return strings.ContainsAny(s, "= \t\n\r\v\f")
}

// isWrite reports whether a *DB operation (as named in Error.Op) writes.
func isWrite(op string) bool {
	switch op {
	case "put", "delete", "put if absent", "put if version":
		return true
	}
	return false
}

// isBarePath reports whether s names a path rather than a URL: it starts
// with a slash, a dot or a tilde, or has no scheme at all.
func isBarePath(s string) bool {
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || strings.HasPrefix(s, "~") {
		return true
	}
	i := strings.Index(s, ":")
	if i <= 0 {
		return true
	}
	for _, r := range s[:i] {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.') {
			return true
		}
	}
	return false
}
