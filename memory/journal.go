package memory

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"agentkit/internal/privfile"
)

// DefaultRotateSize is the size at which Journal moves journal.jsonl aside:
// 4 MiB.
const DefaultRotateSize = 4 << 20

// ErrClosed is returned by a Journal's methods after Close.
var ErrClosed = errors.New("memory: journal is closed")

const (
	lockName      = ".journal.lock"
	rotatedPrefix = "journal-"
	rotatedSuffix = ".jsonl"
	// rotatedLayout is the timestamp in a rotated file's name: UTC, fixed
	// width, so names sort in time order.
	rotatedLayout = "20060102T150405.000Z"
	// rotatedSeqMax bounds the four-digit counter that follows it.
	rotatedSeqMax = 9999

	dirPerm  = 0o700
	filePerm = 0o600
)

// JournalOptions tunes a Journal. The zero value (or nil) means defaults.
type JournalOptions struct {
	// RotateSize is the size in bytes at which journal.jsonl is moved
	// aside: the first append that finds the file at or above it renames
	// the file to journal-<timestamp>-<n>.jsonl first. 0 means
	// DefaultRotateSize; negative values are an error.
	RotateSize int64
	// Sync makes every append wait for fsync. Without it a record is
	// handed to the operating system with one write call before Append
	// returns: it survives the process crashing, but not the machine
	// losing power. The journal is advisory, so the default is off.
	Sync bool
}

// Journal is the default MemoryBackend: one JSON line per record appended
// to <dir>/journal.jsonl, moved aside to
// <dir>/journal-<timestamp>-<n>.jsonl when it grows past RotateSize.
//
// Each record is written with a single write call on a file opened with
// O_APPEND, while holding both the Journal's mutex and an exclusive flock
// on <dir>/.journal.lock. Records from concurrent sessions therefore never
// interleave, and a rotation never loses, duplicates or splits a record,
// also when several Journal values or several processes write to one
// folder (flock is used on Linux, macOS and the BSDs; elsewhere only one
// Journal per folder is supported). A reader may see a final line that is
// still being written: it has no newline yet.
//
// Rotated names are the rotation time in UTC to the millisecond, such as
// journal-20261001T164209.118Z-0000.jsonl, followed by a counter that
// keeps names unique and increasing even for two rotations in one
// millisecond or a clock that steps back; sorted by name, the rotated
// files are in the order they were written, and journal.jsonl (which sorts
// after them) holds the newest records. Files lists them in that order.
//
// The folder and files are created on first use, with permissions 0700
// and 0600; a folder, journal or lock file found with group or other
// permissions is made owner-only when the journal opens it. If the folder is deleted while the Journal is open, the next
// append creates it again. A Journal is safe for concurrent use.
type Journal struct {
	dir, path, lockPath string
	rotateSize          int64
	sync                bool
	// now names rotated files, write writes a line and rename moves the
	// full journal aside. Tests replace them to inject faults.
	now    func() time.Time
	write  func(f *os.File, b []byte) (int, error)
	rename func(oldpath, newpath string) error

	mu       sync.Mutex
	closed   bool
	f        *os.File    // the live journal, or nil
	fInfo    os.FileInfo // identity of f
	lock     *os.File    // the lock file, or nil
	lockInfo os.FileInfo // identity of lock
}

var (
	_ MemoryBackend   = (*Journal)(nil)
	_ SessionPreparer = (*Journal)(nil)
)

// NewJournal returns a Journal writing to dir (for the default journal,
// Dir(stateRoot)). It does not touch the disk: the folder and files are
// created by the first append or PrepareSession. nil opts means defaults.
func NewJournal(dir string, opts *JournalOptions) (*Journal, error) {
	if dir == "" {
		return nil, errors.New("memory: the journal folder is empty; pass Dir(stateRoot)")
	}
	if opts == nil {
		opts = &JournalOptions{}
	}
	size := opts.RotateSize
	switch {
	case size == 0:
		size = DefaultRotateSize
	case size < 0:
		return nil, fmt.Errorf("memory: RotateSize is %d; use a positive number of bytes, or 0 for the default %d", size, DefaultRotateSize)
	}
	return &Journal{
		dir:        dir,
		path:       filepath.Join(dir, JournalName),
		lockPath:   filepath.Join(dir, lockName),
		rotateSize: size,
		sync:       opts.Sync,
		now:        time.Now,
		write:      func(f *os.File, b []byte) (int, error) { return f.Write(b) },
		rename:     os.Rename,
	}, nil
}

