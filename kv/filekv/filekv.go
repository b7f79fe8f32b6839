// Package filekv is the file driver for package kv: one file per key under a
// root folder, easy to inspect with ls and cat, and crash-safe.
//
// It registers the "file" scheme, and kv.Open gives it every string without a
// scheme too:
//
//	kv.Open(ctx, "file:/var/lib/agentkit/kv")   // absolute
//	kv.Open(ctx, "file:state/kv")               // relative to the working folder
//	kv.Open(ctx, "file:///var/lib/agentkit/kv") // the three-slash form
//	kv.Open(ctx, "/var/lib/agentkit/kv")        // a bare path
//
// # Layout
//
// Each key is a file; the segments of the key between '/' are folders, so
// "agentkit/v1/bot/kv/greeting" is the file agentkit/v1/bot/kv/greeting.kv.
// Bytes that are unsafe in file names are written as '+' and two hex digits,
// and a segment too long for one file name continues in a sub-folder whose
// name ends in ','. The mapping is reversible and injective: no key reaches
// outside the root, and no two keys share a file ("x" and "x/y" are x.kv and
// x/y.kv). The driver's own files start with a dot: .lock (the lock, holding
// the owner's process id), .format (the layout version) and .tmp-* (writes in
// progress).
//
// Each file holds a 32-byte header (a magic number, the version nonce, the
// value's length and a CRC-32C) and then the value. Reads check the checksum,
// so a damaged file is reported, never returned as a value.
//
// # Durability and versions
//
// A write goes to a temporary file in the root, is fsynced, renamed over the
// key's file and the key's folder is fsynced before the write returns. A
// crash at any point leaves the old value or the new one, never a mix;
// temporary files left by a crash are removed by the next Open and never
// listed. The version of a key is a random 128-bit nonce stored in its
// header, new on every write, identical bytes included, so versions are not
// reused after a delete and re-create.
//
// # One process at a time
//
// Open takes an exclusive lock (flock) on the root's .lock file and holds it
// until Close. A second Open of the same folder, from another process or
// this one, fails with a *LockedError naming the folder and the holder's
// process id. The kernel drops the lock when the holder dies, so a crashed
// process never blocks the next one. Within the process, conditional writes
// are serialised per key by mutexes; that is why the driver must be the only
// writer, and the lock makes sure of it. Use the sqlite driver when several
// processes must share a store.
package filekv

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/maphash"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"agentkit/internal/privfile"
	"agentkit/kv"
	"agentkit/kv/internal/driverkit"
)

func init() {
	kv.RegisterOptions("file", openURL)
}

const (
	formatName    = ".format"
	formatVersion = 1
	formatPrefix  = "agentkit filekv format "
	tmpPrefix     = ".tmp-"

	magic      = "AKV1"
	headerSize = 32
	nonceSize  = 16

	dirPerm  = 0o700
	filePerm = 0o600
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Open opens (creating it if needed) the store rooted at dir and locks it
// for this process until Close. A relative dir is taken from the working
// folder; "~" and "~/…" are taken from the home folder. dir must be missing,
// empty, or a folder this driver created. A folder another store holds open
// fails with a *LockedError.
func Open(ctx context.Context, dir string) (*kv.DB, error) {
	s, err := open(ctx, dir, false)
	if err != nil {
		return nil, err
	}
	return kv.New("file", s)
}

// openURL opens a file URL: file:/abs, file:relative, file:///abs, or the
// bare path kv.Open passes as Path.
func openURL(ctx context.Context, u *url.URL, o kv.OpenOptions) (*kv.DB, error) {
	var dir string
	switch {
	case u.Opaque != "":
		p, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return nil, fmt.Errorf("filekv: the path in the URL does not unescape: %w", err)
		}
		dir = p
	case u.Host != "" && u.Host != "localhost":
		return nil, fmt.Errorf("filekv: a file URL names a local folder, but this one names the host %q; write file:/path/to/folder or file:///path/to/folder", u.Host)
	default:
		dir = u.Path
	}
	if _, err := driverkit.Params(u); err != nil {
		return nil, fmt.Errorf("filekv: %w", err)
	}
	s, err := open(ctx, dir, o.ReadOnly)
	if err != nil {
		return nil, err
	}
	return kv.New("file", s)
}

