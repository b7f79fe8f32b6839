package filekv

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"agentkit/kv"
)

// event is one system call of a durable write, by the path it touched.
type event struct {
	op   string // open, write, fsync, close, rename
	path string // for rename, the target
	from string // for rename, the source
}

func (e event) String() string {
	if e.op == "rename" {
		return fmt.Sprintf("rename %s -> %s", filepath.Base(e.from), e.path)
	}
	return e.op + " " + e.path
}

// recorder makes the real system calls and records them.
type recorder struct {
	realSys
	mu     sync.Mutex
	fds    map[int]string
	events []event
}

func (r *recorder) add(e event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) path(fd int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fds[fd]
}

func (r *recorder) Open(path string, flags int, perm uint32) (int, error) {
	fd, err := r.realSys.Open(path, flags, perm)
	if err == nil {
		r.mu.Lock()
		r.fds[fd] = path
		r.mu.Unlock()
		r.add(event{op: "open", path: path})
	}
	return fd, err
}

func (r *recorder) Write(fd int, p []byte) (int, error) {
	r.add(event{op: "write", path: r.path(fd)})
	return r.realSys.Write(fd, p)
}

func (r *recorder) Fsync(fd int) error {
	r.add(event{op: "fsync", path: r.path(fd)})
	return r.realSys.Fsync(fd)
}

func (r *recorder) Close(fd int) error {
	r.add(event{op: "close", path: r.path(fd)})
	return r.realSys.Close(fd)
}

func (r *recorder) Rename(from, to string) error {
	r.add(event{op: "rename", path: to, from: from})
	return r.realSys.Rename(from, to)
}

func (r *recorder) take() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// checkDurableOrder checks that the events of one write hold, in this
// order: the value written to a temporary file, that file fsynced, renamed
// onto final, and final's folder fsynced.
func checkDurableOrder(t *testing.T, what string, ev []event, final string) {
	t.Helper()
	find := func(from int, match func(e event) bool) int {
		for i := from; i < len(ev); i++ {
			if match(ev[i]) {
				return i
			}
		}
		return -1
	}
	ren := find(0, func(e event) bool { return e.op == "rename" && e.path == final })
	if ren < 0 {
		t.Fatalf("%s: no rename onto %s; system calls: %v", what, final, ev)
	}
	tmp := ev[ren].from
	lastWrite, fsync := -1, -1
	for i, e := range ev[:ren] {
		switch {
		case e.path == tmp && e.op == "write":
			lastWrite = i
		case e.path == tmp && e.op == "fsync":
			fsync = i
		}
	}
	switch {
	case lastWrite < 0:
		t.Errorf("%s: the temporary file was not written before the rename; system calls: %v", what, ev)
	case fsync < lastWrite:
		t.Errorf("%s: the temporary file was not fsynced after its last write and before the rename; system calls: %v", what, ev)
	}
	dirSync := find(ren+1, func(e event) bool { return e.op == "fsync" && e.path == filepath.Dir(final) })
	if dirSync < 0 {
		t.Errorf("%s: the folder %s was not fsynced after the rename, before the write returned; system calls: %v", what, filepath.Dir(final), ev)
	}
}

// Every write makes its value durable in the order that survives a power
// cut: write the temporary file, fsync it, rename it into place, fsync
// the folder, and only then return. A crash test cannot see a missing
// fsync (the page cache outlives the process), so the calls are recorded.
func TestWritesAreDurableInOrder(t *testing.T) {
	ctx := context.Background()
	st, err := open(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{fds: map[int]string{}}
	st.sys = rec
	db, err := kv.New("file", st)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	file := func(key string) string {
		dir, name := keyPath(key)
		return filepath.Join(st.abs(dir), name)
	}
	small, big := []byte("v"), []byte(strings.Repeat("x", 100<<10)) // one write call, or two
	for _, c := range []struct {
		what string
		key  string
		do   func() error
	}{
		{"Put of a new key in a new folder", "a/b/c", func() error { return db.Put(ctx, "a/b/c", small) }},
		{"Put over an existing key", "a/b/c", func() error { return db.Put(ctx, "a/b/c", big) }},
		{"Put in the root", "k", func() error { return db.Put(ctx, "k", small) }},
		{"PutIfAbsent", "a/new", func() error { _, err := db.PutIfAbsent(ctx, "a/new", small); return err }},
		{"PutIfVersion", "a/new", func() error {
			_, ver, err := db.GetWithVersion(ctx, "a/new")
			if err != nil {
				return err
			}
			rec.take()
			_, err = db.PutIfVersion(ctx, "a/new", big, ver)
			return err
		}},
	} {
		rec.take()
		if err := c.do(); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		checkDurableOrder(t, c.what, rec.take(), file(c.key))
	}
	// A new folder's own entry is made durable too: its parent is fsynced
	// before the write returns.
	rec.take()
	if err := db.Put(ctx, "x/y/z", small); err != nil {
		t.Fatal(err)
	}
	ev := rec.take()
	for _, dir := range []string{st.dir, filepath.Join(st.dir, "x")} {
		found := false
		for _, e := range ev {
			found = found || e.op == "fsync" && e.path == dir
		}
		if !found {
			t.Errorf("Put into new folders did not fsync %s, the parent of a new folder; system calls: %v", dir, ev)
		}
	}
}
