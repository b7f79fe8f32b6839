package filekv

import (
	"strings"
	"testing"

	"agentkit/kv"
)

// decodeRel turns a path made by keyPath back into a key, reading each name
// as the walker does (folders, then the key's file).
func decodeRel(t testing.TB, rel string) string {
	t.Helper()
	names := strings.Split(rel, "/")
	var key, pending strings.Builder
	for i, n := range names {
		last := i == len(names)-1
		kind, text := classify(n, !last, last)
		switch kind {
		case kindFile:
			if !last {
				t.Fatalf("%q: a file name %q in the middle", rel, n)
			}
			key.WriteString(pending.String() + text)
			return key.String()
		case kindCont:
			pending.WriteString(text)
		case kindDir:
			key.WriteString(pending.String() + text + "/")
			pending.Reset()
		default:
			t.Fatalf("%q: name %q does not decode", rel, n)
		}
	}
	t.Fatalf("%q: no file name at the end", rel)
	return ""
}

func checkPath(t testing.TB, key string) string {
	t.Helper()
	dir, file := keyPath(key)
	rel := joinRel(dir, file)
	names := strings.Split(rel, "/")
	for i, n := range names {
		switch {
		case n == "" || n == "." || n == "..":
			t.Fatalf("key %q: path %q has the name %q", key, rel, n)
		case n[0] == '.':
			t.Fatalf("key %q: path %q has a hidden name %q", key, rel, n)
		case len(n) > 255:
			t.Fatalf("key %q: name of %d bytes (limit 255)", key, len(n))
		case strings.ContainsAny(n, "\x00\\"):
			t.Fatalf("key %q: name %q has NUL or a backslash", key, n)
		case i < len(names)-1 && strings.HasSuffix(n, fileSuffix):
			t.Fatalf("key %q: folder name %q ends like a file", key, n)
		case i == len(names)-1 && !strings.HasSuffix(n, fileSuffix):
			t.Fatalf("key %q: file name %q lacks %s", key, n, fileSuffix)
		}
	}
	if got := decodeRel(t, rel); got != key {
		t.Fatalf("key %q: path %q decodes to %q", key, rel, got)
	}
	if !canonical(key, rel) {
		t.Fatalf("key %q: path %q is not canonical", key, rel)
	}
	return rel
}

func TestKeyPathExamples(t *testing.T) {
	for _, c := range []struct{ key, rel string }{
		{"a", "a.kv"},
		{"x/y", "x/y.kv"},
		{"agentkit/v1/bot/kv/alert-memory%2Fabc", "agentkit/v1/bot/kv/alert-memory%2Fabc.kv"},
		{"sha256:ab/t", "sha256:ab/t.kv"},
		{".", "+2E.kv"},
		{"..", "+2E..kv"},
		{"../etc/passwd", "+2E./etc/passwd.kv"},
		{"a/../b", "a/+2E./b.kv"},
		{"/abs", "+/abs.kv"},
		{"a/", "a/+.kv"},
		{"a//b", "a/+/b.kv"},
		{"x.kv", "x+2Ekv.kv"},
		{"x.kv/y", "x+2Ekv/y.kv"},
		{"a b+c", "a+20b+2Bc.kv"},
		{"héllo", "h+C3+A9llo.kv"},
		{"a,b", "a+2Cb.kv"},
		{".hidden/x", "+2Ehidden/x.kv"},
	} {
		if got := checkPath(t, c.key); got != c.rel {
			t.Errorf("key %q: path %q, want %q", c.key, got, c.rel)
		}
	}
}

// TestKeyPathNoAlias checks keys that a naive mapping confuses land on
// different files, none inside another's file.
func TestKeyPathNoAlias(t *testing.T) {
	keys := []string{"x", "x/y", "x.kv", "x.kv/y", "x+2Ekv", "a/", "a", "a//", "/a", "ab", "a/b",
		"+", "%2B", "+2B", ".", "..", "+2E", "a,", "a,/b", strings.Repeat("z", 240), strings.Repeat("z", 241),
		strings.Repeat("z", 240) + "/q", strings.Repeat("z", 480)}
	seen := map[string]string{}
	for _, k := range keys {
		rel := checkPath(t, k)
		if other, dup := seen[rel]; dup {
			t.Fatalf("keys %q and %q share the file %q", k, other, rel)
		}
		seen[rel] = k
	}
	for rel, k := range seen {
		for rel2, k2 := range seen {
			if strings.HasPrefix(rel2, rel+"/") {
				t.Errorf("key %q's file %q is a folder of key %q (%q)", k, rel, k2, rel2)
			}
		}
	}
}

func TestKeyPathLongSegments(t *testing.T) {
	for _, key := range []string{
		strings.Repeat("a", kv.MaxKeyLength),
		strings.Repeat("é", kv.MaxKeyLength/2),
		strings.Repeat(" ", kv.MaxKeyLength),
		strings.Repeat(".", kv.MaxKeyLength),
		strings.Repeat(".kv", kv.MaxKeyLength/3),
		strings.Repeat("a", 239) + "." + strings.Repeat("b", 300),
		"p/" + strings.Repeat("%", 1000) + "/q",
	} {
		rel := checkPath(t, key)
		if !strings.Contains(rel, contSuffix+"/") {
			t.Errorf("key of %d bytes did not need a continuation folder: %q", len(key), rel)
		}
	}
}

func FuzzKeyPath(f *testing.F) {
	for _, s := range []string{"a", "x/y", "..", "/", "//", "a.kv", "é/ü", strings.Repeat("+", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if kv.ValidateKey(key) != nil {
			return
		}
		checkPath(t, key)
	})
}

func TestDecodeRejectsForeignNames(t *testing.T) {
	for _, n := range []string{".lock", ".format", ".tmp-1", "a+2", "a+zz", "a b", "+,", ",", "x.kv"} {
		isDir := n == "x.kv" || strings.HasSuffix(n, ",")
		if kind, _ := classify(n, isDir, !isDir); kind != kindForeign {
			t.Errorf("classify(%q) = %v, want foreign", n, kind)
		}
	}
	// A spelling that decodes but is not the driver's (an escaped letter)
	// must not pass as the key.
	if canonical("a", "+61.kv") {
		t.Error(`"+61.kv" passed as the canonical file of "a"`)
	}
}
