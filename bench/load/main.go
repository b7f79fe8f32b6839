// Command load drives an agentkit HTTP server with concurrent clients and
// prints each concurrency level's turn latencies (p50, p90, p99, max) and
// throughput, then the two ratios the turn path is held to: p99/p50 at the
// highest level (target: at most 5) and the throughput of the highest
// level over that of the lowest (target: at least 1.5 from 1 to 16
// clients). It prints the targets beside the figures and never fails on a
// timing; it exits non-zero only when a request failed or the server could
// not be started.
//
// Each client repeats: start a session (POST /v1/sessions), then continue
// it (POST /v1/sessions/continue with its continuation token) until the
// session has had -turns turns, then start the next. A message is
// -message-bytes bytes. Every request is one turn; its latency is the
// client's, from sending the request to reading the whole answer.
//
// By default it builds agentkit (go build agentkit/cmd/agentkit, so run it
// inside the agentkit module) and starts "agentkit serve" on a fresh state
// root with an agent on the echo model, on a free loopback port; the state
// root is removed afterwards. -bin names a built binary instead, -storage
// passes a store URL to serve, and -addr drives a server that is already
// running (nothing is started).
//
//	go run ./bench/load -clients 1,16 -duration 10s
//	go run ./bench/load -bin bin/agentkit -clients 1,16 -duration 30s -rounds 2
//	go run ./bench/load -addr http://127.0.0.1:8080 -clients 16 -duration 30s
//
// Levels run one after another, each for -duration, after a -warmup at
// the highest level that is not counted; with -rounds N the levels
// alternate N times (1, 16, 1, 16, ...) so that drift on a shared machine
// hits them alike, and each level's figures are over all its rounds.
//
// With a started server, each round ends with the disk's floor (-floor,
// on by default): as many writers as the highest level, each writing 400
// bytes to a file of its own beside the state root and fsyncing it, for
// -duration. Its p99/p50 is the disk's own tail under that many durable
// writers, printed beside the server's: no turn, whose events are fsynced
// before it answers, can be steadier.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is what a run needs; flags fill it.
type config struct {
	addr, bin, storage string
	memory             bool
	clients            []int
	duration, warmup   time.Duration
	rounds, turns      int
	messageBytes       int
	keep               bool
	floor              bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var clients string
	fs.StringVar(&cfg.addr, "addr", "", "base URL of a running agentkit server (http://HOST:PORT); empty: start one")
	fs.StringVar(&cfg.bin, "bin", "", "the agentkit binary to start; empty: go build agentkit/cmd/agentkit into a temporary folder")
	fs.StringVar(&cfg.storage, "storage", "", "store URL for the started server (agentkit serve --storage); empty: the embedded SQLite store in its state root")
	fs.BoolVar(&cfg.memory, "memory", true, "the started agent's memory journal (agentkit.yaml memory:), on by default as in a new project")
	fs.StringVar(&clients, "clients", "1,16", "comma-separated numbers of concurrent clients, one level each")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long each level runs (per round)")
	fs.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "uncounted load at the highest level before the first; 0 for none")
	fs.IntVar(&cfg.rounds, "rounds", 1, "how many times to run the levels, alternating")
	fs.IntVar(&cfg.turns, "turns", 8, "turns per session: one start, then continues")
	fs.IntVar(&cfg.messageBytes, "message-bytes", 200, "size of each user message")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the started server's state root and log (printed at the end)")
	fs.BoolVar(&cfg.floor, "floor", true, "after each round, time the disk's floor: as many writers as the highest level, each writing and fsyncing a file of its own beside the started server's state root")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q; every setting is a flag (-h lists them)", fs.Arg(0))
	}
	for _, f := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10_000 {
			return cfg, fmt.Errorf("-clients %q: give comma-separated client counts from 1 to 10000, such as 1,16", clients)
		}
		cfg.clients = append(cfg.clients, n)
	}
	switch {
	case cfg.duration <= 0:
		return cfg, fmt.Errorf("-duration %s: give a positive duration, such as 10s", cfg.duration)
	case cfg.warmup < 0:
		return cfg, fmt.Errorf("-warmup %s: give 0 or a positive duration", cfg.warmup)
	case cfg.rounds < 1:
		return cfg, fmt.Errorf("-rounds %d: give at least 1", cfg.rounds)
	case cfg.turns < 1:
		return cfg, fmt.Errorf("-turns %d: give at least 1 (a session's first turn)", cfg.turns)
	case cfg.messageBytes < 1 || cfg.messageBytes > 1<<20:
		return cfg, fmt.Errorf("-message-bytes %d: give 1 to 1048576", cfg.messageBytes)
	case cfg.addr != "" && (cfg.bin != "" || cfg.storage != ""):
		return cfg, errors.New("-addr drives a running server; -bin and -storage configure one this tool starts: give one or the other")
	}
	return cfg, nil
}

// run starts the server unless cfg.addr names one, runs the levels and
// prints the report to out; progress and the server's location go to
// info.
func run(ctx context.Context, cfg config, out, info io.Writer) error {
	base := strings.TrimRight(cfg.addr, "/")
	conditions := "a running server at " + base
	floorDir := ""
	if base == "" {
		srv, err := startServer(ctx, cfg, info)
		if err != nil {
			return err
		}
		defer func() {
			if err := srv.stop(); err != nil {
				fmt.Fprintln(info, "load: stopping the server:", err)
			}
		}()
		base = srv.base
		conditions = srv.conditions
		if cfg.floor {
			floorDir = srv.dir
		}
	}
	levels, err := measure(ctx, base, cfg, floorDir, info)
	if err != nil {
		return err
	}
	report(out, conditions, cfg, levels)
	for _, l := range levels {
		if l.errors > 0 {
			return fmt.Errorf("%d of %d requests failed at %d clients; the first: %v", l.errors, l.errors+len(l.latencies), l.clients, l.firstErr)
		}
	}
	return nil
}
