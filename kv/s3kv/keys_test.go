package s3kv

import (
	"strings"
	"testing"
	"unicode/utf8"
)

var codecKeys = []string{
	"a", "a/", "/a", "/", "//", "a//b", "a/b", "a/bc", "ab", "x", "x/y", "x/y/z", "x.y", "x/.", "..", ".", "a/../x",
	"a!", "!", "!-", "!_", "a!_", "a_b", "a-b", "=", "%2F", "sha256:abc", "héllo", "agentkit/v1/bot/sessions/s%201/meta",
	"!~*'()%/:", "a b", "\x01\xff", ".sgwtmp", "x/.sgwtmp/y",
	strings.Repeat("%", 1024), strings.Repeat("é", 512), strings.Repeat("a", 1024),
	strings.Repeat("a", 199) + "%" + strings.Repeat("b", 300),
	strings.Repeat("a", 198) + "%" + strings.Repeat("b", 300),
	strings.Repeat("a", 200) + "/" + strings.Repeat("b", 200),
	strings.Repeat("a", 200), strings.Repeat("a", 201), strings.Repeat("a", 400),
	strings.Repeat("a/", 300),
}

// components checks the rules a posix-backed server imposes on a name.
func checkName(t testing.TB, key, name string) {
	t.Helper()
	if len(name) > 4000 {
		t.Errorf("encodeKey(%q) is %d bytes long", key, len(name))
	}
	for c := range strings.SplitSeq(name, "/") {
		switch {
		case c == "" || c == "." || c == "..":
			t.Errorf("encodeKey(%q) = %q has the component %q", key, name, c)
		case len(c) > 255:
			t.Errorf("encodeKey(%q) has a %d-byte component", key, len(c))
		case c[0] == '.':
			t.Errorf("encodeKey(%q) has the hidden component %q", key, c)
		}
		for i := 0; i < len(c); i++ {
			if !plain(c[i]) && c[i] != '!' {
				t.Errorf("encodeKey(%q) = %q has the byte %q", key, name, c[i])
				break
			}
		}
	}
}

func TestEncodeKey(t *testing.T) {
	seen := map[string]string{}
	names := map[string]bool{}
	for _, k := range codecKeys {
		name := encodeKey(k)
		checkName(t, k, name)
		if got, ok := decodeKey(name); !ok || got != k {
			t.Errorf("decodeKey(encodeKey(%q)) = %q, %v", k, got, ok)
		}
		if prev, dup := seen[name]; dup {
			t.Errorf("%q and %q both encode to %q", prev, k, name)
		}
		seen[name] = k
		names[name] = true
	}
	// No object name is a folder of another: the key x and the key x/y
	// can both be stored on a posix backend.
	for a := range names {
		for b := range names {
			if strings.HasPrefix(b, a+"/") {
				t.Errorf("object %q would be a folder holding %q", a, b)
			}
		}
	}
	for _, c := range []struct{ key, name string }{
		{"x", "x!"},
		{"x/y", "x/y!"},
		{"a/", "a/!-!"},
		{"a.b", "a!2Eb!"},
		{"a//b", "a/!-/b!"},
		{"a/../x", "a/!2E!2E/x!"},
		{"alert-memory%2Fabc", "alert-memory!252Fabc!"},
		{"agentkit/v1/bot/sessions/s1/meta", "agentkit/v1/bot/sessions/s1/meta!"},
	} {
		if got := encodeKey(c.key); got != c.name {
			t.Errorf("encodeKey(%q) = %q, want %q", c.key, got, c.name)
		}
	}
}

func TestDecodeKeyRejectsForeignNames(t *testing.T) {
	for _, n := range []string{"", "x", "x/", "x!/", "a!2e!", "!41!", "a!_!", "a!_", "a/!-!_/b!", "a!2!", "!!", "a//b!", "a!-!", "!-a!"} {
		if k, ok := decodeKey(n); ok {
			t.Errorf("decodeKey(%q) = %q, want rejection", n, k)
		}
	}
}

func TestListPrefixCoversKeys(t *testing.T) {
	for _, k := range codecKeys {
		name := encodeKey(k)
		for i := 0; i <= len(k); i++ {
			p := k[:i]
			if !utf8.ValidString(p) {
				continue
			}
			if lp := listPrefix(p); !strings.HasPrefix(name, lp) {
				t.Errorf("listPrefix(%q) = %q is not a prefix of %q, the name of %q", p, lp, name, k)
			}
		}
	}
	if lp := listPrefix("a/b/c"); lp != "a/b/c" {
		t.Errorf(`listPrefix("a/b/c") = %q`, lp)
	}
	if lp := listPrefix("a/"); lp != "a/" {
		t.Errorf(`listPrefix("a/") = %q`, lp)
	}
}

func FuzzKeyCodec(f *testing.F) {
	for _, k := range codecKeys {
		f.Add(k, "x", 3)
	}
	f.Fuzz(func(t *testing.T, a, b string, n int) {
		if len(a) > 1024 || len(b) > 1024 {
			return
		}
		na, nb := encodeKey(a), encodeKey(b)
		checkName(t, a, na)
		if got, ok := decodeKey(na); !ok || got != a {
			t.Fatalf("decodeKey(encodeKey(%q)) = %q, %v", a, got, ok)
		}
		if (a == b) != (na == nb) {
			t.Fatalf("injectivity: %q -> %q, %q -> %q", a, na, b, nb)
		}
		if strings.HasPrefix(nb, na+"/") {
			t.Fatalf("%q is a folder of %q", na, nb)
		}
		if n < 0 {
			n = -n
		}
		p := a[:n%(len(a)+1)]
		if lp := listPrefix(p); !strings.HasPrefix(na, lp) {
			t.Fatalf("listPrefix(%q) = %q does not cover %q (%q)", p, lp, a, na)
		}
		if got, ok := decodeKey(b); ok && encodeKey(got) != b {
			t.Fatalf("decodeKey(%q) = %q, which encodes to %q", b, got, encodeKey(got))
		}
	})
}
