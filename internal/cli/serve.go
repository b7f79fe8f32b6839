package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"agentkit/server"
)

func init() {
	register(command{name: "serve", summary: "serve the agent of a project folder over HTTP", run: func(e *env, args []string) error {
		return runServe(e, args, false)
	}})
	register(command{name: "dev", summary: "serve on loopback with developer defaults: readable logs, debug level", run: func(e *env, args []string) error {
		return runServe(e, args, true)
	}})
}

const serveUsage = `serve [--dir DIR] [--state-root DIR] [--addr HOST:PORT] [--storage URL]
       [--serving local|ledger] [--auth-token T] [--insecure]
       [--allowed-hosts H,...] [flags]

Serves the agent defined by DIR/agentkit.yaml until SIGINT or SIGTERM, then
finishes running turns and exits. The first line on standard output is
"listening on http://HOST:PORT"; logs go to standard error.`

const devUsage = `dev [--dir DIR] [--state-root DIR] [--addr HOST:PORT] [--storage URL] [flags]

Serves like "agentkit serve" with developer defaults: loopback addresses
only, text logs at debug level.`

type serveFlags struct {
	dir, stateRoot, addr, storage, serving, authToken string
	insecure                                          bool
	maxBody                                           byteSize
	shutdownTimeout                                   time.Duration
	timeouts                                          timeoutFlags
	logFormat, logLevel                               string
	corsOrigins, allowedHosts                         string
}

func runServe(e *env, args []string, dev bool) error {
	name, usage := "serve", serveUsage
	f := serveFlags{maxBody: server.DefaultMaxBodyBytes}
	if dev {
		name, usage = "dev", devUsage
	}
	fs := newFlags(e, name, usage)
	fs.StringVar(&f.dir, "dir", ".", "the project folder, holding agentkit.yaml")
	fs.StringVar(&f.stateRoot, "state-root", "", "the folder where this host keeps its state (default DIR/.agentkit; kept)")
	fs.StringVar(&f.addr, "addr", server.DefaultAddr, "HOST:PORT to listen on; port 0 picks a free port")
	fs.StringVar(&f.storage, "storage", "", "store URL, overriding storage: in agentkit.yaml: file:PATH, sqlite:PATH, postgres://…, redis://…, nats://…, s3://…, agentkit+http(s)://TOKEN@HOST/NAMESPACE (empty: the embedded SQLite store under the state root)")
	fs.StringVar(&f.serving, "serving", "", "serving mode, overriding serving: in agentkit.yaml: local or ledger")
	fs.StringVar(&f.authToken, "auth-token", "", fmt.Sprintf("bearer token every /v1/ route requires (empty: no auth; off loopback a token of at least %d bytes is required, unless --insecure)", server.MinAuthTokenLen))
	if !dev {
		fs.BoolVar(&f.insecure, "insecure", false, "allow a non-loopback --addr without --auth-token (on every interface, only with --allowed-hosts)")
	}
	fs.StringVar(&f.corsOrigins, "cors-origins", "", "comma-separated origins of browser pages allowed to call the API, such as https://chat.example.com (overrides cors.origins in agentkit.yaml; default none)")
	fs.StringVar(&f.allowedHosts, "allowed-hosts", "", "comma-separated names and addresses clients reach the server by, beyond localhost, 127.0.0.1 and [::1], such as agent.lan,192.0.2.10 (.example.com: a domain and the names under it); without --auth-token other Host headers get 421 (overrides allowedHosts in agentkit.yaml)")
	fs.Var(&f.maxBody, "max-body-bytes", "request body limit, such as 1MiB; larger bodies get 413")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "how long to let running turns finish after SIGINT or SIGTERM; then they are canceled and recorded as failed")
	f.timeouts.register(fs)
	logFormat, logLevel := "json", "info"
	if dev {
		logFormat, logLevel = "text", "debug"
	}
	fs.StringVar(&f.logFormat, "log-format", logFormat, "log format on standard error: json or text")
	fs.StringVar(&f.logLevel, "log-level", logLevel, "log level: debug, info, warn or error")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("%s takes no arguments, got %q; the project folder is --dir", name, pos[0])
	}
	if f.shutdownTimeout <= 0 {
		return usagef("--shutdown-timeout %s: use a positive duration such as 30s", f.shutdownTimeout)
	}
	if err := f.timeouts.check(); err != nil {
		return err
	}
	if dev {
		host, _, err := net.SplitHostPort(f.addr)
		if err == nil && !server.IsLoopback(host) {
			return usagef("--addr %s: dev listens on loopback only (127.0.0.1, ::1 or localhost); use agentkit serve for other addresses", f.addr)
		}
	}
	if err := server.CheckAddr(f.addr, f.authToken, f.insecure); err != nil {
		flagName := "--addr"
		if errors.Is(err, server.ErrWeakToken) {
			flagName = "--auth-token"
		}
		return usagef("%s: %s", flagName, strings.TrimPrefix(err.Error(), "server: "))
	}
	hosts := splitList(f.allowedHosts)
	if err := server.CheckHostNames(hosts); err != nil {
		return usagef("--allowed-hosts: %s", strings.TrimPrefix(err.Error(), "server: "))
	}
	if strings.ContainsAny(f.authToken, " \t\r\n") {
		return usagef("--auth-token: the token contains white space; use printable characters without spaces")
	}
	origins := splitList(f.corsOrigins)
	if err := server.CheckOrigins(origins); err != nil {
		return usagef("--cors-origins: %s", strings.TrimPrefix(err.Error(), "server: "))
	}
	log, err := newLogger(e.stderr, f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	p, err := loadProject(f.dir)
	if err != nil {
		return err
	}
	if f.stateRoot == "" {
		f.stateRoot = filepath.Join(p.dir, ".agentkit")
	}
	if origins == nil {
		origins = p.file.CORSOrigins
	}
	if hosts == nil {
		hosts = p.file.AllowedHosts
	}
	if err := server.CheckAllowedHosts(f.addr, f.authToken, hosts); err != nil {
		return usagef("--addr: %s", strings.TrimPrefix(err.Error(), "server: "))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	rc, closeStore, err := p.runtimeConfig(ctx, f.serving, f.storage)
	if err != nil {
		return err
	}
	defer closeStore()
	f.timeouts.apply(&rc)
	rc.StateRoot = f.stateRoot
	rc.Logger = log
	err = server.Serve(ctx, rc, server.Config{
		Options: server.Options{
			AuthToken:    f.authToken,
			MaxBodyBytes: int64(f.maxBody),
			Version:      Version,
			Logger:       log,
			CORSOrigins:  origins,
			AllowedHosts: hosts,
			Evals:        server.EvalOptions{HistoryWindow: p.file.Evals.HistoryWindow, Heartbeat: p.file.Evals.Heartbeat},
		},
		Addr:            f.addr,
		Insecure:        f.insecure,
		ShutdownTimeout: f.shutdownTimeout,
		OnListen: func(a net.Addr) {
			fmt.Fprintf(e.stdout, "listening on http://%s\n", a)
		},
	})
	if errors.Is(err, server.ErrInsecure) {
		return usagef("%v", err)
	}
	return err
}

// splitList splits a comma-separated flag value, dropping empty items; nil
// for none.
func splitList(v string) []string {
	var out []string
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
