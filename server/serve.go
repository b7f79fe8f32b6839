package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"agentkit/agent"
)

// DefaultAddr is the address Serve listens on when Config.Addr is empty:
// loopback only.
const DefaultAddr = "127.0.0.1:8080"

// DefaultShutdownTimeout is how long Serve waits for running requests when
// its context ends, if Config.ShutdownTimeout is zero.
const DefaultShutdownTimeout = 2 * time.Minute

// ErrInsecure is returned by CheckAddr and Serve for a non-loopback
// address without an auth token and without Config.Insecure.
var ErrInsecure = errors.New("server: refusing to serve a non-loopback address without an auth token")

// ErrWeakToken is returned by CheckAddr and Serve for a non-loopback
// address whose auth token is shorter than MinAuthTokenLen, without
// Config.Insecure.
var ErrWeakToken = errors.New("server: refusing to serve a non-loopback address with a short auth token")

// ErrShutdownIncomplete is returned by Serve when turns were still running
// CancelGrace after they were canceled at the end of the shutdown timeout.
// The runtime is left open (its state root locked) for them; the program
// should exit, which releases the lock.
var ErrShutdownIncomplete = errors.New("server: turns did not stop after they were canceled")

// DefaultCancelGrace is how long Serve waits for canceled turns to end when
// Config.CancelGrace is zero.
const DefaultCancelGrace = 10 * time.Second

// MinAuthTokenLen is the shortest auth token accepted on a non-loopback
// address: 16 bytes, so that even a token of hex digits holds 64 random
// bits, out of reach of guessing over the network.
const MinAuthTokenLen = 16

// Config configures Serve: the handler's Options and the listener.
type Config struct {
	Options
	// Addr is the HOST:PORT to listen on; empty means DefaultAddr. Port 0
	// picks a free port (OnListen reports it).
	Addr string
	// Insecure allows a non-loopback Addr without an AuthToken; on every
	// interface (0.0.0.0, ::, an empty host) only with AllowedHosts
	// (CheckAllowedHosts).
	Insecure bool
	// ShutdownTimeout bounds the wait for running requests (turns) once
	// the context ends; after it, running turns are canceled and their
	// connections closed. Zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// CancelGrace bounds the wait for turns canceled at the end of the
	// shutdown timeout to record their failure and end. Serve returns
	// ErrShutdownIncomplete when it runs out. Zero means
	// DefaultCancelGrace.
	CancelGrace time.Duration
	// OnListen, when set, is called once the runtime is open and the
	// listener bound, with the listener's address, just before requests
	// are served.
	OnListen func(addr net.Addr)
}

