package keys

import (
	"crypto/sha256"
	"encoding/hex"
)

// TokenDigest returns what is stored of a continuation token: the
// lowercase hex SHA-256 of the token (02-keys.md). A token is a bearer
// credential for its session, so it is never stored in plain, in a key or
// a value: continuations/{digest} names the session, session records
// carry the digest, and a presented token is looked up by its digest. A
// plain hash suffices because tokens are 256-bit random strings; no
// dictionary or brute force reaches one.
func TokenDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// IsTokenDigest reports whether s has the form TokenDigest returns: 64
// lowercase hex digits. A continuation token never has it (tokens are
// 43 base64url characters), so a record written under a plain token by
// an earlier build is told apart.
func IsTokenDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
