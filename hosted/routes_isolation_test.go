package hosted

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"agentkit/kv/hostedkv/wire"
)

// routeCase is one request of the isolation test: built for a namespace,
// so the same request is sent by the attacker on the victim's path and
// then by the victim itself.
type routeCase struct {
	name string
	// request builds the path (with its query), headers and body of the
	// request on namespace ns; ts is there to read what the victim holds
	// (a version to match).
	request func(t *testing.T, ts *testService, ns string) (path string, hdr map[string]string, body []byte)
	// write is set when the request, sent by the namespace's owner,
	// changes the namespace's data; otherwise it reads the victim's data
	// (the owner's answer holds the victim's marker).
	write bool
}

const (
	isoAttacker = "alpha"
	isoVictim   = "bravo"
	isoAgent    = "support"
	isoMarker   = "BRAVO-PRIVATE"
	// isoKey is the victim's key; its name holds the marker too, so a
	// listing of keys alone shows it.
	isoKey = isoMarker + "-key"
)

// routeCases has the isolation cases of every route of the protocol, by
// "METHOD resource" as in the route table; a route with request variants
// (conditional writes) has one case per variant.
func routeCases() map[string][]routeCase {
	q := func(ns, resource string, params ...string) string {
		v := url.Values{}
		for i := 0; i+1 < len(params); i += 2 {
			v.Set(params[i], params[i+1])
		}
		p := "/v1/ns/" + ns + "/" + resource
		if len(v) > 0 {
			p += "?" + v.Encode()
		}
		return p
	}
	fixed := func(resource string, hdr func() map[string]string, body string, params ...string) func(*testing.T, *testService, string) (string, map[string]string, []byte) {
		return func(_ *testing.T, _ *testService, ns string) (string, map[string]string, []byte) {
			var h map[string]string
			if hdr != nil {
				h = hdr()
			}
			var b []byte
			if body != "" {
				b = []byte(body)
			}
			return q(ns, resource, params...), h, b
		}
	}
	withID := func(extra ...string) func() map[string]string {
		return func() map[string]string {
			h := reqID()
			for i := 0; i+1 < len(extra); i += 2 {
				h[extra[i]] = extra[i+1]
			}
			return h
		}
	}
	return map[string][]routeCase{
		"GET info": {{name: "info", request: fixed("info", nil, ""), write: false}},
		"GET kv":   {{name: "get", request: fixed("kv", nil, "", "key", isoKey)}},
		"PUT kv": {
			{name: "put", write: true, request: fixed("kv", withID(), "ATTACKER", "key", isoKey)},
			{name: "put if absent", write: true, request: fixed("kv", withID(wire.HeaderIfAbsent, "1"), "ATTACKER", "key", "fresh-"+newID())},
			{name: "put if version", write: true, request: func(t *testing.T, ts *testService, ns string) (string, map[string]string, []byte) {
				// The victim's current version of the key: the one
				// request that would succeed.
				a := ts.do(t, "GET", kvPath(isoVictim, isoKey), ts.tokens[isoVictim], nil, nil)
				if a.status != http.StatusOK {
					t.Fatalf("reading the victim's version: %d %+v", a.status, a.err)
				}
				return q(ns, "kv", "key", isoKey), withID(wire.HeaderIfVersion, a.header.Get(wire.HeaderVersion))(), []byte("ATTACKER")
			}},
		},
		"DELETE kv":       {{name: "delete", write: true, request: fixed("kv", withID(), "", "key", isoKey)}},
		"GET list":        {{name: "list", request: fixed("list", nil, "")}},
		"GET evals":       {{name: "evals list", request: fixed("evals", nil, "", "agent", isoAgent)}},
		"PUT evals":       {{name: "evals put", write: true, request: fixed("evals", nil, `{"by":"ATTACKER"}`, "agent", isoAgent, "run", "run-1")}},
		"DELETE evals":    {{name: "evals delete", write: true, request: fixed("evals", nil, "", "agent", isoAgent, "run", "run-1")}},
		"POST ab-samples": {{name: "ab sample", write: true, request: fixed("ab-samples", nil, `{"agent":"`+isoAgent+`","experiment":"exp","variant":"b","sessionId":"attacker-session","at":"2026-02-01T00:00:00Z","metrics":{"by":"ATTACKER"}}`)}},
		"GET ab-snapshot": {{name: "ab snapshot get", request: fixed("ab-snapshot", nil, "", "agent", isoAgent)}},
		"PUT ab-snapshot": {{name: "ab snapshot put", write: true, request: fixed("ab-snapshot", nil, `{"by":"ATTACKER"}`, "agent", isoAgent)}},
		"GET memory":      {{name: "memory list", request: fixed("memory", nil, "", "agent", isoAgent)}},
		"POST memory":     {{name: "memory append", write: true, request: fixed("memory", withID(), `{"by":"ATTACKER"}`, "agent", isoAgent)}},
	}
}

