// Package stateroot manages an agentkit state root: the folder (--state-root)
// holding a host's own copy of everything the runtime keeps.
//
// The layout (format 2) is
//
//	FORMAT        the layout's format version, {"format":2}
//	HOST_ID       this host's id in the store (Root.HostID), made on first use
//	serve.lock    the serving process's exclusive lock (flock) and PID
//	sessions/     the local session database the runtime serves from,
//	              sessions/sessions.db, which also holds the default store
//	              (the SQLite driver's tables kv and kv_meta)
//	reminders/    reminders hydrated from the store and created here
//	memory/       the memory journal
//	actors/       per-actor SQLite files
//	workspaces/   one workspace folder per session, seen by the file tools
//	files/        the agent's host files
//
// Format 1 kept the default store in a file of its own, kv/kv.db. The
// runtime moves it into sessions/sessions.db (versions and all) the first
// time it opens a format-1 root with the default store, then writes format
// 2 and removes kv/kv.db; a root that never used the default store is
// marked format 2 then too. DefaultStoreURL and KVPath follow the format,
// so agentkit kv finds the default store in either layout.
//
// Open creates the layout (or checks an existing one) and takes the lock: a
// second serving process on the same folder fails at once, naming the folder
// and the holder's PID.
//
// Everything in a state root is the owner's alone: the root and every folder
// in it are created 0700 and every file 0600 (the session database is
// created empty with that mode before SQLite opens it, and SQLite gives its
// -wal and -shm files the same). A root found with wider permissions, as
// older versions made them, is tightened at Open: group and other
// permissions are removed from everything in it. The lock is on serve.lock
// only, never on the SQLite files, so read-only tools (agentkit kv ls on the
// default store) keep working beside a server. Check validates the format
// without taking the lock, for those tools.
package stateroot

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"agentkit/internal/atomicfile"
)

// Format is the layout version this build writes and reads (it reads
// format 1 too, and moves it to 2: see the package documentation). A
// state root with a higher format was written by a newer agentkit and is
// refused.
const Format = 2

// Names of the files and folders at the root.
const (
	FormatFile   = "FORMAT"
	LockFile     = "serve.lock"
	SessionsDir  = "sessions"
	RemindersDir = "reminders"
	// KVDir held the default store in format 1 (KVFile in it).
	KVDir        = "kv"
	MemoryDir    = "memory"
	ActorsDir    = "actors"
	WorkspaceDir = "workspaces"
	FilesDir     = "files"
)

// KVFile is the default store's database file inside kv/ in format 1.
const KVFile = "kv.db"

// SessionsFile is the session database's file inside sessions/; since
// format 2 it holds the default store too.
const SessionsFile = "sessions.db"

// Permissions of what a state root holds: owner-only.
const (
	DirPerm  = 0o700
	FilePerm = 0o600
)

// Errors matched with errors.Is.
var (
	// ErrLocked means another process holds the state root's lock. The
	// error is a *LockedError.
	ErrLocked = errors.New("stateroot: state root in use")
	// ErrNewerFormat means the state root was written by a newer agentkit.
	ErrNewerFormat = errors.New("stateroot: state root format is newer than this build")
	// ErrBadFormat means the format file is unreadable or corrupt.
	ErrBadFormat = errors.New("stateroot: state root format file is not valid")
)

// LockedError says which process holds a state root.
type LockedError struct {
	Dir string // the state root
	PID int    // the holder's process id, 0 when unknown
}

