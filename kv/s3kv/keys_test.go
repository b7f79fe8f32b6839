package s3kv

import (
	"strings"
	"testing"
	"unicode/utf8"

	"agentkit/kv/kvtest"
)

var codecKeys = []string{
	"a", "a/", "/a", "/", "//", "a//b", "a/b", "a/bc", "ab", "x", "x/y", "x/y/z", "x.y", "x/.", "..", ".", "a/../x",
	"a!", "!", "!-", "!_", "a!_", "a_b", "a-b", "=", "%2F", "sha256:abc", "héllo", "agentkit/v1/bot/sessions/s%201/meta",
	"!~*'()%/:", "a b", "\x01\x7f", ".sgwtmp", "x/.sgwtmp/y", "back\\slash", "\uffff", "\ufffe/x", "a!#0123456789abcdef0123456789abcdef!",
	strings.Repeat("%", 1024), strings.Repeat("é", 512), strings.Repeat("a", 1024),
	strings.Repeat("a", 199) + "%" + strings.Repeat("b", 300),
	strings.Repeat("a", 198) + "%" + strings.Repeat("b", 300),
	strings.Repeat("a", 199) + "é" + strings.Repeat("b", 300),
	strings.Repeat("a", 200) + "..", strings.Repeat("a", 200) + ".", strings.Repeat("a", 200) + ".x",
	strings.Repeat("a", 200) + "/" + strings.Repeat("b", 200),
	strings.Repeat("a", 200), strings.Repeat("a", 201), strings.Repeat("a", 400),
	strings.Repeat("a/", 300), strings.Repeat("\x01", 300),
}

func allKeys() []string {
	keys := append([]string{}, codecKeys...)
	keys = append(keys, kvtest.WeirdKeys()...)
	keys = append(keys, kvtest.LongKeys()...)
	return append(keys, kvtest.UTF8Keys()...)
}

// checkName checks the rules servers impose on a name (relative to the
// store's prefix) of format 2.
func checkName(t testing.TB, key, name string) {
	t.Helper()
	if !utf8.ValidString(name) {
		t.Errorf("the name of %q is not valid UTF-8: %q", key, name)
	}
	for c := range strings.SplitSeq(name, "/") {
		switch {
		case c == "" || c == "." || c == "..":
			t.Errorf("the name of %q, %q, has the component %q", key, name, c)
		case len(c) > 255:
			t.Errorf("the name of %q has a %d-byte component", key, len(c))
		case c[0] == '.':
			t.Errorf("the name of %q has the hidden component %q", key, c)
		}
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '\\' {
			t.Errorf("the name of %q, %q, has the byte %q", key, name, c)
		}
	}
	if strings.Contains(name, "\uffff") || strings.Contains(name, "\ufffe") {
		t.Errorf("the name of %q, %q, has a character XML cannot carry", key, name)
	}
}

// store2 is a format 2 store with a prefix of n bytes, enough to compute
// names offline.
func store2(n int) *Store {
	s := &Store{prefix: strings.Repeat("p", n), room: maxName - n}
	s.setFormat(2)
	return s
}

