package server

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// playgroundFiles are the playground page's assets, built into the binary:
// the page works offline, with no CDN.
//
//go:embed playground
var playgroundFiles embed.FS

// playgroundCSP confines the page to its own assets and the API.
const playgroundCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// playground answers GET /: the playground page. The page holds no data:
// everything it shows (sessions and their events, eval history, A/B
// figures) it reads from the /v1/ routes, with the bearer token when the
// server has one, so it shows nothing without the same auth as the API.
// The token is typed into the page once and kept in the tab's session
// storage.
func (s *Server) playground(w http.ResponseWriter, r *http.Request) {
	page, err := playgroundFiles.ReadFile("playground/index.html")
	if err != nil { // unreachable: the file is embedded
		writeError(w, http.StatusInternalServerError, CodeInternal, "the playground page is missing from this build")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", playgroundCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	w.Write(page)
}

// favicon answers GET /favicon.ico, which browsers ask for on any page of
// the server (a JSON route opened in a tab, say), with 204 No Content: no
// 404 in the log and the console, and no second copy of the icon. The
// playground page names its own icon, /playground/favicon.svg.
func favicon(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "max-age=86400")
	w.WriteHeader(http.StatusNoContent)
}

// playgroundAssets serves the page's scripts and styles under
// /playground/.
func playgroundAssets() http.Handler {
	sub, _ := fs.Sub(playgroundFiles, "playground")
	files := http.StripPrefix("/playground/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/playground/")
		if st, err := fs.Stat(sub, name); err != nil || st.IsDir() {
			writeError(w, http.StatusNotFound, CodeNotFound, "no playground asset "+r.URL.Path)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", playgroundCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