// Error names the folder and the holder.
func (e *LockedError) Error() string {
	holder := "another process"
	if e.PID > 0 {
		holder = "another agentkit process (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("state root %s is in use by %s; stop it, or give this process another --state-root", e.Dir, holder)
}

// Is makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Root is an open, locked state root. Close releases the lock.
type Root struct {
	dir    string
	lock   *os.File
	format int // the layout's format as found (Format for a new root)
}

// Open prepares dir as a state root and takes its exclusive lock. It creates
// dir and the layout's folders when missing, writes the format file on a
// fresh root, refuses a root written by a newer agentkit (ErrNewerFormat) or
// with a corrupt format file (ErrBadFormat), and fails at once with a
// *LockedError when another process holds the lock.
func Open(dir string) (*Root, error) {
	if dir == "" {
		return nil, errors.New("stateroot: no state root given; pass --state-root DIR")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("stateroot: %w", err)
	}
	if err := os.MkdirAll(abs, DirPerm); err != nil {
		return nil, fmt.Errorf("stateroot: creating state root %s: %w", abs, err)
	}
	lock, err := acquire(abs)
	if err != nil {
		return nil, err
	}
	r := &Root{dir: abs, lock: lock}
	wide, err := tightenRoot(abs)
	if err == nil && wide {
		err = tightenAll(abs)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	if err := r.prepare(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// prepare checks or writes the format file and creates the folders.
func (r *Root) prepare() error {
	switch f, err := readFormat(r.dir); {
	case errors.Is(err, os.ErrNotExist):
		if err := writeFormat(r.dir, Format); err != nil {
			return err
		}
		r.format = Format
	case err != nil:
		return err
	default:
		if err := checkFormat(r.dir, f); err != nil {
			return err
		}
		r.format = f
	}
	for _, d := range []string{SessionsDir, RemindersDir, MemoryDir, ActorsDir, WorkspaceDir, FilesDir} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), DirPerm); err != nil {
			return fmt.Errorf("stateroot: creating %s: %w", filepath.Join(r.dir, d), err)
		}
	}
	return CreatePrivate(r.Path(SessionsDir, SessionsFile))
}

// Check validates dir's format file without taking the lock, for read-only
// tools. A folder with no format file passes (nothing was written there
// yet); a newer or corrupt format does not.
func Check(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("stateroot: %w", err)
	}
	f, err := readFormat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return checkFormat(abs, f)
}

// formatRecord is the content of the format file.
type formatRecord struct {
	Format int `json:"format"`
}

func readFormat(dir string) (int, error) {
	path := filepath.Join(dir, FormatFile)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		return 0, fmt.Errorf("%w: reading %s: %w", ErrBadFormat, path, err)
	}
	var f formatRecord
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil || f.Format < 1 {
		return 0, fmt.Errorf("%w: %s should hold {\"format\":%d} but holds %q; restore it, or point --state-root at a fresh folder", ErrBadFormat, path, Format, clip(string(b)))
	}
	return f.Format, nil
}

func checkFormat(dir string, f int) error {
	if f > Format {
		return fmt.Errorf("%w: state root %s has format %d, and this agentkit reads format %d or older; upgrade agentkit", ErrNewerFormat, dir, f, Format)
	}
	return nil
}

func writeFormat(dir string, format int) error {
	path := filepath.Join(dir, FormatFile)
	b, _ := json.Marshal(formatRecord{Format: format})
	if err := atomicfile.Write(path, append(b, '\n'), &atomicfile.Options{Perm: FilePerm}); err != nil {
		return fmt.Errorf("stateroot: writing %s: %w", path, err)
	}
	return nil
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// Dir returns the state root's absolute path.
func (r *Root) Dir() string { return r.dir }

// Path returns the path of name (one of the layout's folders) inside the
// root, joined with more elements.
func (r *Root) Path(name string, elem ...string) string {
	return filepath.Join(append([]string{r.dir, name}, elem...)...)
}

// Format returns the layout's format: as found at Open, or as set by
// SetFormat since.
func (r *Root) Format() int { return r.format }

// SetFormat writes the layout's format (atomically: a new file synced and
// renamed over the old one, then the folder synced), once the layout is
// what format says.
func (r *Root) SetFormat(format int) error {
	if err := writeFormat(r.dir, format); err != nil {
		return err
	}
	r.format = format
	return nil
}

// SessionsPath returns the session database's file, sessions/sessions.db.
func (r *Root) SessionsPath() string { return filepath.Join(r.dir, SessionsDir, SessionsFile) }

// FormatOneKVPath returns where a format-1 root kept the default store,
// kv/kv.db.
func (r *Root) FormatOneKVPath() string { return filepath.Join(r.dir, KVDir, KVFile) }

// KVPath returns the default store's database file of the root.
func (r *Root) KVPath() string { return KVPath(r.dir) }

// KVPath returns the default store's database file of the state root dir:
// sessions/sessions.db, or kv/kv.db in a format-1 root.
func KVPath(dir string) string {
	if f, err := readFormat(dir); err == nil && f == 1 {
		return filepath.Join(dir, KVDir, KVFile)
	}
	return filepath.Join(dir, SessionsDir, SessionsFile)
}

// DefaultStoreURL returns the kv.Open URL of the default store of the state
// root dir: "sqlite:" and KVPath's file.
func DefaultStoreURL(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	return "sqlite:" + KVPath(abs)
}

// JournalPath returns the memory journal's path, memory/journal.jsonl.
func (r *Root) JournalPath() string { return filepath.Join(r.dir, MemoryDir, "journal.jsonl") }

// Close releases the lock. It is safe to call more than once.
func (r *Root) Close() error {
	if r.lock == nil {
		return nil
	}
	err := release(r.lock)
	r.lock = nil
	return err
}
