package kv

import (
	"context"
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

var (
	driversMu sync.RWMutex
	drivers   = map[string]Opener{}
)

// Register makes a driver available to Open under a URL scheme, such as
// "sqlite". It panics if the scheme is empty, the opener nil, or the scheme
// already registered, as database/sql does.
func Register(scheme string, open Opener) {
	scheme = strings.ToLower(scheme)
	if scheme == "" || open == nil {
		panic("kv: Register needs a scheme and an opener")
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if _, dup := drivers[scheme]; dup {
		panic("kv: Register called twice for scheme " + scheme)
	}
	drivers[scheme] = open
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
	if rawURL == "" {
		return nil, fmt.Errorf("kv: no storage URL given; use one of %s, or a path", schemeList())
	}
	scheme, u, err := parseStoreURL(rawURL)
	if err != nil {
		return nil, err
	}
	driversMu.RLock()
	open := drivers[scheme]
	driversMu.RUnlock()
	if open == nil {
		return nil, fmt.Errorf("kv: no driver for %q URLs (have %s); import the driver package, e.g. agentkit/kv/%skv", scheme, schemeList(), scheme)
	}
	db, err := open(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("kv: open %s: %w", RedactURL(u), err)
	}
	return db, nil
}

// RedactURL returns u as a string fit for logs and errors: a password, a
// bare user name (which may be a token, as in nats://TOKEN@host) and the
// values of query parameters whose names suggest a secret are replaced by
// "REDACTED".
func RedactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		if _, hasPassword := c.User.Password(); hasPassword {
			c.User = url.UserPassword(c.User.Username(), "REDACTED")
		} else {
			c.User = url.User("REDACTED") // a bare user may be a token
		}
	}
	if c.RawQuery != "" {
		q := c.Query()
		changed := false
		for name := range q {
			n := strings.ToLower(name)
			for _, secret := range []string{"password", "passwd", "secret", "token", "key", "creds", "credential"} {
				if strings.Contains(n, secret) {
					q[name] = []string{"REDACTED"}
					changed = true
					break
				}
			}
		}
		if changed {
			c.RawQuery = q.Encode()
		}
	}
	return c.String()
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
		return "file", &url.URL{Scheme: "file", Path: raw}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the input, which may hold a password.
		return "", nil, fmt.Errorf("kv: the storage URL does not parse; check its escaping (scheme %q)", schemeOf(raw))
	}
	return strings.ToLower(u.Scheme), u, nil
}

func schemeOf(raw string) string {
	if i := strings.Index(raw, ":"); i > 0 {
		return raw[:i]
	}
	return ""
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
