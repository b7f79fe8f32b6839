package filekv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"agentkit/internal/proctest"
	"agentkit/internal/testenv"
	"agentkit/kv"
	"agentkit/kv/kvtest"
)

func TestMain(m *testing.M) {
	proctest.Main(m, map[string]func() error{
		"hold":  childHold,
		"crash": childCrash,
	})
}

// childHold opens the store in FILEKV_DIR, says "locked", and keeps it open
// until stdin closes.
func childHold() error {
	db, err := Open(context.Background(), os.Getenv("FILEKV_DIR"))
	if err != nil {
		return err
	}
	fmt.Println("locked")
	var b [1]byte
	os.Stdin.Read(b[:])
	return db.Close()
}

func childCrash() error {
	db, err := Open(context.Background(), os.Getenv("FILEKV_DIR"))
	if err != nil {
		return err
	}
	return proctest.CrashWriter(db, os.Stdout)
}

func openT(t testing.TB, dir string) *kv.DB {
	t.Helper()
	db, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// harness makes each namespace a new folder. The conformance suite writes
// tens of thousands of keys; on a shared disk at a few milliseconds per
// fsync that alone takes minutes, so its folders go to a tmpfs (where fsync
// returns at once but every other system call is real) when one is
// available: FILEKV_TEST_TMPFS, default /dev/shm. The crash test, the
// focused tests and the benchmarks use the real disk.
func harness() kvtest.Harness {
	return kvtest.Harness{
		NewNamespace: func(t testing.TB) kvtest.Opener {
			dir := fastTempDir(t)
			return func(t testing.TB) *kv.DB {
				db, err := Open(context.Background(), dir)
				if err != nil {
					t.Fatal(err)
				}
				return db
			}
		},
	}
}

func fastTempDir(t testing.TB) string {
	base := testenv.Getenv("FILEKV_TEST_TMPFS", "/dev/shm")
	dir, err := os.MkdirTemp(base, "filekv-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestConformance(t *testing.T) {
	kvtest.Run(t, harness())
}

func TestOpenURLForms(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	t.Chdir(base)
	for _, c := range []struct{ url, dir string }{
		{"file:" + filepath.Join(base, "abs"), filepath.Join(base, "abs")},
		{"file://" + filepath.Join(base, "three"), filepath.Join(base, "three")},
		{"file://localhost" + filepath.Join(base, "local"), filepath.Join(base, "local")},
		{"file:rel/dir", filepath.Join(base, "rel", "dir")},
		{"file:sp%20ace", filepath.Join(base, "sp ace")},
		{filepath.Join(base, "bare"), filepath.Join(base, "bare")},
		{"./dot", filepath.Join(base, "dot")},
	} {
		db, err := kv.Open(ctx, c.url)
		if err != nil {
			t.Fatalf("open %q: %v", c.url, err)
		}
		if db.Name() != "file" {
			t.Errorf("open %q: driver %q, want file", c.url, db.Name())
		}
		if err := db.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatalf("%q: put: %v", c.url, err)
		}
		if _, err := os.Stat(filepath.Join(c.dir, "k.kv")); err != nil {
			t.Errorf("open %q: the key's file is not in %s: %v", c.url, c.dir, err)
		}
		db.Close()
	}
	for _, c := range []struct{ url, want string }{
		{"file://otherhost/x", "host"},
		{"file:" + filepath.Join(base, "q") + "?sync=off", "sync"},
		{"file:", "no folder"},
	} {
		if db, err := kv.Open(ctx, c.url); err == nil {
			db.Close()
			t.Errorf("open %q succeeded", c.url)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("open %q: %v; want it to mention %q", c.url, err, c.want)
		}
	}
}

func TestLayoutOnDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openT(t, dir)
	for _, k := range []string{"x", "x/y", "a b/.c"} {
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return nil
	})
	slices.Sort(files)
	want := []string{".format", ".lock", "a+20b/+2Ec.kv", "x.kv", "x/y.kv"}
	if !slices.Equal(files, want) {
		t.Fatalf("files %q, want %q", files, want)
	}
	pid, _ := os.ReadFile(filepath.Join(dir, ".lock"))
	if strings.TrimSpace(string(pid)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want this process's id %d", pid, os.Getpid())
	}
}

func TestLockSameProcess(t *testing.T) {
	dir := t.TempDir()
	db := openT(t, dir)
	_, err := Open(context.Background(), dir)
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("second Open: %v, want a *LockedError", err)
	}
	abs, _ := filepath.Abs(dir)
	if le.Dir != abs || le.PID != os.Getpid() || !strings.Contains(err.Error(), abs) {
		t.Errorf("error %v (dir %q pid %d); want dir %q and pid %d", err, le.Dir, le.PID, abs, os.Getpid())
	}
	db.Close()
	db2, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	db2.Close()
}

// TestLockOtherProcess holds the root from a child process: Open here must
// fail naming the folder and the child's PID, and succeed once it exits.
func TestLockOtherProcess(t *testing.T) {
	dir := t.TempDir()
	child := proctest.Start(t, "hold", "FILEKV_DIR="+dir)
	child.Expect("locked", 30*time.Second)
	_, err := Open(context.Background(), dir)
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("Open beside another process: %v, want a *LockedError", err)
	}
	msg := err.Error()
	if le.PID != child.PID() || !strings.Contains(msg, strconv.Itoa(child.PID())) || !strings.Contains(msg, dir) {
		t.Fatalf("error %q (PID %d); want the folder %s and the child's PID %d", msg, le.PID, dir, child.PID())
	}
	if _, err := child.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, child.Stderr())
	}
	db, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatalf("open after the other process closed: %v", err)
	}
	db.Close()
}

