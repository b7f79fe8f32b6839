// Package atomicfile replaces a file's contents so that a reader, or the
// machine after a crash, finds the whole old file or the whole new one,
// never a mix: Write puts the data in a temporary file in the same folder,
// fsyncs it, renames it over the target and fsyncs the folder. The rename
// is atomic because both names are in one folder (one file system); the
// file's fsync makes the data reach the disk before the new name does, and
// the folder's fsync makes the rename itself survive a power cut.
//
// It is the one place agentkit replaces a file: the state root's format and
// host id, the credentials of the hosted service, local reminders, a purged
// memory journal and the hosted memory cursor.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// DefaultPerm is the mode of a file written without Options.Perm: owner
// read and write only.
const DefaultPerm fs.FileMode = 0o600

// Options tune Write. A nil *Options means the defaults.
type Options struct {
	// Perm is the new file's mode; zero means DefaultPerm. The umask does
	// not apply: the file gets exactly this mode.
	Perm fs.FileMode
	// TempPrefix begins the temporary file's name; a random suffix
	// follows. Empty means "." + the target's base name + ".tmp-", a
	// hidden name beside the target. Give one when the folder's reader
	// must tell leftovers of an interrupted write apart (memory's purge
	// removes ".purge-*").
	TempPrefix string
	// NoSync skips both fsyncs, for a file that is only a cache of state
	// kept durably elsewhere. The replacement stays atomic for readers;
	// after a power cut the file may be the old one, the new one, or
	// empty.
	NoSync bool
}

// ops are the file system calls whose order makes the write durable; a
// test records them.
type ops struct {
	syncFile func(*os.File) error
	rename   func(from, to string) error
	syncDir  func(dir string) error
}

var osOps = ops{syncFile: (*os.File).Sync, rename: os.Rename, syncDir: syncDir}

// Write replaces path with data: a temporary file in path's folder, made
// with the mode of opts (owner only by default), written, fsynced, closed,
// renamed over path, then the folder fsynced. On any failure the temporary
// file is removed and path is left as it was, unless only the folder's
// fsync failed: path then holds data, which may not survive a power cut.
// The error is the file system's (an *fs.PathError or *os.LinkError naming
// the step and the file); callers add what they were writing.
func Write(path string, data []byte, opts *Options) error {
	return write(osOps, path, data, opts)
}

func write(o ops, path string, data []byte, opts *Options) (err error) {
	var opt Options
	if opts != nil {
		opt = *opts
	}
	if opt.Perm == 0 {
		opt.Perm = DefaultPerm
	}
	if opt.TempPrefix == "" {
		opt.TempPrefix = "." + filepath.Base(path) + ".tmp-"
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, opt.TempPrefix+"*")
	if err != nil {
		return err
	}
	tmp, renamed := f.Name(), false
	defer func() {
		if !renamed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(opt.Perm); err != nil {
		return err
	}
	if !opt.NoSync {
		if err := o.syncFile(f); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := o.rename(tmp, path); err != nil {
		return err
	}
	renamed = true
	if opt.NoSync {
		return nil
	}
	if err := o.syncDir(dir); err != nil {
		return fmt.Errorf("%s is replaced, but syncing its folder failed: %w", path, err)
	}
	return nil
}

// syncDir fsyncs a folder, so a rename in it survives a power cut. Windows
// cannot open a folder for syncing: there it does nothing.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
