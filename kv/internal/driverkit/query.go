package driverkit

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"agentkit/kv"
)

// urlError is a mistake in a store URL's parameters. It matches
// kv.ErrInvalidURL, so a command reports it as bad usage, without adding
// to its message.
type urlError struct{ msg string }

func (e *urlError) Error() string        { return e.msg }
func (e *urlError) Is(target error) bool { return target == kv.ErrInvalidURL }

func urlErrorf(format string, args ...any) error {
	return &urlError{msg: fmt.Sprintf(format, args...)}
}

// Params reads a store URL's query: each of the names a driver knows, at
// most once. An unknown name is refused, naming the known ones, so a typo
// (endpont=) never passes silently. The error never quotes a value, which
// may be a secret, and matches kv.ErrInvalidURL.
func Params(u *url.URL, known ...string) (map[string]string, error) {
	own, rest, err := SplitParams(u, known...)
	if err != nil {
		return nil, err
	}
	if rest.RawQuery != "" {
		q, _ := url.ParseQuery(rest.RawQuery)
		names := slices.Sorted(mapKeys(q))
		if len(known) == 0 {
			return nil, urlErrorf("the URL takes no parameters, but it sets %s; remove the query", strings.Join(names, ", "))
		}
		return nil, urlErrorf("unknown URL parameter %q; the parameters are %s", names[0], strings.Join(known, ", "))
	}
	return own, nil
}

// SplitParams takes the driver's own parameters (names) out of a store
// URL's query and returns their values and the URL without them, for a
// driver that hands the rest to its client library (pgx, go-redis). A
// parameter given twice, or given empty, is an error naming it.
func SplitParams(u *url.URL, names ...string) (map[string]string, *url.URL, error) {
	c := *u
	if c.RawQuery == "" {
		return map[string]string{}, &c, nil
	}
	q, err := url.ParseQuery(c.RawQuery)
	if err != nil {
		// The parser's error quotes the query, which may hold a secret.
		return nil, nil, urlErrorf("the URL's query does not parse; escape its parameter values (%% as %%25, & as %%26)")
	}
	own := map[string]string{}
	for _, name := range names {
		vals, ok := q[name]
		if !ok {
			continue
		}
		switch {
		case len(vals) > 1:
			return nil, nil, urlErrorf("the %s parameter is given %d times; give it once", name, len(vals))
		case vals[0] == "":
			return nil, nil, urlErrorf("the %s parameter is empty; remove it for the default, or give it a value", name)
		}
		own[name] = vals[0]
		q.Del(name)
	}
	c.RawQuery = q.Encode()
	return own, &c, nil
}

func mapKeys(q url.Values) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range q {
			if !yield(k) {
				return
			}
		}
	}
}