// Serve runs an agent's HTTP API until ctx ends. It checks the address
// (CheckAddr, CheckAllowedHosts) before anything else, binds it, opens the runtime with rc
// (adding the metrics set to rc.Observer and, in serving mode ledger, to
// rc.Ledger.OnDeliver, and defaulting rc.Logger to the Options' logger),
// and serves. When ctx ends it stops accepting
// connections, ends live event streams, waits up to ShutdownTimeout for
// running requests, so turns in flight finish and are recorded, then
// closes the runtime. Turns still running then are canceled: each records
// its turn as failed ("the server is shutting down") and ends, within
// CancelGrace; Serve returns nil after such a shutdown. When a turn does
// not end even then (a hook that ignores its context), Serve returns
// ErrShutdownIncomplete without closing the runtime, and the program
// should exit.
func Serve(ctx context.Context, rc agent.Config, c Config) error {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if err := CheckAddr(c.Addr, c.AuthToken, c.Insecure); err != nil {
		return err
	}
	if err := CheckAllowedHosts(c.Addr, c.AuthToken, c.AllowedHosts); err != nil {
		return err
	}
	c.listenHost, _, _ = net.SplitHostPort(c.Addr)
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.CancelGrace <= 0 {
		c.CancelGrace = DefaultCancelGrace
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	if rc.Observer != nil {
		rc.Observer = observers{rc.Observer, c.Metrics}
	} else {
		rc.Observer = c.Metrics
	}
	if rc.Logger == nil {
		rc.Logger = c.Logger
	}
	if prev := rc.Ledger.OnDeliver; prev != nil {
		rc.Ledger.OnDeliver = func(d agent.LedgerDelivery, took time.Duration, err error) {
			prev(d, took, err)
			c.Metrics.LedgerDelivered(d, took, err)
		}
	} else {
		rc.Ledger.OnDeliver = c.Metrics.LedgerDelivered
	}

	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("server: listening on %s: %w", c.Addr, err)
	}
	defer ln.Close()
	rt, err := agent.Open(ctx, rc)
	if err != nil {
		return err
	}
	h, err := New(rt, c.Options)
	if err != nil {
		rt.Close()
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute, // the body; turns run after it is read
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(c.Logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	srv.RegisterOnShutdown(h.Drain)

	info := rt.Info()
	c.Logger.Info("serving",
		slog.String("agent", info.Agent),
		slog.String("addr", ln.Addr().String()),
		slog.String("storage", info.Storage.Name),
		slog.String("stateRoot", info.StateRoot),
		slog.String("serving", info.Serving),
		slog.Bool("auth", c.AuthToken != ""),
		slog.Bool("memory", info.Memory))
	if c.OnListen != nil {
		c.OnListen(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	var serveErr error
	select {
	case serveErr = <-served:
	case <-ctx.Done():
		c.Logger.Info("shutting down: finishing running requests", slog.String("timeout", c.ShutdownTimeout.String()))
	}
	rt.Drain() // serving mode ledger: no queued message starts on this host now
	h.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	canceled := false
	if err := srv.Shutdown(sctx); err != nil {
		c.Logger.Warn("shutdown timed out: canceling running turns", "error", err)
		h.cancelTurns(errShuttingDown)
		srv.Close()
		canceled = true
	}
	// Eval runs stop, then the runtime closes (waiting for turns), in the
	// background: after the shutdown timeout, canceled turns get
	// CancelGrace to end, whatever they are doing.
	closed := make(chan error, 1)
	go func() {
		if err := h.Shutdown(sctx); err != nil {
			c.Logger.Warn("shutdown: eval runs did not stop in time", "error", err)
		}
		closed <- rt.Close()
	}()
	limit := c.CancelGrace
	if d, ok := sctx.Deadline(); ok && !canceled {
		limit += max(time.Until(d), 0)
	}
	var closeErr error
	select {
	case closeErr = <-closed:
	case <-time.After(limit):
		c.Logger.Error("canceled turns did not end; returning without them", "grace", c.CancelGrace.String())
		return fmt.Errorf("%w within %v; their turns stay unfinished in the session log", ErrShutdownIncomplete, c.CancelGrace)
	}
	if closeErr != nil {
		return fmt.Errorf("server: closing the runtime: %w", closeErr)
	}
	c.Logger.Info("stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("server: %w", serveErr)
	}
	return nil
}

// CheckAddr checks a listen address: HOST:PORT with a numeric port, and,
// unless insecure, a loopback host when token is empty or shorter than
// MinAuthTokenLen. A non-loopback address without a token is ErrInsecure,
// with a short one ErrWeakToken; the message says what to do.
func CheckAddr(addr, token string, insecure bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("server: the address %q is not HOST:PORT (such as 127.0.0.1:8080, or :8080 for every interface)", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil || port == "" {
		return fmt.Errorf("server: the address %q has no valid port; use a port number such as 8080, or 0 for any free port", addr)
	}
	if insecure || IsLoopback(host) {
		return nil
	}
	where := host
	if where == "" {
		where = "every interface"
	}
	if token == "" {
		open := "pass --insecure to serve it open"
		if isWildcardHost(host) {
			open = "pass --insecure with --allowed-hosts (the names clients use) to serve it open"
		}
		return fmt.Errorf("%w: %s listens on %s; set --auth-token (or AGENTKIT_AUTH_TOKEN), listen on 127.0.0.1, or %s", ErrInsecure, addr, where, open)
	}
	if len(token) < MinAuthTokenLen {
		return fmt.Errorf("%w: the token is %d bytes and %s listens on %s; use a random token of at least %d bytes (such as the output of openssl rand -hex 16), or listen on 127.0.0.1", ErrWeakToken, len(token), addr, where, MinAuthTokenLen)
	}
	return nil
}

// IsLoopback reports whether host (an address's host part) only reaches
// this machine: localhost or a loopback IP. The empty host (every
// interface) is not.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
