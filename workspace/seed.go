package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"unicode/utf8"
)

// Limits on files written into a workspace by ValidateFiles, Seed and
// LoadDir.
const (
	// MaxSeedFiles is the most files one request or seed folder may hold.
	MaxSeedFiles = 1000
	// MaxSeedFileBytes is the largest single file.
	MaxSeedFileBytes = 1 << 20
	// MaxSeedTotalBytes is the most bytes all files may hold together.
	MaxSeedTotalBytes = 8 << 20
)

// ValidateFiles checks per-send workspace files (path -> content) before
// anything is written. It returns nil or a *FileError naming the first bad
// path in sorted order: one under memory/ (ErrReserved); one that is empty,
// absolute, leaves the workspace, names the workspace itself or names the
// same file as another entry (ErrUnsafePath); content over MaxSeedFileBytes,
// more than MaxSeedFiles files, or over MaxSeedTotalBytes in all
// (ErrTooLarge). A path that is both a file and a folder of another entry
// ("a" and "a/b") is refused too.
func ValidateFiles(files map[string]string) error {
	_, err := cleanFiles(files)
	return err
}

// cleanFiles validates files and returns their cleaned paths, sorted, with
// the original keys.
func cleanFiles(files map[string]string) ([][2]string, error) {
	raw := make([]string, 0, len(files))
	for p := range files {
		raw = append(raw, p)
	}
	slices.Sort(raw)
	if len(raw) > MaxSeedFiles {
		return nil, &FileError{Path: raw[MaxSeedFiles], Err: fmt.Errorf("%w: more than %d files; send fewer", ErrTooLarge, MaxSeedFiles)}
	}
	seen := make(map[string]string, len(raw))
	out := make([][2]string, 0, len(raw))
	total := 0
	for _, p := range raw {
		c, err := CleanPath(p)
		if err != nil {
			return nil, &FileError{Path: p, Err: err}
		}
		if c == "." {
			return nil, &FileError{Path: p, Err: fmt.Errorf("%w: the path names the workspace itself; name a file inside it", ErrUnsafePath)}
		}
		if IsReserved(c) {
			return nil, &FileError{Path: p, Err: fmt.Errorf("%w; per-send files may not go there: choose another folder", ErrReserved)}
		}
		if prev, dup := seen[c]; dup {
			return nil, &FileError{Path: p, Err: fmt.Errorf("%w: it names the same file as %q", ErrUnsafePath, prev)}
		}
		seen[c] = p
		n := len(files[p])
		if n > MaxSeedFileBytes {
			return nil, &FileError{Path: p, Err: fmt.Errorf("%w: %d bytes is over the %d-byte limit per file", ErrTooLarge, n, MaxSeedFileBytes)}
		}
		total += n
		if total > MaxSeedTotalBytes {
			return nil, &FileError{Path: p, Err: fmt.Errorf("%w: the files pass %d bytes in all; send less", ErrTooLarge, MaxSeedTotalBytes)}
		}
		out = append(out, [2]string{c, p})
	}
	for c, p := range seen {
		for dir := path.Dir(c); dir != "."; dir = path.Dir(dir) {
			if other, ok := seen[dir]; ok {
				return nil, &FileError{Path: other, Err: fmt.Errorf("%w: it is a file, but %q needs it to be a folder", ErrUnsafePath, p)}
			}
		}
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out, nil
}

// Seed validates files as ValidateFiles does and writes them into the
// workspace root, creating parent folders and replacing existing files.
// Nothing is written when validation fails. A path that would leave the
// workspace through a symlink already in it fails with a *FileError.
func Seed(root *os.Root, files map[string]string) error {
	if root == nil {
		return fmt.Errorf("workspace: Seed needs the workspace root; got nil")
	}
	list, err := cleanFiles(files)
	if err != nil {
		return err
	}
	for _, f := range list {
		c, orig := f[0], f[1]
		if dir := path.Dir(c); dir != "." {
			if err := root.MkdirAll(dir, dirPerm); err != nil {
				return &FileError{Path: orig, Err: fsError(dir, err)}
			}
		}
		if err := writeRegular(root, c, c, []byte(files[orig])); err != nil {
			return &FileError{Path: orig, Err: err}
		}
	}
	return nil
}

// LoadDir reads a seed folder (such as a project's workspace/ folder, opened
// with os.DirFS or (*os.Root).FS) into the path -> content map Seed takes.
// It refuses, with a *FileError, a memory/ entry at the top (ErrReserved),
// symlinks and other non-regular files (ErrUnsafePath), files that are not
// UTF-8 text (JSON, which carries per-send files, cannot hold them either), and anything past the limits of ValidateFiles.
func LoadDir(fsys fs.FS) (map[string]string, error) {
	files := map[string]string{}
	total := 0
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return &FileError{Path: p, Err: err}
		}
		if p == "." {
			return nil
		}
		if IsReserved(p) {
			return &FileError{Path: p, Err: fmt.Errorf("%w; a seed folder may not contain memory/: rename or remove it", ErrReserved)}
		}
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return &FileError{Path: p, Err: fmt.Errorf("%w: only regular files and folders can be seeded (found %s)", ErrUnsafePath, d.Type())}
		}
		if len(files) >= MaxSeedFiles {
			return &FileError{Path: p, Err: fmt.Errorf("%w: more than %d files", ErrTooLarge, MaxSeedFiles)}
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return &FileError{Path: p, Err: err}
		}
		if len(b) > MaxSeedFileBytes {
			return &FileError{Path: p, Err: fmt.Errorf("%w: %d bytes is over the %d-byte limit per file", ErrTooLarge, len(b), MaxSeedFileBytes)}
		}
		if total += len(b); total > MaxSeedTotalBytes {
			return &FileError{Path: p, Err: fmt.Errorf("%w: the folder passes %d bytes in all", ErrTooLarge, MaxSeedTotalBytes)}
		}
		if !utf8.Valid(b) {
			return &FileError{Path: p, Err: errors.New("the file is not UTF-8 text; only text files can be seeded")}
		}
		files[p] = string(b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return files, nil
}
