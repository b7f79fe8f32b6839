package server

import (
	"net/http"
	"slices"
	"strings"
)

// router is the server's http.ServeMux, recording the patterns registered
// on it: the route table that Routes returns, auth tests walk and the 405
// check reads.
type router struct {
	*http.ServeMux
	patterns []string
	// methods lists, per literal path (one without wildcards), the methods
	// registered for it.
	methods map[string][]string
}

func newRouter() *router {
	return &router{ServeMux: http.NewServeMux(), methods: map[string][]string{}}
}

// HandleFunc registers a handler function for pattern and records it.
func (m *router) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Handle registers a handler for pattern and records it.
func (m *router) Handle(pattern string, h http.Handler) {
	m.ServeMux.Handle(pattern, h)
	m.patterns = append(m.patterns, pattern)
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || strings.Contains(path, "{") {
		return
	}
	m.methods[path] = append(m.methods[path], method)
	if method == http.MethodGet {
		m.methods[path] = append(m.methods[path], http.MethodHead) // the mux answers HEAD with GET
	}
	slices.Sort(m.methods[path])
}

// Routes returns the patterns of every route the server answers, such as
// "POST /v1/sessions" and "GET /v1/sessions/{id}", in registration order.
func (s *Server) Routes() []string { return slices.Clone(s.mux.patterns) }

// shadowed returns, for a request to a literal path (a registered path
// without wildcards) with a method that path does not take, the methods it
// takes, joined for an Allow header; else "". pattern is the route the mux
// chose ("" for none). Without it, GET /v1/sessions/continue would be taken
// by GET /v1/sessions/{id} as a session named "continue", instead of a 405.
func (m *router) shadowed(r *http.Request, pattern string) string {
	methods, ok := m.methods[r.URL.Path]
	if !ok {
		return ""
	}
	if _, path, _ := strings.Cut(pattern, " "); path == r.URL.Path {
		return ""
	}
	return strings.Join(methods, ", ")
}
