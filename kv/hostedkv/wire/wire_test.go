package wire

import (
	"strings"
	"testing"
)

func TestVersionRoundTrip(t *testing.T) {
	for _, n := range []int64{1, 9, 1207, 1<<63 - 1} {
		tok := FormatVersion("k2m9q4xa", n)
		e, got, ok := ParseVersion(tok)
		if !ok || e != "k2m9q4xa" || got != n {
			t.Errorf("ParseVersion(%q) = %q, %d, %v", tok, e, got, ok)
		}
	}
	for _, bad := range []string{"", ".", "k2m9q4xa", "k2m9q4xa.", ".12", "k2m9q4xa.0", "k2m9q4xa.-1", "k2m9q4xa.012",
		"K2M9.12", "k2m9.1 2", "k2m9.12.3", "k2m9.99999999999999999999", "kvtest-never-issued", strings.Repeat("a", 33) + ".1"} {
		if _, _, ok := ParseVersion(bad); ok {
			t.Errorf("ParseVersion(%q) accepted a token FormatVersion cannot make", bad)
		}
	}
}

func TestNames(t *testing.T) {
	for ns, want := range map[string]bool{
		"a": true, "acme-prod": true, "a1": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a-": false, "A": false, "a_b": false, "a/b": false, "..": false, "a.b": false,
		strings.Repeat("a", 64): false, "a\x00": false,
	} {
		if ValidNamespace(ns) != want {
			t.Errorf("ValidNamespace(%q) = %v, want %v", ns, !want, want)
		}
	}
	for id, want := range map[string]bool{
		"abcdefgh": true, "3kQ9vY1x-Hc2yEw7r0fZpg": true, strings.Repeat("a", 64): true,
		"short": false, strings.Repeat("a", 65): false, "with space": false, "abc/defgh": false,
	} {
		if ValidRequestID(id) != want {
			t.Errorf("ValidRequestID(%q) = %v, want %v", id, !want, want)
		}
	}
}
