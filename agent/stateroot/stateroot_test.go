package stateroot

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestOpenCreatesTheLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, d := range []string{SessionsDir, RemindersDir, MemoryDir, ActorsDir, WorkspaceDir, FilesDir} {
		if st, err := os.Stat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, FormatFile))
	if err != nil || strings.TrimSpace(string(b)) != `{"format":2}` || r.Format() != 2 {
		t.Errorf("format file %q %v", b, err)
	}
	pid, _ := os.ReadFile(filepath.Join(dir, LockFile))
	if strings.TrimSpace(string(pid)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q, want this PID", pid)
	}
	if r.KVPath() != filepath.Join(dir, "sessions", "sessions.db") || DefaultStoreURL(dir) != "sqlite:"+filepath.Join(dir, "sessions", "sessions.db") {
		t.Errorf("kv path %s / %s", r.KVPath(), DefaultStoreURL(dir))
	}
	if r.JournalPath() != filepath.Join(dir, "memory", "journal.jsonl") {
		t.Errorf("journal %s", r.JournalPath())
	}
}

func TestSecondOpenFailsNamingTheFolderAndPID(t *testing.T) {
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir)
	var le *LockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) || le.PID != os.Getpid() {
		t.Fatalf("second Open: %v", err)
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("message %q names neither the folder nor the PID", err)
	}
	// Read-only checks work beside the holder.
	if err := Check(dir); err != nil {
		t.Errorf("Check beside a holder: %v", err)
	}
	r.Close()
	r2, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	r2.Close()
	r2.Close() // idempotent
}

func TestNewerFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, FormatFile), []byte(`{"format":3}`), 0o644)
	_, err := Open(dir)
	if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), "upgrade agentkit") || !strings.Contains(err.Error(), "format 3") {
		t.Fatalf("got %v", err)
	}
	if err := Check(dir); !errors.Is(err, ErrNewerFormat) {
		t.Errorf("Check: %v", err)
	}
	// The refusal left the lock free and nothing created.
	if _, err := os.Stat(filepath.Join(dir, SessionsDir)); !os.IsNotExist(err) {
		t.Errorf("sessions/ created in a refused root: %v", err)
	}
}

func TestCorruptFormatIsRefused(t *testing.T) {
	for _, content := range []string{"", "garbage", `{"format":0}`, `{"format":"1"}`, `{"format":1,"extra":true}`} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, FormatFile), []byte(content), 0o644)
		_, err := Open(dir)
		if !errors.Is(err, ErrBadFormat) || !strings.Contains(err.Error(), `{"format":2}`) {
			t.Errorf("%q: got %v", content, err)
		}
	}
}

func TestOpenNeedsADir(t *testing.T) {
	if _, err := Open(""); err == nil || !strings.Contains(err.Error(), "--state-root") {
		t.Errorf("got %v", err)
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	if _, err := Open(file); err == nil {
		t.Error("a file was accepted as a state root")
	}
}

func TestOpenMakesEverythingOwnerOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := map[string]os.FileMode{".": 0o700, FormatFile: 0o600, LockFile: 0o600, filepath.Join(SessionsDir, SessionsFile): 0o600}
	for _, d := range []string{SessionsDir, RemindersDir, MemoryDir, ActorsDir, WorkspaceDir, FilesDir} {
		want[d] = 0o700
	}
	for name, mode := range want {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want %v", name, st.Mode(), err, mode)
		}
	}
	if st, _ := os.Stat(r.SessionsPath()); st.Size() != 0 {
		t.Errorf("the session database was created with %d bytes; want an empty file for SQLite", st.Size())
	}
}

func TestOpenTightensAWideRoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"", "workspaces/s1/notes"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "workspaces/s1/notes/a.txt"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "workspaces/s1/run.sh"), []byte("x"), 0o755)
	outside := filepath.Join(t.TempDir(), "outside.txt")
	os.WriteFile(outside, []byte("x"), 0o644)
	os.Chmod(outside, 0o644)
	os.Symlink(outside, filepath.Join(dir, "workspaces/s1/link"))
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for name, mode := range map[string]os.FileMode{".": 0o700, "workspaces/s1": 0o700, "workspaces/s1/notes": 0o700, "workspaces/s1/notes/a.txt": 0o600, "workspaces/s1/run.sh": 0o700} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want %v", name, st.Mode(), err, mode)
		}
	}
	if st, err := os.Stat(outside); err != nil || st.Mode().Perm() != 0o644 {
		t.Error("the walk followed a symlink out of the root")
	}
}

// TestTheDefaultStoreFollowsTheFormat: a format-1 root keeps its default
// store in kv/kv.db until the runtime moves it and sets format 2; a root
// with no format file yet gets the new layout.
func TestTheDefaultStoreFollowsTheFormat(t *testing.T) {
	dir := t.TempDir()
	if got, want := DefaultStoreURL(dir), "sqlite:"+filepath.Join(dir, "sessions", "sessions.db"); got != want {
		t.Errorf("a root with no format file: %s, want %s", got, want)
	}
	os.WriteFile(filepath.Join(dir, FormatFile), []byte(`{"format":1}`), 0o644)
	if got, want := DefaultStoreURL(dir), "sqlite:"+filepath.Join(dir, "kv", "kv.db"); got != want {
		t.Errorf("format 1: %s, want %s", got, want)
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Format() != 1 || r.FormatOneKVPath() != filepath.Join(dir, "kv", "kv.db") {
		t.Errorf("an open format-1 root: format %d, old store %s", r.Format(), r.FormatOneKVPath())
	}
	if err := r.SetFormat(2); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, FormatFile))
	if r.Format() != 2 || strings.TrimSpace(string(b)) != `{"format":2}` || r.KVPath() != r.SessionsPath() {
		t.Errorf("after SetFormat(2): format %d, file %q, store %s", r.Format(), b, r.KVPath())
	}
}

// An owner-only root whose session database and SQLite's files beside it
// are world-readable (restored from a backup, say): Open tightens them,
// the -journal file of a database in rollback mode included, though it
// does not walk an owner-only root.
func TestOpenTightensTheSessionDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	db := filepath.Join(dir, SessionsDir, SessionsFile)
	for _, s := range []string{"", "-wal", "-shm", "-journal"} {
		if err := os.WriteFile(db+s, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chmod(db+s, 0o644)
	}
	r, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, s := range []string{"", "-wal", "-shm", "-journal"} {
		if st, err := os.Stat(db + s); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want 0600", SessionsFile+s, st.Mode(), err)
		}
	}
}
