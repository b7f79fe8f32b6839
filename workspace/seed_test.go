package workspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

func TestValidateFiles(t *testing.T) {
	if err := ValidateFiles(nil); err != nil {
		t.Errorf("ValidateFiles(nil) = %v", err)
	}
	if err := ValidateFiles(map[string]string{"a.txt": "x", "dir/b.md": "y", "memoryx/c": "z"}); err != nil {
		t.Errorf("valid files refused: %v", err)
	}
	for _, c := range []struct {
		files    map[string]string
		path     string
		sentinel error
		text     string
	}{
		{map[string]string{"a": "", "memory/journal.jsonl": "forged"}, "memory/journal.jsonl", ErrReserved, "memory/"},
		{map[string]string{"memory": "x"}, "memory", ErrReserved, "memory/"},
		{map[string]string{"./memory/x": "x"}, "./memory/x", ErrReserved, "memory/"},
		{map[string]string{"Memory/x": "x"}, "Memory/x", ErrReserved, "memory/"},
		{map[string]string{"notes/../memory/x": "x"}, "notes/../memory/x", ErrReserved, "memory/"},
		{map[string]string{"../x": "x"}, "../x", ErrUnsafePath, "leaves the workspace"},
		{map[string]string{"/etc/passwd": "x"}, "/etc/passwd", ErrUnsafePath, "absolute"},
		{map[string]string{"": "x"}, "", ErrUnsafePath, "empty"},
		{map[string]string{".": "x"}, ".", ErrUnsafePath, "workspace itself"},
		{map[string]string{"a/b": "1", "a//b": "2"}, "a/b", ErrUnsafePath, `same file as "a//b"`},
		{map[string]string{"a": "1", "a/b": "2"}, "a", ErrUnsafePath, `"a/b" needs it to be a folder`},
		{map[string]string{"big": strings.Repeat("x", MaxSeedFileBytes+1)}, "big", ErrTooLarge, "limit per file"},
	} {
		err := ValidateFiles(c.files)
		var fe *FileError
		if !errors.As(err, &fe) || !errors.Is(err, c.sentinel) {
			t.Errorf("ValidateFiles(%v) = %v; want a *FileError matching %v", keysOf(c.files), err, c.sentinel)
			continue
		}
		if fe.Path != c.path || !strings.Contains(err.Error(), c.text) || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.path)) {
			t.Errorf("ValidateFiles(%v) = %q (path %q); want path %q and %q", keysOf(c.files), err, fe.Path, c.path, c.text)
		}
	}
	many := map[string]string{}
	for i := range MaxSeedFiles + 1 {
		many[fmt.Sprintf("f%04d", i)] = ""
	}
	if err := ValidateFiles(many); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too many files: %v", err)
	}
	total := map[string]string{}
	for i := range 9 {
		total[fmt.Sprintf("f%d", i)] = strings.Repeat("x", MaxSeedFileBytes)
	}
	if err := ValidateFiles(total); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "in all") {
		t.Errorf("too many bytes: %v", err)
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestSeed(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	writeFile(t, filepath.Join(dir, "old.txt"), "old")
	if err := Seed(root, map[string]string{"old.txt": "new", "./a/b/c.txt": "deep", "x.md": ""}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"old.txt": "new", "a/b/c.txt": "deep", "x.md": ""} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	// A refused set writes nothing.
	err = Seed(root, map[string]string{"fresh.txt": "x", "memory/journal.jsonl": "forged"})
	if !errors.Is(err, ErrReserved) {
		t.Fatalf("Seed with memory/: %v", err)
	}
	for _, p := range []string{"fresh.txt", "memory"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after a refused Seed", p)
		}
	}
	// A symlink in the workspace cannot carry a seed file out.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	err = Seed(root, map[string]string{"out/escaped.txt": "x"})
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != "out/escaped.txt" || !errors.Is(err, ErrUnsafePath) {
		t.Errorf("Seed through a symlink out: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "escaped.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was written outside the workspace")
	}
	if err := Seed(nil, nil); err == nil {
		t.Errorf("Seed(nil root) succeeded")
	}
}

func TestLoadDir(t *testing.T) {
	files, err := LoadDir(fstest.MapFS{
		"readme.md":       {Data: []byte("hi")},
		"data/x.json":     {Data: []byte("{}")},
		"memoryish/a.txt": {Data: []byte("fine")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 || files["readme.md"] != "hi" || files["data/x.json"] != "{}" || files["memoryish/a.txt"] != "fine" {
		t.Errorf("LoadDir = %v", files)
	}
	if err := ValidateFiles(files); err != nil {
		t.Errorf("LoadDir's result does not validate: %v", err)
	}

	_, err = LoadDir(fstest.MapFS{"a.txt": {}, "memory/journal.jsonl": {Data: []byte("{}")}})
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != "memory" || !errors.Is(err, ErrReserved) {
		t.Errorf("LoadDir with memory/: %v", err)
	}
	_, err = LoadDir(fstest.MapFS{"bin": {Data: []byte{0xff, 0xfe}}})
	if err == nil || !strings.Contains(err.Error(), "not UTF-8") {
		t.Errorf("LoadDir with a binary file: %v", err)
	}
	_, err = LoadDir(fstest.MapFS{"big": {Data: make([]byte, MaxSeedFileBytes+1)}})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("LoadDir with a big file: %v", err)
	}

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ok.txt"), "ok")
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	_, err = LoadDir(os.DirFS(dir))
	if !errors.As(err, &fe) || fe.Path != "link" || !errors.Is(err, ErrUnsafePath) {
		t.Errorf("LoadDir with a symlink: %v", err)
	}
}