func TestRefusesForeignFolder(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600)
	_, err := Open(context.Background(), dir)
	if err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("open of a folder with other files: %v; want a refusal naming notes.txt", err)
	}
	if _, err := os.Stat(filepath.Join(dir, ".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refusal left a lock file in the folder: %v", err)
	}
	// The folder can be cleaned and used.
	os.Remove(filepath.Join(dir, "notes.txt"))
	openT(t, dir)

	file := filepath.Join(t.TempDir(), "plain")
	os.WriteFile(file, nil, 0o600)
	if _, err := Open(context.Background(), file); err == nil {
		t.Fatal("opened a plain file as a root")
	}
}

func TestRefusesNewerFormat(t *testing.T) {
	dir := t.TempDir()
	db := openT(t, dir)
	db.Close()
	os.WriteFile(filepath.Join(dir, ".format"), []byte("agentkit filekv format 2\n"), 0o600)
	_, err := Open(context.Background(), dir)
	if err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("open of a newer layout: %v; want an error saying it is newer", err)
	}
}

// TestTempFilesCleanedAndIgnored plants what a crash leaves: a temporary
// file. List never shows it and the next Open removes it.
func TestTempFilesCleanedAndIgnored(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openT(t, dir)
	db.Put(ctx, "k", []byte("v"))
	tmp := filepath.Join(dir, ".tmp-crashed")
	os.WriteFile(tmp, []byte("half a value"), 0o600)
	var keys []string
	for k, err := range db.ListKeys(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if !slices.Equal(keys, []string{"k"}) {
		t.Fatalf("keys %q, want [k]", keys)
	}
	db.Close()
	openT(t, dir)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the leftover temporary file survived Open: %v", err)
	}
}

func TestDamagedFileIsAnError(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openT(t, dir)
	db.Put(ctx, "k", []byte("hello world"))
	path := filepath.Join(dir, "k.kv")
	b, _ := os.ReadFile(path)
	b[len(b)-1] ^= 1
	os.WriteFile(path, b, 0o600)
	_, err := db.Get(ctx, "k")
	if err == nil || errors.Is(err, kv.ErrNotFound) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("get of a damaged file: %v; want a damage error, not a value or a miss", err)
	}
	os.WriteFile(path, b[:10], 0o600)
	if _, err := db.Get(ctx, "k"); err == nil || errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("get of a truncated file: %v", err)
	}
	for _, err := range db.List(ctx, "") {
		if err == nil {
			t.Fatal("listing yielded a damaged file's value")
		}
		break
	}
}

func TestForeignFilesNotListed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openT(t, dir)
	db.Put(ctx, "a/b", []byte("1"))
	os.WriteFile(filepath.Join(dir, "a", "README"), nil, 0o600)
	os.WriteFile(filepath.Join(dir, "a", "+62.kv"), nil, 0o600) // "b" spelled another way
	os.WriteFile(filepath.Join(dir, "a", ".swp"), nil, 0o600)
	var keys []string
	for e, err := range db.List(ctx, "a/") {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, e.Key)
	}
	if !slices.Equal(keys, []string{"a/b"}) {
		t.Fatalf("keys %q, want [a/b]", keys)
	}
}

func TestDeletePrunesEmptyFolders(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openT(t, dir)
	db.Put(ctx, "p/q/r/s", []byte("1"))
	db.Put(ctx, "p/keep", []byte("1"))
	if err := db.Delete(ctx, "p/q/r/s"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "p", "q")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("p/q left behind after its last key went: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "p", "keep.kv")); err != nil {
		t.Errorf("pruning removed a sibling: %v", err)
	}
	// The folder comes back on the next write.
	if err := db.Put(ctx, "p/q/r/s", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if v, err := db.Get(ctx, "p/q/r/s"); err != nil || string(v) != "2" {
		t.Fatalf("get after re-create: %q, %v", v, err)
	}
}

func TestListPrefixInsideLongSegment(t *testing.T) {
	ctx := context.Background()
	db := openT(t, t.TempDir())
	long := strings.Repeat("a", 600)
	keys := []string{long, long + "b", long + "/c", long[:300] + "z", "a", "b/" + long}
	for _, k := range keys {
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	for _, prefix := range []string{"", "a", long[:250], long[:480], long, long + "/", "b/" + long[:10], "zz"} {
		var want []string
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		var got []string
		for e, err := range db.List(ctx, prefix) {
			if err != nil {
				t.Fatal(err)
			}
			if string(e.Value) != e.Key {
				t.Fatalf("key %.20q… holds the wrong value", e.Key)
			}
			got = append(got, e.Key)
		}
		if !slices.Equal(got, want) {
			t.Errorf("prefix of %d bytes: %d keys, want %d", len(prefix), len(got), len(want))
		}
	}
}

func TestCrash(t *testing.T) {
	dir := t.TempDir()
	proctest.RunCrash(t, proctest.Crash{
		Role:   "crash",
		Env:    []string{"FILEKV_DIR=" + dir},
		Cycles: 20,
		Open: func(t testing.TB) *kv.DB {
			db, err := Open(context.Background(), dir)
			if err != nil {
				t.Fatalf("reopen after the kill (the dead writer's lock must be gone): %v", err)
			}
			return db
		},
		Check: func(t testing.TB, _ *kv.DB) {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), tmpPrefix) {
					t.Fatalf("temporary file %s left after reopening", e.Name())
				}
			}
		},
	})
}
