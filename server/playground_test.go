package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestFaviconIsNot404: the page names its own icon, an embedded SVG, and
// /favicon.ico, which browsers ask for on any page of the server, answers
// 204 instead of a 404.
func TestFaviconIsNot404(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	get := func(path string) (*http.Response, string) {
		resp := f.send("GET", path, "", nil)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, page := get("/")
	if resp.StatusCode != 200 || !strings.Contains(page, `<link rel="icon" href="/playground/favicon.svg" type="image/svg+xml">`) {
		t.Fatalf("GET /: %d; the page does not name its icon", resp.StatusCode)
	}
	resp, icon := get("/playground/favicon.svg")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/svg+xml" || !strings.HasPrefix(icon, "<svg") {
		t.Errorf("GET /playground/favicon.svg: %d %q %.40q", resp.StatusCode, resp.Header.Get("Content-Type"), icon)
	}
	resp, body := get("/favicon.ico")
	if resp.StatusCode != http.StatusNoContent || body != "" || resp.Header.Get("Cache-Control") == "" {
		t.Errorf("GET /favicon.ico: %d %q, Cache-Control %q; want 204, empty, cached", resp.StatusCode, body, resp.Header.Get("Cache-Control"))
	}
}
