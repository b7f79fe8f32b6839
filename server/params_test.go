package server_test

import (
	"net/http"
	"strings"
	"testing"

	"agentkit/agent"
	"agentkit/server"
)

// Every integer query parameter of the API (limit and after, on every
// route that takes them, the event stream included) says "out of range"
// and names the range for a whole number outside it, however many digits
// it has, and "not a whole number" only for what is not one.
func TestIntegerParametersNameTheirRange(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	var s agent.TurnResult
	if st := f.do("POST", "/v1/sessions", `{"message":"hello"}`, &s); st != http.StatusCreated {
		t.Fatalf("start: %d", st)
	}
	const limitRange, afterRange = "use 1 to 1000, or leave it out for 50", "use 0 to 9223372036854775807"
	huge := "99999999999999999999"
	long := strings.Repeat("7", 5000)
	for _, route := range []struct {
		path  string
		after bool
		hdr   http.Header
	}{
		{"/v1/sessions", false, nil},
		{"/v1/sessions/" + s.SessionID + "/events", true, nil},
		{"/v1/sessions/" + s.SessionID + "/events", true, http.Header{"Accept": {"text/event-stream"}}},
		{"/v1/sessions/" + s.SessionID + "/messages", true, nil},
	} {
		cases := []struct{ query, want string }{
			{"limit=" + huge, "limit: " + huge + " is out of range; " + limitRange},
			{"limit=-3", "limit: -3 is out of range; " + limitRange},
			{"limit=0", "limit: 0 is out of range; " + limitRange},
			{"limit=1001", "limit: 1001 is out of range; " + limitRange},
			{"limit=-" + huge, "limit: -" + huge + " is out of range"},
			{"limit=" + long, "limit: 77777777777777777777… is out of range; " + limitRange},
			{"limit=abc", `limit: "abc" is not a whole number; use one from 1 to 1000`},
			{"limit=2.5", `limit: "2.5" is not a whole number`},
		}
		if route.after {
			cases = append(cases,
				struct{ query, want string }{"after=" + huge, "after: " + huge + " is out of range; " + afterRange},
				struct{ query, want string }{"after=-1", "after: -1 is out of range; " + afterRange},
				struct{ query, want string }{"after=1e3", `after: "1e3" is not a whole number; use one from 0 to 9223372036854775807`},
			)
		}
		for _, c := range cases {
			resp := f.send("GET", route.path+"?"+c.query, "", route.hdr)
			var e apiError
			decodeJSON(t, resp, &e)
			if resp.StatusCode != http.StatusBadRequest || e.Error.Code != server.CodeInvalid || !strings.Contains(e.Error.Message, c.want) {
				t.Errorf("GET %s?%.40s: %d %q %q; want 400 saying %q", route.path, c.query, resp.StatusCode, e.Error.Code, e.Error.Message, c.want)
			}
			if len(e.Error.Message) > 200 {
				t.Errorf("GET %s?%.40s: a %d-byte message; want the value cut short", route.path, c.query, len(e.Error.Message))
			}
		}
	}
}
