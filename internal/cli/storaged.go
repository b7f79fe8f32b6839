package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"agentkit/hosted"
	"agentkit/kv/hostedkv/wire"
	"agentkit/server"
)

func init() {
	register(command{name: "storaged", summary: "run the hosted storage service; manage its credentials", run: runStoraged})
}

// DefaultStoragedAddr is where agentkit storaged listens by default.
const DefaultStoragedAddr = "127.0.0.1:8470"

const storagedUsage = `storaged --backend URL --credentials FILE [--addr HOST:PORT] [flags]
       storaged credentials add NAMESPACE --credentials FILE [--rotate]
       storaged credentials rm ID --credentials FILE
       storaged credentials ls --credentials FILE

Runs the hosted storage service: the kv contract over HTTP for many
deployments, each in its own namespace, in front of one store
(--backend postgres://… in production, sqlite:PATH on one host, or any kv
store with compare-and-set: redis://…, nats://…, file:PATH, s3://…). Engines
reach it with --storage agentkit+http://TOKEN@HOST:PORT/NAMESPACE (or
agentkit+https://). The first line on standard output is "listening on
http://HOST:PORT"; logs go to standard error. SIGHUP reloads the
credentials and TLS files (they are also reloaded within a second of a
change); SIGINT or SIGTERM stops accepting connections, finishes the
requests in flight and exits.

"credentials add" prints a new token for NAMESPACE on standard output, once;
the file keeps only its HMAC under a server key (FILE.key, made on first
use). A running service picks up add and rm without a restart.`

func runStoraged(e *env, args []string) error {
	if len(args) > 0 && args[0] == "credentials" {
		return runCredentials(e, args[1:])
	}
	var (
		backend, creds, credsKey, addr, tlsCert, tlsKey, logFormat, logLevel string
		maxValue                                                             = byteSize(hosted.DefaultMaxValueBytes)
		maxPage, maxInFlight                                                 int
		window, shutdown                                                     time.Duration
	)
	fs := newFlags(e, "storaged", storagedUsage)
	fs.StringVar(&backend, "backend", "", "the store: postgres://… (table=PREFIX names the tables, default "+hosted.DefaultTablePrefix+"), sqlite:PATH, or a kv store URL with the CAS group (redis://…, nats://…, file:PATH, s3://…)")
	fs.StringVar(&creds, "credentials", "", "the credentials file (made by storaged credentials add)")
	fs.StringVar(&credsKey, "credentials-key", "", "the server key file (default: the credentials file with .key added)")
	fs.StringVar(&addr, "addr", DefaultStoragedAddr, "HOST:PORT to listen on; port 0 picks a free port")
	fs.StringVar(&tlsCert, "tls-cert", "", "PEM certificate file: serve HTTPS (with --tls-key)")
	fs.StringVar(&tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	fs.Var(&maxValue, "max-value-bytes", "largest value and request body, such as 16MiB; larger ones get 413")
	fs.IntVar(&maxPage, "max-page", hosted.DefaultMaxPage, "most entries one listing page may ask for")
	fs.IntVar(&maxInFlight, "max-inflight", hosted.DefaultMaxInFlight, "most requests one namespace may have in flight; more get 429")
	fs.DurationVar(&window, "dedup-window", hosted.DefaultDedupWindow, "how long a write's request id is remembered")
	fs.DurationVar(&shutdown, "shutdown-timeout", hosted.DefaultShutdownTimeout, "how long to let requests in flight finish after SIGINT or SIGTERM")
	fs.StringVar(&logFormat, "log-format", "json", "log format on standard error: json or text")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug (one line per request), info, warn or error")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("storaged: unexpected argument %q; the subcommand is credentials (add, rm, ls)", pos[0])
	}
	switch {
	case backend == "":
		return usagef("storaged: --backend is required: a postgres://… URL, sqlite:PATH, or a kv store URL such as redis://…")
	case creds == "":
		return usagef("storaged: --credentials is required; make the file with agentkit storaged credentials add NAMESPACE --credentials FILE")
	case (tlsCert == "") != (tlsKey == ""):
		return usagef("storaged: give --tls-cert and --tls-key together")
	case maxPage < 1:
		return usagef("storaged: --max-page %d: use a positive number", maxPage)
	case maxInFlight < 1:
		return usagef("storaged: --max-inflight %d: use a positive number", maxInFlight)
	case shutdown <= 0:
		return usagef("storaged: --shutdown-timeout %s: use a positive duration such as 30s", shutdown)
	}
	log, err := newLogger(e.stderr, logFormat, logLevel)
	if err != nil {
		return err
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && tlsCert == "" && !server.IsLoopback(host) {
		log.Warn("storaged: serving plain HTTP on a non-loopback address: tokens and data cross the network in clear; use --tls-cert and --tls-key, or a TLS proxy in front", slog.String("addr", addr))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	openCtx, cancel := context.WithTimeout(ctx, time.Minute)
	svc, err := hosted.Open(openCtx, hosted.Options{
		Backend: backend, Credentials: creds, CredentialsKey: credsKey,
		MaxValueBytes: int64(maxValue), MaxPage: maxPage, DedupWindow: window, MaxInFlight: maxInFlight,
		Logger: log,
	})
	cancel()
	if err != nil {
		if errors.Is(err, hosted.ErrBackendUnsupported) || strings.Contains(err.Error(), "not supported") || strings.Contains(err.Error(), "does not exist") {
			return usagef("storaged: %s", strings.TrimPrefix(err.Error(), "hosted: "))
		}
		return err
	}
	defer svc.Close()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if err := svc.Reload(); err != nil {
				log.Error("storaged: SIGHUP: the credentials do not load; the previous ones stay in force", slog.Any("error", err))
			} else {
				log.Info("storaged: SIGHUP: credentials reloaded")
			}
		}
	}()
	scheme := "http"
	if tlsCert != "" {
		scheme = "https"
	}
	return hosted.Serve(ctx, svc, hosted.ServeConfig{
		Addr: addr, TLSCert: tlsCert, TLSKey: tlsKey, ShutdownTimeout: shutdown,
		OnListen: func(a net.Addr) { fmt.Fprintf(e.stdout, "listening on %s://%s\n", scheme, a) },
	})
}