// store is the backend. Every exported method checks closed under closeMu
// (held shared for the duration of one file operation, never across a
// yield) so Close waits for operations in flight.
type store struct {
	dir  string // absolute root
	lock *os.File

	closeMu sync.RWMutex
	closed  bool

	// tree is held shared by writes while they create folders and rename
	// into them (and by deletes while they remove a file), and exclusively
	// by deletes while they remove emptied folders and by listings while
	// they read folders: a folder is never removed under a write, and a
	// listing reads folders that do not change.
	tree sync.RWMutex
	// durable holds folders (relative to dir) whose entries are known to be
	// on disk: this process created or saw them and fsynced their parents.
	durable sync.Map

	// sys makes the system calls of durable writes (realSys; tests
	// record them).
	sys durable

	seed    maphash.Seed
	stripes [64]sync.Mutex // serialise writes to one key
	tmpSeq  atomic.Uint64
}

var (
	_ kv.Store       = (*store)(nil)
	_ kv.CAS         = (*store)(nil)
	_ kv.AfterLister = (*store)(nil)
)

// open opens the store at dir. readOnly creates and writes nothing: the
// folder must be a store already, and its temporary files are left alone.
func open(ctx context.Context, dir string, readOnly bool) (*store, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, errors.New("filekv: no folder given; name one, as in file:/var/lib/agentkit/kv")
	}
	dir, err := expandHome(dir)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("filekv: resolve %s: %w", dir, err)
	}
	if readOnly {
		if _, err := os.Stat(filepath.Join(abs, formatName)); err != nil {
			return nil, fmt.Errorf("filekv: no file store at %s (opened read-only, so none was created): %w", abs, err)
		}
	} else if err := os.MkdirAll(abs, dirPerm); err != nil {
		return nil, fmt.Errorf("filekv: create the folder: %w", err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("filekv: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("filekv: %s is not a folder; name a folder (created if missing) for the store", abs)
	}
	s := &store{dir: abs, seed: maphash.MakeSeed(), sys: realSys{}}
	// Refuse a folder of other files before leaving a lock file in it;
	// prepare checks again under the lock.
	if _, err := os.Lstat(filepath.Join(abs, formatName)); errors.Is(err, fs.ErrNotExist) {
		if err := s.checkEmpty(); err != nil {
			return nil, err
		}
	}
	lock, err := lockRoot(abs, readOnly)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	if err := s.prepare(readOnly); err != nil {
		lock.Close()
		return nil, err
	}
	// The folder is a store's now (prepare checked it), so its own: made
	// owner-only, it keeps every value the owner's alone, whatever the
	// modes of files a copy or a restore left in it.
	if err := privfile.Tighten(abs); err != nil {
		lock.Close()
		return nil, fmt.Errorf("filekv: %w", err)
	}
	return s, nil
}

// prepare checks or writes the format file, refuses case-insensitive file
// systems, removes temporary files a crash left, and makes the root's own
// entry durable.
func (s *store) prepare(readOnly bool) error {
	b, err := os.ReadFile(filepath.Join(s.dir, formatName))
	switch {
	case errors.Is(err, fs.ErrNotExist) && readOnly:
		return fmt.Errorf("filekv: %s is not a file store (no %s file)", s.dir, formatName)
	case errors.Is(err, fs.ErrNotExist):
		if err := s.initFormat(); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("filekv: read the format file: %w", err)
	default:
		line := strings.TrimSpace(string(b))
		n, err := strconv.Atoi(strings.TrimPrefix(line, formatPrefix))
		switch {
		case !strings.HasPrefix(line, formatPrefix) || err != nil:
			return fmt.Errorf("filekv: %s is not a format file of this driver (it reads %q); is %s a file store?", filepath.Join(s.dir, formatName), line, s.dir)
		case n > formatVersion:
			return fmt.Errorf("filekv: %s was written by a newer agentkit (layout format %d; this build reads format %d); upgrade agentkit", s.dir, n, formatVersion)
		case n != formatVersion:
			return fmt.Errorf("filekv: %s has layout format %d, which this build does not read (it reads format %d)", s.dir, n, formatVersion)
		}
	}
	if _, err := os.Lstat(filepath.Join(s.dir, strings.ToUpper(formatName))); err == nil {
		return fmt.Errorf("filekv: %s is on a case-insensitive file system, where keys differing only in case would share a file; put the store on a case-sensitive file system or use the sqlite driver", s.dir)
	}
	if readOnly {
		return nil
	}
	if err := s.removeTemps(); err != nil {
		return err
	}
	if err := syncDir(s.sys, filepath.Dir(s.dir)); err != nil {
		return fmt.Errorf("filekv: sync the folder above the root: %w", err)
	}
	return nil
}

// initFormat writes the format file into a root that must hold nothing but
// the driver's own files, so a typo never turns a folder of other files
// into a store.
func (s *store) initFormat() error {
	if err := s.checkEmpty(); err != nil {
		return err
	}
	tmp := filepath.Join(s.dir, tmpPrefix+"format")
	os.Remove(tmp) // left by a crash during an earlier first open
	data := []byte(formatPrefix + strconv.Itoa(formatVersion) + "\n")
	if err := writeSynced(s.sys, tmp, data); err != nil {
		return fmt.Errorf("filekv: write the format file: %w", err)
	}
	if err := s.sys.Rename(tmp, filepath.Join(s.dir, formatName)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("filekv: write the format file: %w", err)
	}
	return syncDir(s.sys, s.dir)
}

// checkEmpty fails unless the root holds only files this driver makes.
func (s *store) checkEmpty() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("filekv: read the folder: %w", err)
	}
	for _, e := range entries {
		if n := e.Name(); n != lockName && n != formatName && !strings.HasPrefix(n, tmpPrefix) {
			return fmt.Errorf("filekv: %s holds %q but is not a file store (it has no %s file); use an empty or new folder", s.dir, n, formatName)
		}
	}
	return nil
}