// seedVictim gives the victim something in every table, each holding
// isoMarker; it runs before every case (a case's own request, sent by
// the victim, may have deleted or replaced it).
func seedVictim(t *testing.T, ts *testService) {
	t.Helper()
	tok := ts.tokens[isoVictim]
	ns := "/v1/ns/" + isoVictim
	for _, w := range []struct {
		method, path string
		hdr          map[string]string
		body         string
		status       int
	}{
		{"PUT", kvPath(isoVictim, isoKey), reqID(), isoMarker + ":kv", http.StatusNoContent},
		{"PUT", ns + "/evals?agent=" + isoAgent + "&run=run-1", nil, `{"note":"` + isoMarker + `:eval"}`, http.StatusNoContent},
		{"POST", ns + "/ab-samples", nil, `{"agent":"` + isoAgent + `","experiment":"exp","variant":"a","sessionId":"s1","at":"2026-01-01T00:00:00Z","metrics":{"note":"` + isoMarker + `:sample"}}`, http.StatusNoContent},
		{"PUT", ns + "/ab-snapshot?agent=" + isoAgent, nil, `{"note":"` + isoMarker + `:snapshot"}`, http.StatusNoContent},
		{"POST", ns + "/memory?agent=" + isoAgent, reqID(), `{"note":"` + isoMarker + `:memory"}`, http.StatusOK},
	} {
		if a := ts.do(t, w.method, w.path, tok, w.hdr, []byte(w.body)); a.status != w.status {
			t.Fatalf("seeding the victim: %s %s: %d %+v", w.method, w.path, a.status, a.err)
		}
	}
}

