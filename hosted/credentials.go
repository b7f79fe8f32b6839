package hosted

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"agentkit/internal/atomicfile"
	"agentkit/internal/privfile"
	"agentkit/kv/hostedkv/wire"
)

// The credentials file holds one entry per deployment token: its id, the
// namespace it owns, and HMAC-SHA256(server key, token) in hex. The server
// key is 32 random bytes in a second file (by default the credentials file's
// name with ".key" added), so neither file alone lets anyone check a guess.
//
// Why HMAC and not a slow password hash: the tokens are 256-bit random
// strings the service makes itself, never passwords a person chose, so there
// is nothing for a slow hash to protect against (a brute force of 2^256 is
// out of reach at any hash speed), while bcrypt or Argon2 would cost tens of
// milliseconds of CPU on every request, or a cache of accepted tokens in
// memory. The HMAC costs about a microsecond, and a stolen credentials file
// without the key is worthless.

// Credential is one entry of the credentials file.
type Credential struct {
	// ID names the credential in the file and in `credentials rm`; it is
	// also the token's second field, so the service finds the entry
	// without comparing against every hash.
	ID string `json:"id"`
	// Namespace is the namespace the token owns.
	Namespace string `json:"namespace"`
	// Hash is "hmac-sha256:" and the hex HMAC-SHA256 of the token under the
	// server key.
	Hash string `json:"hash"`
	// Created is when the credential was added.
	Created time.Time `json:"created"`
}

// credentialsFile is the file's JSON form.
type credentialsFile struct {
	Format      int          `json:"format"`
	Credentials []Credential `json:"credentials"`
}

const (
	credentialsFormat = 1
	tokenPrefix       = "akst_"
	hashPrefix        = "hmac-sha256:"
	keyBytes          = 32
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// KeyPath returns the default server key file for a credentials file: its
// path with ".key" added.
func KeyPath(credentialsPath string) string { return credentialsPath + ".key" }

// ErrNamespaceHasCredential is returned by AddCredential when the namespace
// already has a token and rotate is false.
var ErrNamespaceHasCredential = errors.New("hosted: the namespace already has a credential")

// AddCredential makes a new token for namespace, adds its hash to the
// credentials file at path (created if missing, mode 0600) and returns the
// token, which is shown nowhere else. The server key at keyPath is created
// when missing. A namespace has one credential; with rotate, a second one
// is added beside it so a deployment can move to the new token before the
// old one is removed. A running service picks the change up without a
// restart.
func AddCredential(path, keyPath, namespace string, rotate bool) (string, Credential, error) {
	if !wire.ValidNamespace(namespace) {
		return "", Credential{}, fmt.Errorf("hosted: the namespace %q is not usable: use %s", namespace, wire.NamespaceRule)
	}
	var token string
	var cred Credential
	err := editCredentials(path, func(f *credentialsFile) error {
		key, err := loadOrCreateKey(keyPath)
		if err != nil {
			return err
		}
		var ids []string
		for _, c := range f.Credentials {
			if c.Namespace == namespace {
				ids = append(ids, c.ID)
			}
		}
		if len(ids) > 0 && !rotate {
			return fmt.Errorf("%w: %q has credential %s; to rotate it, add a second one with --rotate, move the deployment to the new token, then remove %s",
				ErrNamespaceHasCredential, namespace, strings.Join(ids, ", "), ids[0])
		}
		id := randomText(5)
		for slices.ContainsFunc(f.Credentials, func(c Credential) bool { return c.ID == id }) {
			id = randomText(5)
		}
		token = tokenPrefix + id + "_" + randomText(keyBytes)
		cred = Credential{ID: id, Namespace: namespace, Hash: hashPrefix + hex.EncodeToString(mac(key, token)), Created: time.Now().UTC().Truncate(time.Second)}
		f.Credentials = append(f.Credentials, cred)
		return nil
	})
	return token, cred, err
}

// RemoveCredential removes the credential with the id (as ListCredentials
// shows it) and returns it. A running service stops accepting its token
// once it has reloaded the file (within a second, or at once on SIGHUP).
func RemoveCredential(path, id string) (Credential, error) {
	var removed Credential
	err := editCredentials(path, func(f *credentialsFile) error {
		i := slices.IndexFunc(f.Credentials, func(c Credential) bool { return c.ID == id })
		if i < 0 {
			ids := make([]string, len(f.Credentials))
			for j, c := range f.Credentials {
				ids[j] = c.ID
			}
			return fmt.Errorf("hosted: %s holds no credential %q (it has %s); run agentkit storaged credentials ls", path, id, orNone(ids))
		}
		removed = f.Credentials[i]
		f.Credentials = slices.Delete(f.Credentials, i, i+1)
		return nil
	})
	return removed, err
}

// ListCredentials returns the credentials in the file, sorted by namespace
// and creation time.
func ListCredentials(path string) ([]Credential, error) {
	f, err := readCredentials(path)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(f.Credentials)
	slices.SortFunc(out, func(a, b Credential) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return a.Created.Compare(b.Created)
	})
	return out, nil
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// editCredentials reads the file under an exclusive lock (a lock file
// beside it, so two commands editing at once do not lose an entry), lets fn
// change it and writes it back atomically: a temporary file, fsync,
// rename, fsync of the folder. A service reading the file sees either the
// old or the new version.
func editCredentials(path string, fn func(*credentialsFile) error) error {
	if path == "" {
		return errors.New("hosted: no credentials file given; pass --credentials FILE")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("hosted: create the credentials folder: %w", err)
	}
	lock, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, privfile.FilePerm)
	if err != nil {
		return fmt.Errorf("hosted: lock the credentials file: %w", err)
	}
	defer lock.Close()
	for {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("hosted: lock the credentials file: %w", err)
	}
	f, err := readCredentials(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = &credentialsFile{Format: credentialsFormat}, nil
	}
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		return err
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(data, '\n'))
}