// Dir returns the journal's folder.
func (j *Journal) Dir() string { return j.dir }

// Path returns the live journal file, <dir>/journal.jsonl.
func (j *Journal) Path() string { return j.path }

// PrepareSession creates the journal's folder, so the workspace's read-only
// memory/ view has something to show before the first record.
func (j *Journal) PrepareSession(ctx context.Context, _ Info) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.MkdirAll(j.dir, dirPerm); err != nil {
		return fmt.Errorf("memory: creating the journal folder: %w", err)
	}
	return nil
}

// AppendTurn appends rec; info is not used, since a Journal is bound to its
// folder. It implements MemoryBackend.
func (j *Journal) AppendTurn(ctx context.Context, rec Record, _ Info) error {
	return j.Append(ctx, rec)
}

// Append writes rec as one line (Record.Line), moving a full journal.jsonl
// aside first. If the move fails, the record is still appended to the
// current file and the error says so.
func (j *Journal) Append(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	line, err := rec.Line()
	if err != nil {
		return err
	}
	return j.appendLine(line)
}

func (j *Journal) appendLine(line []byte) (err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ErrClosed
	}
	if err := j.acquire(); err != nil {
		return err
	}
	defer func() {
		if uerr := unlockFile(j.lock); uerr != nil && err == nil {
			err = fmt.Errorf("memory: unlocking %s: %w", j.lockPath, uerr)
		}
	}()
	size, err := j.live()
	if err != nil {
		return err
	}
	var rotErr error
	if size >= j.rotateSize {
		if rotErr = j.rotate(); rotErr == nil {
			if size, err = j.live(); err != nil {
				return err
			}
		}
	}
	if n, err := j.write(j.f, line); err != nil {
		if n > 0 {
			// Take back the torn line so the next record starts on a
			// line of its own. Best effort: the write error is what
			// the caller needs to hear about.
			_ = j.f.Truncate(size)
		}
		return fmt.Errorf("memory: appending to %s: %w", j.path, err)
	}
	if j.sync {
		if err := j.f.Sync(); err != nil {
			return fmt.Errorf("memory: syncing %s: %w", j.path, err)
		}
	}
	if rotErr != nil {
		return fmt.Errorf("memory: record appended, but %s is over %d bytes and moving it aside failed: %w", j.path, j.rotateSize, rotErr)
	}
	return nil
}