// removeTemps deletes the temporary files of writes that never finished.
func (s *store) removeTemps() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("filekv: read the folder: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("filekv: remove a leftover temporary file: %w", err)
			}
		}
	}
	return nil
}

func expandHome(p string) (string, error) {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("filekv: expand %s: %w", p, err)
	}
	return filepath.Join(home, p[1:]), nil
}

// Close releases the lock. Operations in flight finish first; later ones
// fail with kv.ErrClosed.
func (s *store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.lock.Truncate(0) // the PID is stale from here on; best effort
	return s.lock.Close()
}

// enter starts one operation; leave must follow unless it fails.
func (s *store) enter() error {
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return kv.ErrClosed
	}
	return nil
}

func (s *store) leave() { s.closeMu.RUnlock() }

func (s *store) stripe(key string) *sync.Mutex {
	return &s.stripes[maphash.String(s.seed, key)%uint64(len(s.stripes))]
}

func (s *store) abs(rel string) string {
	if rel == "" {
		return s.dir
	}
	return filepath.Join(s.dir, filepath.FromSlash(rel))
}

func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Put creates or overwrites key, durably.
func (s *store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	dir, name := keyPath(key)
	mu := s.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	_, err := s.write(ctx, dir, name, value)
	return err
}

// Get returns the value of key, or an error matching kv.ErrNotFound.
func (s *store) Get(ctx context.Context, key string) ([]byte, error) {
	v, _, err := s.GetWithVersion(ctx, key)
	return v, err
}