// readCredentials reads and checks the credentials file, making it (and
// its lock file) owner-only first if it is not.
func readCredentials(path string) (*credentialsFile, error) {
	for _, p := range []string{path, path + ".lock"} {
		if err := privfile.Tighten(p); err != nil {
			return nil, fmt.Errorf("hosted: the credentials file: %w", err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("hosted: the credentials file %s does not exist; create it with agentkit storaged credentials add NAMESPACE --credentials %s: %w", path, path, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("hosted: read the credentials file: %w", err)
	}
	var f credentialsFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("hosted: the credentials file %s is not valid: %v; edit it with agentkit storaged credentials add|rm", path, err)
	}
	if f.Format != credentialsFormat {
		return nil, fmt.Errorf("hosted: the credentials file %s has format %d; this build reads format %d", path, f.Format, credentialsFormat)
	}
	ids := map[string]bool{}
	for i, c := range f.Credentials {
		switch {
		case ids[c.ID]:
			return nil, fmt.Errorf("hosted: the credentials file %s has the id %q twice", path, c.ID)
		case !validID(c.ID):
			return nil, fmt.Errorf("hosted: the credentials file %s: entry %d has an id that is not 8 characters of a-z and 2-7", path, i+1)
		case !wire.ValidNamespace(c.Namespace):
			return nil, fmt.Errorf("hosted: the credentials file %s: credential %s has the namespace %q; use %s", path, c.ID, c.Namespace, wire.NamespaceRule)
		}
		if _, err := parseHash(c.Hash); err != nil {
			return nil, fmt.Errorf("hosted: the credentials file %s: credential %s: %v", path, c.ID, err)
		}
		ids[c.ID] = true
	}
	return &f, nil
}

func parseHash(h string) ([]byte, error) {
	hx, ok := strings.CutPrefix(h, hashPrefix)
	b, err := hex.DecodeString(hx)
	if !ok || err != nil || len(b) != sha256.Size {
		return nil, errors.New(`the hash is not "hmac-sha256:" and 64 hex digits`)
	}
	return b, nil
}

func validID(id string) bool {
	if len(id) != 8 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// loadOrCreateKey reads the server key, making it when the file is missing.
func loadOrCreateKey(path string) ([]byte, error) {
	key, err := readKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	key = make([]byte, keyBytes)
	rand.Read(key)
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(key)+"\n")); err != nil {
		return nil, err
	}
	return key, nil
}

// readKey reads the server key file: 64 hex digits. A key file with group
// or other permissions (one written by hand or by a provisioning tool) is
// made owner-only first.
func readKey(path string) ([]byte, error) {
	if err := privfile.Tighten(path); err != nil {
		return nil, fmt.Errorf("hosted: the server key: %w", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("hosted: the server key file %s does not exist (agentkit storaged credentials add creates it): %w", path, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("hosted: read the server key: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != keyBytes {
		return nil, fmt.Errorf("hosted: the server key file %s must hold %d hex digits", path, 2*keyBytes)
	}
	return key, nil
}

// writeFileAtomic replaces path with data, mode 0600.
func writeFileAtomic(path string, data []byte) error {
	if err := atomicfile.Write(path, data, nil); err != nil {
		return fmt.Errorf("hosted: write %s: %w", path, err)
	}
	return nil
}

func randomText(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return lowerBase32.EncodeToString(b)
}

func mac(key []byte, token string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(token))
	return h.Sum(nil)
}

// credentialSet is one loaded version of the credentials and the key.
type credentialSet struct {
	byID  map[string]credEntry
	key   []byte
	count map[string]int // credentials per namespace
}

type credEntry struct {
	namespace string
	hash      []byte
}

// loadCredentialSet reads both files.
func loadCredentialSet(path, keyPath string) (*credentialSet, error) {
	f, err := readCredentials(path)
	if err != nil {
		return nil, err
	}
	key, err := readKey(keyPath)
	if err != nil {
		return nil, err
	}
	set := &credentialSet{byID: map[string]credEntry{}, key: key, count: map[string]int{}}
	for _, c := range f.Credentials {
		h, _ := parseHash(c.Hash)
		set.byID[c.ID] = credEntry{namespace: c.Namespace, hash: h}
		set.count[c.Namespace]++
	}
	return set, nil
}

// dummyHash is compared against when a token names no credential, so a
// wrong id and a wrong secret take the same time.
var dummyHash = make([]byte, sha256.Size)

// authenticate returns the namespace a token owns.
func (s *credentialSet) authenticate(token string) (string, bool) {
	id := ""
	if rest, ok := strings.CutPrefix(token, tokenPrefix); ok && len(rest) > 9 && rest[8] == '_' {
		id = rest[:8]
	}
	e, found := s.byID[id]
	want := e.hash
	if !found {
		want = dummyHash
	}
	ok := hmac.Equal(mac(s.key, token), want)
	if !found || !ok {
		return "", false
	}
	return e.namespace, true
}

// fileStamp identifies a version of a file: size, modification time and
// inode, so an atomic replace is seen even within one timestamp tick.
func fileStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "missing"
	}
	ino := uint64(0)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return fmt.Sprintf("%d/%d/%d", fi.Size(), fi.ModTime().UnixNano(), ino)
}
