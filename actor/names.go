package actor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
)

// maxNameLen is the longest encoded class or id used as a file name; a
// longer encoding is replaced by "=" and the hex SHA-256 of the raw bytes.
// File systems allow 255 bytes per name.
const maxNameLen = 128

// fileName encodes a class name or an actor id as one file name that is the
// same on every file system: a-z, 0-9, "-" and "_" stay as they are, every
// other byte (capitals included, so case-insensitive file systems cannot
// merge two names) becomes %XX. An encoding longer than maxNameLen becomes
// "=" followed by the hex SHA-256 of raw; no plain encoding holds "=", so
// the two forms never collide. The raw names are kept in the database.
func fileName(raw string) string {
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b = append(b, c)
		} else {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&15])
		}
		if len(b) > maxNameLen {
			sum := sha256.Sum256([]byte(raw))
			return "=" + hex.EncodeToString(sum[:])
		}
	}
	return string(b)
}

// checkName refuses an empty class name or actor id.
func checkName(what, raw string) error {
	if raw == "" {
		return fmt.Errorf("%w: the %s is empty; give a non-empty %s", ErrInvalidName, what, what)
	}
	return nil
}

// ErrInvalidName means a class name or an actor id is empty.
var ErrInvalidName = errors.New("actor: invalid name")

// Files of one actor's folder, actors/{class}/{id}/.
const (
	systemFile = "system.db" // state, messages, events, schedules
	dataFile   = "data.db"   // the author's own SQL database
	indexFile  = "schedules.db"
)

// actorDir is the folder of one actor under the actors folder.
func actorDir(root, class, id string) string {
	return filepath.Join(root, fileName(class), fileName(id))
}