// GetWithVersion returns the value of key and its version.
func (s *store) GetWithVersion(ctx context.Context, key string) ([]byte, kv.Version, error) {
	if err := s.enter(); err != nil {
		return nil, "", err
	}
	defer s.leave()
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	dir, name := keyPath(key)
	return s.read(joinRel(dir, name))
}

// Delete removes key durably; a missing key is not an error. Folders the
// delete leaves empty are removed too.
func (s *store) Delete(ctx context.Context, key string) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, name := keyPath(key)
	mu := s.stripe(key)
	mu.Lock()
	s.tree.RLock() // no pruning between the remove and the sync
	err := os.Remove(filepath.Join(s.abs(dir), name))
	removed := err == nil
	if removed {
		err = syncDir(s.sys, s.abs(dir))
	} else if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	s.tree.RUnlock()
	mu.Unlock()
	if err == nil && removed && dir != "" {
		s.prune(dir)
	}
	return err
}

// prune removes dir and its ancestors while they are empty. Removing an
// empty folder need not be durable: if it comes back after a crash it is
// still empty.
func (s *store) prune(dir string) {
	s.tree.Lock()
	defer s.tree.Unlock()
	for dir != "" {
		if err := os.Remove(s.abs(dir)); err != nil {
			return // not empty (or gone): stop
		}
		s.durable.Delete(dir)
		i := strings.LastIndexByte(dir, '/')
		if i < 0 {
			return
		}
		dir = dir[:i]
	}
}

// PutIfAbsent writes key only if it has no file.
func (s *store) PutIfAbsent(ctx context.Context, key string, value []byte) (kv.Version, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.leave()
	dir, name := keyPath(key)
	mu := s.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	_, err := os.Lstat(filepath.Join(s.abs(dir), name))
	switch {
	case err == nil:
		return "", kv.ErrConflict
	case !errors.Is(err, fs.ErrNotExist):
		return "", err
	}
	return s.write(ctx, dir, name, value)
}

// PutIfVersion writes key only if its file holds version expected.
func (s *store) PutIfVersion(ctx context.Context, key string, value []byte, expected kv.Version) (kv.Version, error) {
	if err := s.enter(); err != nil {
		return "", err
	}
	defer s.leave()
	dir, name := keyPath(key)
	mu := s.stripe(key)
	mu.Lock()
	defer mu.Unlock()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	cur, err := s.readVersion(joinRel(dir, name))
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return "", fmt.Errorf("%w: the key does not exist", kv.ErrConflict)
	case err != nil:
		return "", err
	case cur != expected:
		return "", kv.ErrConflict
	}
	return s.write(ctx, dir, name, value)
}

// write stores value as dir/name through a synced temporary file and
// returns the new version. The caller holds the key's stripe.
func (s *store) write(ctx context.Context, dir, name string, value []byte) (kv.Version, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	var nonce [nonceSize]byte
	rand.Read(nonce[:])
	hdr := makeHeader(nonce, value)
	parts := [][]byte{hdr[:], value}
	if len(value) <= 64<<10 {
		// One write system call instead of two for the common small value.
		parts = [][]byte{append(hdr[:], value...)}
	}
	tmp := filepath.Join(s.dir, tmpPrefix+strconv.FormatUint(s.tmpSeq.Add(1), 36))
	if err := writeSynced(s.sys, tmp, parts...); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := s.install(tmp, dir, name); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return kv.Version(hex.EncodeToString(nonce[:])), nil
}

// install renames tmp to dir/name, creating dir if needed, and syncs dir.
// The caller holds the key's stripe, so no delete of this key can empty
// (and prune) dir between the rename and the sync.
func (s *store) install(tmp, dir, name string) error {
	target := s.abs(dir)
	if err := s.rename(tmp, dir, filepath.Join(target, name)); err != nil {
		return err
	}
	return syncDir(s.sys, target)
}

