// Package workspace gives the model file tools over a session's workspace
// folder (list_files, read_file, write_file, search_files) and the helpers
// the runtime uses to fill a workspace: ValidateFiles and Seed for per-send
// workspace files, LoadDir for a project's seed folder.
//
// Every path is relative to the workspace and confined to it: absolute
// paths, ".." that climbs out, and symlinks that point outside are refused
// with an error saying so. The tools work through *os.Root, which enforces
// the same rule in the kernel's terms.
//
// # The memory/ folder
//
// "memory" is a reserved top-level name. The runtime shows the agent's
// memory journal (--state-root/memory/) there: Options.MemoryDir names that
// folder, and the tools serve every path under memory/ from it, through an
// os.Root of its own, read-only. A symlink could not do this job, since
// os.Root refuses links that leave the workspace. Reads, listings and
// searches under memory/ work; write_file refuses them, ValidateFiles
// rejects per-send files under memory/ with a *FileError matching
// ErrReserved, and LoadDir refuses a seed folder holding memory/, so no
// caller can write records through the workspace.
package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
)

// MemoryDir is the reserved top-level folder where the memory journal
// appears.
const MemoryDir = "memory"

// Permissions of the folders and files the tools and Seed create: owner
// only, like everything under a state root.
const (
	dirPerm  = 0o700
	filePerm = 0o600
)

// Errors a *FileError wraps, for errors.Is.
var (
	// ErrReserved means the path is under memory/, which callers may not
	// write.
	ErrReserved = errors.New("memory/ is reserved for the read-only view of the memory journal")
	// ErrUnsafePath means the path is empty, absolute, leaves the workspace,
	// or holds a NUL byte.
	ErrUnsafePath = errors.New("unsafe path")
	// ErrTooLarge means a file, or all files together, pass a size or count
	// limit.
	ErrTooLarge = errors.New("too large")
	// ErrNotRegular means the path names something other than a regular
	// file or folder: a named pipe, a device, a socket. The tools and Seed
	// refuse those instead of blocking on them.
	ErrNotRegular = errors.New("not a regular file")
)

// FileError names the workspace path a problem is about. The HTTP layer
// answers it with 400 and its message.
type FileError struct {
	Path string
	Err  error
}

// Error names the path and the problem.
func (e *FileError) Error() string {
	return fmt.Sprintf("workspace file %q: %v", e.Path, e.Err)
}

// Unwrap returns the cause, which matches ErrReserved, ErrUnsafePath,
// ErrNotRegular or ErrTooLarge.
func (e *FileError) Unwrap() error { return e.Err }

// CleanPath checks a workspace path and returns it cleaned, with forward
// slashes ("." for the workspace itself). It refuses, with an error matching
// ErrUnsafePath, an empty path, an absolute one, one that climbs out with
// "..", and one holding a NUL byte. It does not look at the disk: symlinks
// are checked when the path is opened.
func CleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%w: the path is empty; give a path relative to the workspace, such as notes/todo.md", ErrUnsafePath)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%w: the path holds a NUL byte", ErrUnsafePath)
	case path.IsAbs(p) || filepath.IsAbs(p) || strings.HasPrefix(p, `\`) || filepath.VolumeName(p) != "":
		return "", fmt.Errorf("%w: %q is absolute; give a path relative to the workspace, such as notes/todo.md", ErrUnsafePath, p)
	}
	c := path.Clean(filepath.ToSlash(p))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: %q leaves the workspace; give a path inside it", ErrUnsafePath, p)
	}
	if !filepath.IsLocal(filepath.FromSlash(c)) {
		return "", fmt.Errorf("%w: %q is not a plain relative path on this system", ErrUnsafePath, p)
	}
	return c, nil
}

// IsReserved reports whether a cleaned path is memory/ or under it. The
// comparison ignores case, so case-insensitive file systems cannot be used
// to write there either.
func IsReserved(clean string) bool {
	first, _, _ := strings.Cut(clean, "/")
	return strings.EqualFold(first, MemoryDir)
}

// underMemory splits a cleaned path into its part below memory/ when it is
// in the memory view ("." for memory itself).
func underMemory(clean string) (rest string, ok bool) {
	if clean == MemoryDir {
		return ".", true
	}
	if r, found := strings.CutPrefix(clean, MemoryDir+"/"); found {
		return r, true
	}
	return "", false
}

// fsError turns an error from os.Root into one the model can act on.
func fsError(shown string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist; use list_files to see what is there", shown)
	case strings.Contains(err.Error(), "path escapes from parent"):
		return fmt.Errorf("%w: %s leads outside the workspace (through a symlink or ..); use a path inside it", ErrUnsafePath, shown)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: permission denied", shown)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		// The PathError names the host path; the model knows the workspace
		// path only.
		return fmt.Errorf("%s: %s: %w", shown, pe.Op, pe.Err)
	}
	return fmt.Errorf("%s: %w", shown, err)
}