// namespaceRows reads every row of every table of the SQLite backend that
// has a namespace column, for namespace ns: everything the namespace
// holds (its keys, request records, eval runs, A/B samples and
// snapshots, memory), whatever route wrote it. A table added later is
// read too.
func namespaceRows(t *testing.T, ts *testService, ns string) []string {
	t.Helper()
	st, ok := ts.svc.st.(*sqliteStore)
	if !ok {
		t.Fatalf("the isolation test reads the SQLite backend's tables; the service runs on %s", ts.svc.st.kind())
	}
	ctx := context.Background()
	tables, err := st.r.QueryContext(ctx, `SELECT m.name FROM sqlite_master m WHERE m.type = 'table'
		AND EXISTS (SELECT 1 FROM pragma_table_info(m.name) c WHERE c.name = 'ns') ORDER BY m.name`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for tables.Next() {
		var n string
		if err := tables.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := tables.Close(); err != nil {
		t.Fatal(err)
	}
	if len(names) < 5 {
		t.Fatalf("only %d tables with a namespace column (%v): the query no longer finds the service's tables", len(names), names)
	}
	var out []string
	for _, tbl := range names {
		rows, err := st.r.QueryContext(ctx, `SELECT * FROM "`+tbl+`" WHERE ns = ?`, ns)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			b.WriteString(tbl)
			for i, v := range vals {
				if bs, ok := v.([]byte); ok {
					v = string(bs)
				}
				fmt.Fprintf(&b, " %s=%v", cols[i], v)
			}
			out = append(out, b.String())
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	return out
}

// TestIsolationOnEveryRoute: on every route of the route table, a token
// of namespace alpha on namespace bravo's path gets 403 forbidden and
// changes nothing bravo holds, and its answer holds nothing of bravo's.
// Each case is then sent by bravo itself, which succeeds and (for a
// write) changes bravo's data or (for a read) returns it: so the
// attacker's request was one that would have worked. A route added to
// the table without a case here fails the test.
func TestIsolationOnEveryRoute(t *testing.T) {
	cases := routeCases()
	var tableKeys []string
	for _, rt := range routes {
		k := rt.method + " " + rt.resource
		tableKeys = append(tableKeys, k)
		if len(cases[k]) == 0 {
			t.Errorf("the route %s has no isolation case in routeCases: add one", k)
		}
	}
	for k := range cases {
		if !slices.Contains(tableKeys, k) {
			t.Errorf("routeCases has a case for %s, which is not in the route table", k)
		}
	}
	ts := newTestService(t, Options{}, isoAttacker, isoVictim)
	for _, k := range tableKeys {
		for _, rc := range cases[k] {
			t.Run(k+"/"+rc.name, func(t *testing.T) {
				seedVictim(t, ts)
				method, _, _ := strings.Cut(k, " ")
				before := namespaceRows(t, ts, isoVictim)
				path, hdr, body := rc.request(t, ts, isoVictim)
				a := ts.do(t, method, path, ts.tokens[isoAttacker], hdr, body)
				if a.status != http.StatusForbidden || a.err.Code != wire.CodeForbidden {
					t.Errorf("alpha's token on %s %s: %d %q (%s); want 403 %s", method, path, a.status, a.err.Code, a.err.Message, wire.CodeForbidden)
				}
				if strings.Contains(string(a.body), isoMarker) || strings.Contains(string(a.body), `"`+isoVictim+`"`) {
					t.Errorf("alpha's answer holds bravo's data: %s", trim(string(a.body)))
				}
				if after := namespaceRows(t, ts, isoVictim); !slices.Equal(before, after) {
					t.Errorf("alpha's request changed bravo's data:\nbefore %q\nafter  %q", before, after)
				}
				// The control: bravo's own token, the same request.
				path, hdr, body = rc.request(t, ts, isoVictim)
				own := ts.do(t, method, path, ts.tokens[isoVictim], hdr, body)
				if own.status/100 != 2 {
					t.Fatalf("bravo's own request %s %s: %d %+v; the case does not exercise the route", method, path, own.status, own.err)
				}
				if rc.write {
					if after := namespaceRows(t, ts, isoVictim); slices.Equal(before, after) {
						t.Fatalf("bravo's own %s %s changed nothing; the case does not show that a write was stopped", method, path)
					}
				} else if !strings.Contains(string(own.body), isoMarker) && !strings.Contains(string(own.body), `"`+isoVictim+`"`) {
					t.Fatalf("bravo's own %s %s returned nothing of bravo's (%s); the case does not show that a read was stopped", method, path, trim(string(own.body)))
				}
			})
		}
	}
}

// TestRouteTableIsTheRouter: the route table is what the router serves:
// every entry answers something other than 404 no_route or 405, every
// other method on a known resource is 405 with an Allow header naming the
// table's methods, and the 404 for an unknown resource names every
// resource of the table.
func TestRouteTableIsTheRouter(t *testing.T) {
	ts := newTestService(t, Options{}, isoAttacker)
	tok := ts.tokens[isoAttacker]
	methods := map[string][]string{}
	for _, rt := range routes {
		methods[rt.resource] = append(methods[rt.resource], rt.method)
	}
	for res, ms := range methods {
		for _, m := range []string{"GET", "PUT", "POST", "DELETE", "PATCH"} {
			a := ts.do(t, m, "/v1/ns/"+isoAttacker+"/"+res, tok, nil, nil)
			if slices.Contains(ms, m) {
				if a.err.Code == wire.CodeNoRoute || a.status == http.StatusMethodNotAllowed {
					t.Errorf("%s %s is in the route table but answers %d %s", m, res, a.status, a.err.Code)
				}
				continue
			}
			if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != strings.Join(ms, ", ") {
				t.Errorf("%s %s: %d, Allow %q; want 405 with Allow %q", m, res, a.status, a.header.Get("Allow"), strings.Join(ms, ", "))
			}
		}
	}
	a := ts.do(t, "GET", "/v1/ns/"+isoAttacker+"/nothing", tok, nil, nil)
	if a.status != http.StatusNotFound || a.err.Code != wire.CodeNoRoute {
		t.Fatalf("an unknown resource: %d %s", a.status, a.err.Code)
	}
	for res := range methods {
		if !strings.Contains(a.err.Message, res) {
			t.Errorf("the 404 for an unknown resource does not name %s: %s", res, a.err.Message)
		}
	}
}

// TestRouteTableIsDocumented: docs/hosted-protocol.md describes exactly
// the routes of the route table.
func TestRouteTableIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/hosted-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile(`\b(GET|PUT|POST|DELETE|PATCH) /v1/ns/\{ns\}/([a-z-]+)`).FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]+" "+m[2]] = true
	}
	served := map[string]bool{}
	for _, rt := range routes {
		k := rt.method + " " + rt.resource
		served[k] = true
		if !documented[k] {
			t.Errorf("the route %s is not in docs/hosted-protocol.md", k)
		}
	}
	for k := range documented {
		if !served[k] {
			t.Errorf("docs/hosted-protocol.md describes %s, which the service does not serve", k)
		}
	}
}