// rename makes dir and renames tmp to path, with tree held shared so
// neither pruning nor a listing's directory walk runs meanwhile.
func (s *store) rename(tmp, dir, path string) error {
	s.tree.RLock()
	defer s.tree.RUnlock()
	for attempt := 0; ; attempt++ {
		if err := s.ensureDir(dir); err != nil {
			return err
		}
		err := s.sys.Rename(tmp, path)
		if errors.Is(err, fs.ErrNotExist) && attempt == 0 && dir != "" {
			// The folder vanished under us (removed by hand): forget
			// that it was durable and make it again, once.
			s.durable.Delete(dir)
			continue
		}
		return err
	}
}

// ensureDir makes sure dir exists and that its entry, and its ancestors',
// are on disk. The caller holds tree shared.
func (s *store) ensureDir(dir string) error {
	if dir == "" {
		return nil
	}
	if _, ok := s.durable.Load(dir); ok {
		return nil
	}
	parts := strings.Split(dir, "/")
	known := len(parts) - 1 // parts[:known] is the deepest known-durable ancestor
	for known > 0 {
		if _, ok := s.durable.Load(strings.Join(parts[:known], "/")); ok {
			break
		}
		known--
	}
	for i := known + 1; i <= len(parts); i++ {
		err := os.Mkdir(s.abs(strings.Join(parts[:i], "/")), dirPerm)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	// Sync each parent, top down, so every new entry is on disk. Another
	// writer may have made some of these folders; syncing them here is
	// what lets this write rely on them.
	for i := known; i < len(parts); i++ {
		if err := syncDir(s.sys, s.abs(strings.Join(parts[:i], "/"))); err != nil {
			return err
		}
		s.durable.Store(strings.Join(parts[:i+1], "/"), struct{}{})
	}
	return nil
}

// read returns the value and version in the file at rel.
func (s *store) read(rel string) ([]byte, kv.Version, error) {
	data, err := readFile(s.abs(rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", kv.ErrNotFound
	}
	if err != nil {
		return nil, "", err
	}
	return s.parse(rel, data)
}

// readVersion reads only the header of the file at rel.
func (s *store) readVersion(rel string) (kv.Version, error) {
	hdr, err := readHeader(s.abs(rel))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", kv.ErrNotFound
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "", s.damaged(rel, "shorter than its header")
	case err != nil:
		return "", err
	case string(hdr[:4]) != magic:
		return "", s.damaged(rel, "the header is not this driver's")
	}
	return kv.Version(hex.EncodeToString(hdr[4 : 4+nonceSize])), nil
}

func (s *store) damaged(rel, why string) error {
	return fmt.Errorf("filekv: the file %s is damaged (%s); restore it from a backup or delete it", s.abs(rel), why)
}

// makeHeader builds the 32-byte header: magic, nonce, value length (big
// endian) and the CRC-32C of the nonce, the length and the value.
func makeHeader(nonce [nonceSize]byte, value []byte) [headerSize]byte {
	var h [headerSize]byte
	copy(h[:4], magic)
	copy(h[4:20], nonce[:])
	binary.BigEndian.PutUint64(h[20:28], uint64(len(value)))
	sum := crc32.Update(crc32.Checksum(h[4:28], castagnoli), castagnoli, value)
	binary.BigEndian.PutUint32(h[28:32], sum)
	return h
}

func (s *store) parse(rel string, data []byte) ([]byte, kv.Version, error) {
	if len(data) < headerSize || string(data[:4]) != magic {
		return nil, "", s.damaged(rel, "the header is missing or not this driver's")
	}
	n := binary.BigEndian.Uint64(data[20:28])
	if n != uint64(len(data)-headerSize) {
		return nil, "", s.damaged(rel, fmt.Sprintf("the header says %d bytes of value, the file has %d", n, len(data)-headerSize))
	}
	value := data[headerSize:]
	sum := crc32.Update(crc32.Checksum(data[4:28], castagnoli), castagnoli, value)
	if sum != binary.BigEndian.Uint32(data[28:32]) {
		return nil, "", s.damaged(rel, "checksum mismatch")
	}
	return value, kv.Version(hex.EncodeToString(data[4 : 4+nonceSize])), nil
}
