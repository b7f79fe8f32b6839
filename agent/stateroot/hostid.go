package stateroot

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"agentkit/internal/atomicfile"
)

// HostIDFile holds the state root's host id.
const HostIDFile = "HOST_ID"

// HostID returns the state root's host id, made on first use and kept in
// HOST_ID: the host name (letters, digits, '-' and '.', at most 40) and 8
// random hex digits, such as "web-1-3f2a9c1b". It names this host in what
// it writes to a shared store (session heads, reminder claims) and in logs.
// It is stable across restarts and unique to the state root; a state root
// restored from a backup onto another machine keeps it, which is harmless:
// nothing relies on it for correctness, only for telling hosts apart.
func (r *Root) HostID() (string, error) {
	path := filepath.Join(r.dir, HostIDFile)
	if b, err := os.ReadFile(path); err == nil {
		id := strings.TrimSpace(string(b))
		if id != "" && len(id) <= 64 && !strings.ContainsAny(id, " \t\r\n\x00") {
			return id, nil
		}
		return "", fmt.Errorf("stateroot: %s does not hold a host id (%q); delete it to make a new one", path, clip(id))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("stateroot: reading the host id: %w", err)
	}
	id := newHostID()
	if err := atomicfile.Write(path, []byte(id+"\n"), &atomicfile.Options{Perm: FilePerm}); err != nil {
		return "", fmt.Errorf("stateroot: writing the host id: %w", err)
	}
	return id, nil
}

// newHostID makes a host id from the host name and a random suffix.
func newHostID() string {
	name, _ := os.Hostname()
	var b strings.Builder
	for _, c := range strings.ToLower(name) {
		if b.Len() >= 40 {
			break
		}
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' {
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		b.WriteString("host")
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	return b.String() + "-" + hex.EncodeToString(r[:])
}
