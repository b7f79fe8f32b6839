package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// server is an "agentkit serve" this tool started.
type server struct {
	cmd        *exec.Cmd
	dir        string // project, state root and log
	keep       bool
	info       io.Writer
	base       string // http://HOST:PORT
	conditions string // what was started, for the report
	exited     chan error
}

// startServer builds agentkit unless cfg.bin names it, writes a project
// folder with an echo agent, and starts "agentkit serve" on a fresh state
// root and a free loopback port. It returns once the server listens.
func startServer(ctx context.Context, cfg config, info io.Writer) (s *server, err error) {
	dir, err := os.MkdirTemp("", "agentkit-load-")
	if err != nil {
		return nil, err
	}
	s = &server{dir: dir, keep: cfg.keep, info: info, exited: make(chan error, 1)}
	defer func() {
		if err != nil && !cfg.keep {
			os.RemoveAll(dir)
		}
	}()
	bin := cfg.bin
	if bin == "" {
		bin = filepath.Join(dir, "agentkit")
		fmt.Fprintln(info, "load: building agentkit (go build agentkit/cmd/agentkit)")
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "agentkit/cmd/agentkit")
		if out, err := build.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building agentkit: %w: %s (run inside the agentkit module, or give -bin)", err, strings.TrimSpace(string(out)))
		}
	}
	project := filepath.Join(dir, "project")
	if err := os.MkdirAll(project, 0o755); err != nil {
		return nil, err
	}
	yaml := fmt.Sprintf("name: load\nmodel: echo\nmemory: %t\n", cfg.memory)
	if err := os.WriteFile(filepath.Join(project, "agentkit.yaml"), []byte(yaml), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	args := []string{"serve", "--dir", project, "--state-root", filepath.Join(dir, "state"),
		"--addr", "127.0.0.1:0", "--log-level", "warn"}
	if cfg.storage != "" {
		args = append(args, "--storage", cfg.storage)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stderr = logFile
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case line, ok := <-lines:
		addr, found := strings.CutPrefix(line, "listening on ")
		if !ok || !found {
			return nil, errors.Join(fmt.Errorf("agentkit serve printed %q instead of its address; its log: %s", line, tail(logPath)), s.kill())
		}
		s.base = strings.TrimSpace(addr)
	case <-time.After(time.Minute):
		return nil, errors.Join(fmt.Errorf("agentkit serve did not listen within a minute; its log: %s", tail(logPath)), s.kill())
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), s.kill())
	}
	store := "the embedded SQLite store in its state root"
	if cfg.storage != "" {
		store = "the store " + cfg.storage
	}
	memory := "memory journal on"
	if !cfg.memory {
		memory = "memory journal off"
	}
	s.conditions = fmt.Sprintf("agentkit serve (%s) at %s: echo model, %s, %s, a fresh state root", bin, s.base, memory, store)
	fmt.Fprintf(info, "load: started %s; its folder: %s\n", s.conditions, dir)
	return s, nil
}

// stop ends the server with SIGTERM (it finishes running turns), waits
// for it, and removes its folder unless asked to keep it.
func (s *server) stop() error {
	var err error
	if sigErr := s.cmd.Process.Signal(os.Interrupt); sigErr != nil {
		err = sigErr
	}
	select {
	case waitErr := <-s.exited:
		if waitErr != nil {
			err = errors.Join(err, fmt.Errorf("agentkit serve exited with %w; its log: %s", waitErr, tail(filepath.Join(s.dir, "serve.log"))))
		}
	case <-time.After(time.Minute):
		err = errors.Join(err, errors.New("agentkit serve did not stop within a minute of SIGINT; killed"), s.kill())
	}
	if s.keep {
		fmt.Fprintln(s.info, "load: kept the server's folder", s.dir)
		return err
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// kill ends the server at once.
func (s *server) kill() error {
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-s.exited
	return nil
}

// tail returns the end of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	if s == "" {
		return "(empty)"
	}
	return s
}
