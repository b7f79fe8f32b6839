package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// recorder is ops that do the real calls and note each one, with what the
// file held when it was synced.
type recorder struct {
	calls []string
	fail  string // the call ("sync-file", "rename", "sync-dir") that fails
}

var errInjected = errors.New("injected failure")

func (r *recorder) ops() ops {
	return ops{
		syncFile: func(f *os.File) error {
			st, err := f.Stat()
			if err != nil {
				return err
			}
			r.calls = append(r.calls, fmt.Sprintf("sync-file %s (%d bytes)", filepath.Base(f.Name()), st.Size()))
			if r.fail == "sync-file" {
				return &fs.PathError{Op: "sync", Path: f.Name(), Err: errInjected}
			}
			return f.Sync()
		},
		rename: func(from, to string) error {
			r.calls = append(r.calls, "rename "+filepath.Base(from)+" "+filepath.Base(to))
			if r.fail == "rename" {
				return &os.LinkError{Op: "rename", Old: from, New: to, Err: errInjected}
			}
			return os.Rename(from, to)
		},
		syncDir: func(dir string) error {
			r.calls = append(r.calls, "sync-dir "+dir)
			if r.fail == "sync-dir" {
				return &fs.PathError{Op: "sync", Path: dir, Err: errInjected}
			}
			return syncDir(dir)
		},
	}
}

// tempName returns the temporary file's name from the recorded rename.
func (r *recorder) tempName(t *testing.T) string {
	t.Helper()
	for _, c := range r.calls {
		if f, ok := strings.CutPrefix(c, "rename "); ok {
			return strings.Fields(f)[0]
		}
	}
	t.Fatalf("no rename among %q", r.calls)
	return ""
}

// names lists the folder.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// The durable order: the whole data synced in the temporary file, then the
// rename in the same folder, then the folder synced. A write that skips
// either fsync, or syncs before writing or after renaming, fails here.
func TestWriteSyncsFileThenRenamesThenSyncsFolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	data := []byte(`{"format":2}` + "\n")
	if err := write(r.ops(), path, data, nil); err != nil {
		t.Fatal(err)
	}
	tmp := r.tempName(t)
	want := []string{
		fmt.Sprintf("sync-file %s (%d bytes)", tmp, len(data)),
		"rename " + tmp + " state.json",
		"sync-dir " + dir,
	}
	if !slices.Equal(r.calls, want) {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(r.calls, "\n"), strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(tmp, ".state.json.tmp-") {
		t.Errorf("temporary file %q: want a hidden name beside the target, .state.json.tmp-*", tmp)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != string(data) {
		t.Fatalf("the file holds %q (%v), want %q", got, err, data)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want owner-only 0600", st.Mode().Perm())
	}
	if n := names(t, dir); !slices.Equal(n, []string{"state.json"}) {
		t.Errorf("the folder holds %q, want only the file", n)
	}
}

func TestWriteNoSyncSkipsBothSyncs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.json")
	r := &recorder{}
	if err := write(r.ops(), path, []byte("x"), &Options{NoSync: true}); err != nil {
		t.Fatal(err)
	}
	if len(r.calls) != 1 || !strings.HasPrefix(r.calls[0], "rename ") {
		t.Fatalf("calls %q, want the rename alone", r.calls)
	}
	if got, _ := os.ReadFile(path); string(got) != "x" {
		t.Fatalf("the file holds %q", got)
	}
}

// A failure before the rename leaves the old file and no temporary file; a
// failure of the folder's sync is reported, with the new file in place.
func TestWriteFailures(t *testing.T) {
	for _, tc := range []struct {
		fail     string
		contents string // of the target afterwards
	}{
		{"sync-file", "old"},
		{"rename", "old"},
		{"sync-dir", "new"},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			r := &recorder{fail: tc.fail}
			err := write(r.ops(), path, []byte("new"), nil)
			if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("error %v, want the injected failure naming a file in %s", err, dir)
			}
			if got, _ := os.ReadFile(path); string(got) != tc.contents {
				t.Errorf("the file holds %q, want %q", got, tc.contents)
			}
			if n := names(t, dir); !slices.Equal(n, []string{"f"}) {
				t.Errorf("the folder holds %q: the temporary file was left behind", n)
			}
		})
	}
}

func TestWriteOptionsAndErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "journal.jsonl")
	r := &recorder{}
	if err := write(r.ops(), path, []byte("a\n"), &Options{Perm: 0o640, TempPrefix: ".purge-"}); err != nil {
		t.Fatal(err)
	}
	if tmp := r.tempName(t); !strings.HasPrefix(tmp, ".purge-") {
		t.Errorf("temporary file %q, want the prefix .purge-", tmp)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640 as asked", st.Mode().Perm())
	}
	// The exported Write does the same on the real file system.
	if err := Write(path, []byte("b\n"), nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "b\n" {
		t.Fatalf("the file holds %q after Write", got)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != DefaultPerm {
		t.Errorf("Write without options left mode %v, want %v", st.Mode().Perm(), DefaultPerm)
	}
	missing := filepath.Join(dir, "gone", "f")
	if err := Write(missing, []byte("x"), nil); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), filepath.Dir(missing)) {
		t.Fatalf("Write into a missing folder: %v, want a not-exist error naming %s", err, filepath.Dir(missing))
	}
	// Renaming over a folder fails; nothing is left behind.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(sub, []byte("x"), nil); err == nil {
		t.Fatal("Write over a non-empty folder succeeded")
	}
	if n := names(t, dir); !slices.Equal(n, []string{"journal.jsonl", "sub"}) {
		t.Errorf("the folder holds %q after a failed write", n)
	}
}