func runCredentials(e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.stdout, "Usage: agentkit "+storagedUsage)
		return nil
	}
	sub := args[0]
	var file, keyFile string
	var rotate bool
	fs := newFlags(e, "storaged credentials "+sub, storagedUsage)
	fs.StringVar(&file, "credentials", "", "the credentials file")
	fs.StringVar(&keyFile, "credentials-key", "", "the server key file (default: the credentials file with .key added)")
	if sub == "add" {
		fs.BoolVar(&rotate, "rotate", false, "add a second token to a namespace that has one, to rotate it")
	}
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	if file == "" {
		return usagef("storaged credentials %s: --credentials FILE is required", sub)
	}
	if keyFile == "" {
		keyFile = hosted.KeyPath(file)
	}
	switch sub {
	case "add":
		if len(pos) != 1 {
			return usagef("storaged credentials add takes one NAMESPACE (%s)", wire.NamespaceRule)
		}
		if !wire.ValidNamespace(pos[0]) {
			return usagef("storaged credentials add: the namespace %q is not usable: use %s", pos[0], wire.NamespaceRule)
		}
		token, c, err := hosted.AddCredential(file, keyFile, pos[0], rotate)
		if errors.Is(err, hosted.ErrNamespaceHasCredential) {
			return usagef("%s", strings.TrimPrefix(err.Error(), "hosted: "))
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "added credential %s for namespace %s; its token is on standard output and is shown only now: keep it in the deployment's secrets\n", c.ID, c.Namespace)
		fmt.Fprintln(e.stdout, token)
		return nil
	case "rm":
		if len(pos) == 0 {
			return usagef("storaged credentials rm takes one or more credential IDs (see storaged credentials ls)")
		}
		for _, id := range pos {
			c, err := hosted.RemoveCredential(file, id)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed credential %s of namespace %s\n", c.ID, c.Namespace)
		}
		return nil
	case "ls":
		if len(pos) > 0 {
			return usagef("storaged credentials ls takes no arguments")
		}
		list, err := hosted.ListCredentials(file)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAMESPACE\tCREATED")
		for _, c := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", c.ID, c.Namespace, c.Created.Format(time.RFC3339))
		}
		return tw.Flush()
	}
	return usagef("storaged credentials: unknown subcommand %q; use add, rm or ls", sub)
}
