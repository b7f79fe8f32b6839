package kvtest

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"agentkit/kv"
)

// EncoderChars are the characters the key encoder (package keys) emits
// besides letters and digits: the unreserved set of percent-encoding, the
// percent sign itself, the segment separator and the colon of `sha256:`
// digests.
const EncoderChars = "-_.!~*'()%/:"

// WeirdKeys returns the suite's corpus of hard keys built only from
// characters the key encoder emits: each of EncoderChars alone, doubled, and
// between letters; upper and lower case; path-like traps (`..`, `//`, a
// leading or trailing slash); SQL LIKE wildcards; percent escapes; and keys
// shaped like the runtime's own. The keys are distinct, valid and unsorted.
// Drivers may use the corpus in their own tests.
func WeirdKeys() []string {
	var keys []string
	for _, c := range EncoderChars {
		s := string(c)
		keys = append(keys, s, s+s, "k"+s, s+"k", "k"+s+"k", "k"+s+s+"k")
	}
	keys = append(keys,
		"A", "Z", "a", "z", "0", "9",
		"Key", "key", "KEY", "kEy",
		"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "0123456789",
		"AZaz09"+EncoderChars,
		EncoderChars,
		// paths a file system or an object store may rewrite
		"a/../x", "./x", "../x", "x/.", "x/..", "a//b", "a///b", "/lead", "trail/", "a/./b", ".hidden", "x.", "x..y", "...",
		// SQL LIKE wildcards and their neighbours
		"a_c", "abc", "a%c", "aXc", "a__", "a%%",
		// percent escapes, well-formed or not
		"%2F", "%2f", "%00", "%25", "100%", "%zz", "%C3%A9", "a%2Fb",
		// quotes, globs and brackets of shells and query languages
		"it's", "'quoted'", "(paren)", "*", "**", "*.txt", "~", "~user", "!bang", "!",
		// shaped like the runtime's keys (02-keys.md)
		"agentkit/v1/slack/sessions/C0123%2Fthread%201/meta",
		"agentkit/v1/slack/sessions/C0123%2Fthread%201/events/00000000000000000001",
		"agentkit/v1/h%C3%A9llo/kv/alert-memory%2Fabc",
		"agentkit/v1/a/continuations/sha256%3Aabc",
		"agentkit/v1/a/ab-samples/exp/s1/2024-01-02T03%3A04%3A05.678Z",
		"agentkit/v1/a/durable-session/x:y/z",
		"sha256:"+strings.Repeat("0", 64),
	)
	return dedupe(keys)
}

// LongKeys returns keys at the length bounds: several of exactly
// kv.MaxKeyLength bytes (one segment, many segments, differing only in the
// last or the first byte), a 256-byte segment, and a 71-byte `sha256:`
// digest segment as the key encoder emits for long segments.
func LongKeys() []string {
	seg256 := cycle("aZ9-_.!~*'()%", 256)
	digest := sha256.Sum256([]byte("a long segment"))
	prefix := "agentkit/v1/agent/kv/"
	segmented := prefix + seg256 + "/" + seg256 + "/" + seg256 + "/"
	segmented += cycle("b", kv.MaxKeyLength-len(segmented)-1)
	keys := []string{
		strings.Repeat("k", kv.MaxKeyLength),
		strings.Repeat("k", kv.MaxKeyLength-1) + "l",
		"l" + strings.Repeat("k", kv.MaxKeyLength-1),
		segmented + "x",
		segmented + "y",
		cycle("seg/", kv.MaxKeyLength),
		prefix + seg256,
		prefix + seg256 + "/meta",
		prefix + "sha256:" + hex.EncodeToString(digest[:]),
		prefix + "sha256:" + hex.EncodeToString(digest[:]) + "/meta",
	}
	return dedupe(keys)
}

// UTF8Keys returns valid keys outside the encoder's alphabet that *kv.DB
// accepts and every driver must therefore store: non-ASCII letters, emoji,
// spaces and control characters (but never NUL), punctuation the encoder
// would escape, and a kv.MaxKeyLength key of two-byte characters.
func UTF8Keys() []string {
	keys := []string{
		"héllo", "HÉLLO", "日本語/キー", "emoji/😀", "\U0010FFFF", "\uFFFD", "e\u0301", // decomposed é
		"space key", " ", "  lead", "trail ", "tab\tkey", "nl\nkey", "cr\rkey", "\x01", "\x1f", "\x7f",
		`dq"`, `back\slash`, "semi;colon", "hash#frag", "q?x=1", "amp&", "eq=", "plus+", "comma,",
		"at@", "dollar$", "lt<gt>", "pipe|", "{brace}", "caret^", "`tick`", "[bracket]",
		strings.Repeat("é", kv.MaxKeyLength/2),
	}
	return dedupe(keys)
}

// cycle repeats s until the result is n bytes long.
func cycle(s string, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(s)
	}
	return b.String()[:n]
}

func dedupe(keys []string) []string {
	seen := make(map[string]bool, len(keys))
	out := keys[:0]
	for _, k := range keys {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return slices.Clip(out)
}