// acquire opens the lock file if needed and takes the flock.
func (j *Journal) acquire() error {
	if j.lock == nil {
		if err := os.MkdirAll(j.dir, dirPerm); err != nil {
			return fmt.Errorf("memory: creating the journal folder: %w", err)
		}
		if err := privfile.Tighten(j.dir); err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		f, err := os.OpenFile(j.lockPath, os.O_RDWR|os.O_CREATE, filePerm)
		if err != nil {
			return fmt.Errorf("memory: opening the journal lock: %w", err)
		}
		if err := privfile.TightenOpen(f); err != nil {
			f.Close()
			return fmt.Errorf("memory: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("memory: opening the journal lock: %w", err)
		}
		j.lock, j.lockInfo = f, fi
	}
	if err := lockFile(j.lock); err != nil {
		return fmt.Errorf("memory: locking %s: %w", j.lockPath, err)
	}
	return nil
}

// live makes j.f the file now at j.path, opening or creating it when the
// file was rotated away (by this or another writer) or deleted, and returns
// its size. The caller holds the flock.
func (j *Journal) live() (int64, error) {
	st, err := os.Stat(j.path)
	if err == nil && j.f != nil && os.SameFile(st, j.fInfo) {
		return st.Size(), nil
	}
	j.closeLive()
	if errors.Is(err, fs.ErrNotExist) {
		// No journal: first use, a rotation, or the folder was deleted.
		// In the last case our lock file went with it, and writers that
		// start now lock a new one: switch to that before creating.
		if err := j.relockIfReplaced(); err != nil {
			return 0, err
		}
	} else if err != nil {
		return 0, fmt.Errorf("memory: %w", err)
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, filePerm)
	if err != nil {
		return 0, fmt.Errorf("memory: opening the journal: %w", err)
	}
	if err := privfile.TightenOpen(f); err != nil {
		f.Close()
		return 0, fmt.Errorf("memory: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, fmt.Errorf("memory: opening the journal: %w", err)
	}
	j.f, j.fInfo = f, fi
	return fi.Size(), nil
}

// relockIfReplaced switches to a new lock file if the one held is no longer
// at j.lockPath. The caller holds the flock on the old one.
func (j *Journal) relockIfReplaced() error {
	st, err := os.Stat(j.lockPath)
	if err == nil && os.SameFile(st, j.lockInfo) {
		return nil
	}
	_ = unlockFile(j.lock)
	j.lock.Close()
	j.lock, j.lockInfo = nil, nil
	return j.acquire()
}

// rotate moves the live journal aside. The caller holds the flock.
func (j *Journal) rotate() error {
	name, err := j.rotatedName()
	if err != nil {
		return err
	}
	if err := j.rename(j.path, filepath.Join(j.dir, name)); err != nil {
		return err
	}
	j.closeLive()
	return nil
}

// rotatedName returns a name for the next rotated file that sorts after
// every rotated file already in the folder: the current time, or, if the
// newest existing name is not older, that name with its counter raised.
func (j *Journal) rotatedName() (string, error) {
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return "", err
	}
	last := ""
	for _, e := range entries {
		if _, _, ok := parseRotated(e.Name()); ok && e.Name() > last {
			last = e.Name()
		}
	}
	name := rotatedFileName(j.now(), 0)
	if name > last {
		return name, nil
	}
	t, seq, _ := parseRotated(last)
	if seq < rotatedSeqMax {
		return rotatedFileName(t, seq+1), nil
	}
	return rotatedFileName(t.Add(time.Millisecond), 0), nil
}

func rotatedFileName(t time.Time, seq int) string {
	return fmt.Sprintf("%s%s-%04d%s", rotatedPrefix, t.UTC().Format(rotatedLayout), seq, rotatedSuffix)
}

// parseRotated reads a name made by rotatedFileName.
func parseRotated(name string) (time.Time, int, bool) {
	rest, ok := strings.CutPrefix(name, rotatedPrefix)
	if !ok {
		return time.Time{}, 0, false
	}
	if rest, ok = strings.CutSuffix(rest, rotatedSuffix); !ok || len(rest) != len(rotatedLayout)+5 || rest[len(rotatedLayout)] != '-' {
		return time.Time{}, 0, false
	}
	t, err := time.Parse(rotatedLayout, rest[:len(rotatedLayout)])
	if err != nil {
		return time.Time{}, 0, false
	}
	digits := rest[len(rotatedLayout)+1:]
	seq, err := strconv.Atoi(digits)
	if err != nil || seq < 0 || rotatedFileName(t, seq) != name {
		return time.Time{}, 0, false
	}
	return t, seq, true
}

func (j *Journal) closeLive() {
	if j.f != nil {
		j.f.Close()
		j.f, j.fInfo = nil, nil
	}
}

// Close closes the journal's files. Appends after Close return ErrClosed.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	j.closed = true
	var errs []error
	if j.f != nil {
		errs = append(errs, j.f.Close())
		j.f = nil
	}
	if j.lock != nil {
		errs = append(errs, j.lock.Close())
		j.lock = nil
	}
	return errors.Join(errs...)
}

// Files returns the journal files in dir oldest first: the rotated
// journal-*.jsonl files sorted by name, then journal.jsonl if it exists. A
// missing folder yields no files and no error.
func Files(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	var files []string
	live := false
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if e.Name() == JournalName {
			live = true
		} else if _, _, ok := parseRotated(e.Name()); ok {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	if live {
		files = append(files, filepath.Join(dir, JournalName))
	}
	return files, nil
}
