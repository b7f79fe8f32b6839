package cli_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// writerYAML is an agent whose turns write a file named after the message
// with write_file, then answer.
const writerYAML = `name: writer
model:
  provider: echo
  script:
    - tool: write_file
      args: {path: "notes/{{.UserMessage}}.txt", content: "written by the model"}
    - text: "wrote {{.UserMessage}}"
`

// TestStateRootIsOwnerOnly serves a project, runs turns that write
// workspace files (per-send and through write_file), schedules a reminder,
// restarts, runs more, and walks the whole state root: every folder must
// be 0700 and every file 0600, so that continuation tokens, messages and
// the memory journal are the owner's alone. The walk covers whatever a
// later version adds under the root.
func TestStateRootIsOwnerOnly(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, writerYAML)
	root := filepath.Join(t.TempDir(), "state")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	var s turnResult
	if st := call(t, "POST", p.url+"/v1/sessions", "", `{"message":"one","workspaceFiles":{"deep/er/seed.txt":"sent with the request"}}`, &s); st != 201 || s.Turn.Result != "wrote one" {
		t.Fatalf("start: %d %+v", st, s)
	}
	if st := call(t, "POST", p.url+"/v1/reminders", "", fmt.Sprintf(`{"sessionId":%q,"delaySeconds":3600,"message":"later"}`, s.SessionID), nil); st != 201 {
		t.Fatalf("reminder: %d", st)
	}
	if st, _ := continueWith(t, p.url, "", s.ContinuationToken, "two"); st != 200 {
		t.Fatalf("continue: %d", st)
	}
	checkOwnerOnly(t, root) // while serving: the SQLite -wal and -shm files exist
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	p = startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	if st, _ := continueWith(t, p.url, "", s.ContinuationToken, "three"); st != 200 {
		t.Fatalf("continue after the restart: %d", st)
	}
	start(t, p.url, "", "four")
	checkOwnerOnly(t, root)
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	checkOwnerOnly(t, root)
}

// TestExistingStateRootIsTightened opens a state root made world-readable
// (as older versions made them): serve makes the root and its folders
// owner-only.
func TestExistingStateRootIsTightened(t *testing.T) {
	t.Parallel()
	dir := writeProject(t, "name: old\n")
	root := filepath.Join(t.TempDir(), "state")
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	start(t, p.url, "", "hello")
	p.stop(syscall.SIGTERM)
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil {
			mode := os.FileMode(0o644)
			if d.IsDir() {
				mode = 0o755
			}
			os.Chmod(path, mode)
		}
		return nil
	})
	p = startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", root)
	start(t, p.url, "", "again")
	checkOwnerOnly(t, root)
}

// checkOwnerOnly walks root: folders 0700, files 0600, nothing else (a
// FIFO or socket left behind would be a finding too).
func checkOwnerOnly(t *testing.T, root string) {
	t.Helper()
	files, dirs := 0, 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while walking (a -shm at close)
			}
			return err
		}
		rel, _ := filepath.Rel(root, path)
		switch mode := info.Mode(); {
		case mode.IsDir():
			dirs++
			if mode.Perm() != 0o700 {
				t.Errorf("folder %s has mode %v; want drwx------", rel, mode)
			}
		case mode.IsRegular():
			files++
			if mode.Perm() != 0o600 {
				t.Errorf("file %s has mode %v; want -rw-------", rel, mode)
			}
		default:
			t.Errorf("%s is neither a file nor a folder: %v", rel, mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw the layout: a broken walk must not pass on nothing.
	if dirs < 8 || files < 5 {
		t.Fatalf("the walk saw %d folders and %d files under %s", dirs, files, root)
	}
}