func TestEncodeFormat2(t *testing.T) {
	seen := map[string]string{}
	names := map[string]bool{}
	for _, k := range allKeys() {
		name := codecV2.encode(k)
		checkName(t, k, name)
		if got, ok := codecV2.decode(name); !ok || got != k {
			t.Errorf("decode(encode(%q)) = %q, %v", k, got, ok)
		}
		if prev, dup := seen[name]; dup && prev != k {
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
		{"a.b", "a.b!"},
		{".hidden/.x", "!2Ehidden/!2Ex!"},
		{"a//b", "a/!-/b!"},
		{"a/../x", "a/!2E./x!"},
		{"wow!", "wow!21!"},
		{"tab\tx", "tab!09x!"},
		{"alert-memory%2Fabc", "alert-memory%2Fabc!"},
		{"agentkit/v1/a/continuations/sha256%3Aabc", "agentkit/v1/a/continuations/sha256%3Aabc!"},
		{"héllo wörld", "héllo wörld!"},
		{"\uffff", "!EF!BF!BF!"},
		{strings.Repeat("a", 200) + ".b", strings.Repeat("a", 200) + "!_/!2Eb!"},
	} {
		if got := codecV2.encode(c.key); got != c.name {
			t.Errorf("encode(%q) = %q, want %q", c.key, got, c.name)
		}
	}
}

// Format 1 stays exactly what earlier releases wrote, so their stores
// still read.
func TestEncodeFormat1Unchanged(t *testing.T) {
	for _, c := range []struct{ key, name string }{
		{"x", "x!"},
		{"x/y", "x/y!"},
		{"a/", "a/!-!"},
		{"a.b", "a!2Eb!"},
		{"a//b", "a/!-/b!"},
		{"a/../x", "a/!2E!2E/x!"},
		{"alert-memory%2Fabc", "alert-memory!252Fabc!"},
		{"agentkit/v1/bot/sessions/s1/meta", "agentkit/v1/bot/sessions/s1/meta!"},
		{"é", "!C3!A9!"},
		{strings.Repeat("a", 199) + "%b", strings.Repeat("a", 199) + "!_/!25b!"},
	} {
		if got := codecV1.encode(c.key); got != c.name {
			t.Errorf("format 1: encode(%q) = %q, want %q", c.key, got, c.name)
		}
		if got, ok := codecV1.decode(c.name); !ok || got != c.key {
			t.Errorf("format 1: decode(%q) = %q, %v", c.name, got, ok)
		}
	}
}

func TestDecodeRejectsForeignNames(t *testing.T) {
	for _, n := range []string{"", "x", "x/", "x!/", "a!2e!", "!41!", "a!_!", "a!_", "a/!-!_/b!", "a!2!", "!!", "a//b!", "a!-!", "!-a!", "!format", ".x!", "a/.b!", "a\\b!", "a\x01!", "a!#0123456789abcdef0123456789abcdef!"} {
		if k, ok := codecV2.decode(n); ok {
			t.Errorf("decode(%q) = %q, want rejection", n, k)
		}
	}
}

func TestListPrefixCoversKeys(t *testing.T) {
	for _, codec := range []keyCodec{codecV1, codecV2} {
		for _, k := range allKeys() {
			name := codec.encode(k)
			for i := 0; i <= len(k); i++ {
				p := k[:i]
				if !utf8.ValidString(p) {
					continue
				}
				if lp := codec.listPrefix(p); !strings.HasPrefix(name, lp) {
					t.Fatalf("listPrefix(%q) = %q is not a prefix of %q, the name of %q", p, lp, name, k)
				}
			}
		}
	}
	if lp := codecV2.listPrefix("a/b/c"); lp != "a/b/c" {
		t.Errorf(`listPrefix("a/b/c") = %q`, lp)
	}
	if lp := codecV2.listPrefix("a/.b"); lp != "a/!2Eb" {
		t.Errorf(`listPrefix("a/.b") = %q`, lp)
	}
}

// Keys whose name passes S3's 1,024 bytes get a bounded name that fits,
// that no other key's name equals, that a listing prefix still matches,
// and that the listing recognises.
func TestLongNamesFitAndList(t *testing.T) {
	for _, prefixLen := range []int{0, 100, maxPrefix} {
		s := store2(prefixLen)
		seen := map[string]string{}
		for _, k := range allKeys() {
			name, long := s.object(k)
			rel := name[prefixLen:]
			if len(name) > maxName {
				t.Fatalf("prefix %d: the name of %q is %d bytes", prefixLen, k, len(name))
			}
			checkName(t, k, rel)
			if long != (len(codecV2.encode(k)) > s.room) {
				t.Errorf("prefix %d: %q long = %v", prefixLen, k, long)
			}
			if long != isLongName(rel) {
				t.Errorf("prefix %d: isLongName(%q) = %v, want %v", prefixLen, rel, !long, long)
			}
			if _, ok := codecV2.decode(rel); long && ok {
				t.Errorf("prefix %d: the bounded name %q decodes as a key", prefixLen, rel)
			}
			if prev, dup := seen[name]; dup && prev != k {
				t.Errorf("prefix %d: %q and %q share the object %q", prefixLen, prev, k, name)
			}
			seen[name] = k
			for i := 0; i <= len(k); i++ {
				p := k[:i]
				if !utf8.ValidString(p) {
					continue
				}
				lp := codecV2.listPrefix(p)
				lp = lp[:cutAt(lp, s.room-longTail-3)]
				if !strings.HasPrefix(rel, lp) {
					t.Fatalf("prefix %d: the listing prefix %q of %q does not match %q, the object of %q", prefixLen, lp, p, rel, k)
				}
			}
		}
		if _, long := s.object(strings.Repeat("%", 1024)); !long {
			t.Errorf("prefix %d: a 1,024-byte key of '%%' got its plain name", prefixLen)
		}
		if _, long := s.object("agentkit/v1/bot/sessions/s%201/meta"); long {
			t.Errorf("prefix %d: a short key got a bounded name", prefixLen)
		}
	}
}

func FuzzKeyCodec(f *testing.F) {
	for _, k := range codecKeys {
		f.Add(k, "x", 3)
	}
	s := store2(40)
	f.Fuzz(func(t *testing.T, a, b string, n int) {
		if len(a) > 1024 || len(b) > 1024 || !utf8.ValidString(a) || !utf8.ValidString(b) || strings.IndexByte(a+b, 0) >= 0 {
			return
		}
		na, nb := codecV2.encode(a), codecV2.encode(b)
		checkName(t, a, na)
		if got, ok := codecV2.decode(na); !ok || got != a {
			t.Fatalf("decode(encode(%q)) = %q, %v", a, got, ok)
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
		if !utf8.ValidString(p) {
			return
		}
		if lp := codecV2.listPrefix(p); !strings.HasPrefix(na, lp) {
			t.Fatalf("listPrefix(%q) = %q does not cover %q (%q)", p, lp, a, na)
		}
		name, _ := s.object(a)
		if len(name) > maxName {
			t.Fatalf("the object of %q is %d bytes", a, len(name))
		}
		if got, ok := codecV2.decode(b); ok && codecV2.encode(got) != b {
			t.Fatalf("decode(%q) = %q, which encodes to %q", b, got, codecV2.encode(got))
		}
	})
}
