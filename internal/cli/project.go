package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"agentkit/agent"
	"agentkit/config"
	hostedclient "agentkit/hosted/client"
	"agentkit/kv"
	"agentkit/memory"
	"agentkit/model"
)

// ledgerNeedsStore is the refusal of serving mode ledger over the
// embedded default store, which lives in one host's state root.
const ledgerNeedsStore = "serving mode ledger coordinates several hosts through one shared store, and the embedded default store lives in this host's state root; " +
	"set storage: in agentkit.yaml (or --storage) to a shared store such as postgres://host/db, redis://host:6379/0 or nats://host:4222, or ledger.store: to coordinate through another store"

// DefaultAgentName is the name of the built-in agent "agentkit run" runs
// when there is no project folder.
const DefaultAgentName = "agentkit"

// defaultInstructions are the built-in agent's instructions.
func defaultInstructions() string {
	return "You are a helpful assistant. Answer clearly and briefly, and say so when you do not know.\n\n" + memory.InstructionsSection()
}

// project is an agent to run: from an agentkit.yaml, or the built-in one.
type project struct {
	file *config.File // nil for the built-in agent
	dir  string       // the project folder ("" for the built-in agent)
}

// loadProject reads DIR/agentkit.yaml. A missing file or a bad one is a
// usage error naming the file.
func loadProject(dir string) (*project, error) {
	f, err := config.Load(dir)
	if err != nil {
		return nil, usagef("%s", strings.TrimPrefix(err.Error(), "config: "))
	}
	return &project{file: f, dir: f.Dir}, nil
}

// findProject returns the project of a command that runs in a project
// folder when there is one: DIR/agentkit.yaml when --dir names a folder
// (an error when it has none), else the current folder's agentkit.yaml
// when there is one, else the built-in agent (a project without a file).
func findProject(dir string) (*project, error) {
	switch {
	case dir != "":
		return loadProject(dir)
	case hasProject("."):
		return loadProject(".")
	}
	return &project{}, nil
}

// hasProject reports whether dir holds an agentkit.yaml.
func hasProject(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, config.FileName))
	return err == nil
}

// runtimeConfig returns the agent.Config of the project, with serving and
// storage from the flags when given (they win over the file). The returned
// close function closes the store it opened, if any.
func (p *project) runtimeConfig(ctx context.Context, serving, storage string) (agent.Config, func(), error) {
	var rc agent.Config
	if p.file != nil {
		var err error
		if rc, err = p.file.RuntimeConfig(); err != nil {
			return rc, nil, usagef("%s", strings.TrimPrefix(err.Error(), "config: "))
		}
		if serving == "" {
			serving = p.file.Serving
		}
		if storage == "" {
			storage = p.file.Storage
		}
	} else {
		echo, err := model.NewEcho(nil)
		if err != nil {
			return rc, nil, err
		}
		rc.Agent = agent.Agent{Name: DefaultAgentName, Instructions: defaultInstructions(), Model: echo}
	}
	switch serving {
	case "", agent.ServingLocal:
		rc.Serving = agent.ServingLocal
	case agent.ServingLedger:
		rc.Serving = agent.ServingLedger
		if storage == "" && (p.file == nil || p.file.LedgerStore == "") {
			return rc, nil, usagef("%s", ledgerNeedsStore)
		}
	default:
		return rc, nil, usagef("--serving %q: use local or ledger", serving)
	}
	closeStore := func() {}
	if storage != "" {
		db, err := kv.Open(ctx, storage)
		if err != nil {
			if strings.Contains(err.Error(), "no driver for") || strings.Contains(err.Error(), "kv: no storage URL") {
				return rc, nil, usagef("--storage: %v", err)
			}
			return rc, nil, fmt.Errorf("opening the store: %w", err)
		}
		rc.Store = db
		closeStore = func() { db.Close() }
		// A hosted store (agentkit+http(s)) brings its native eval and A/B
		// tables and keeps the memory journal across redeploys.
		if evals, abs, ok := hostedclient.Tables(db); ok {
			rc.Evals, rc.ABs = evals, abs
		}
		if mem, ok := hostedclient.NewMemory(db); ok && !rc.Memory.Off && rc.Memory.Backend == nil {
			rc.Memory.Backend = mem
			closeStore = func() { mem.Close(); db.Close() }
		}
	}
	if rc.Serving == agent.ServingLedger && p.file != nil && p.file.LedgerStore != "" {
		db, err := kv.Open(ctx, p.file.LedgerStore)
		if err != nil {
			closeStore()
			if strings.Contains(err.Error(), "no driver for") {
				return rc, nil, usagef("ledger.store: %v", err)
			}
			return rc, nil, fmt.Errorf("opening the ledger's coordination store: %w", err)
		}
		rc.Ledger.Store = db
		closeData := closeStore
		closeStore = func() { closeData(); db.Close() }
	}
	return rc, closeStore, nil
}

// timeoutFlags are --turn-timeout and --tool-timeout, which override
// timeouts: in agentkit.yaml when given.
type timeoutFlags struct{ turn, tool time.Duration }

func (t *timeoutFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&t.turn, "turn-timeout", 0, fmt.Sprintf("stop a turn (recorded as failed) after this long, overriding timeouts.turn in agentkit.yaml (default %v)", agent.DefaultTurnTimeout))
	fs.DurationVar(&t.tool, "tool-timeout", 0, fmt.Sprintf("stop a tool call (an error to the model) after this long, overriding timeouts.tool in agentkit.yaml (default %v)", agent.DefaultToolTimeout))
}

func (t *timeoutFlags) check() error {
	if t.turn < 0 {
		return usagef("--turn-timeout %s: use a positive duration such as 10m", t.turn)
	}
	if t.tool < 0 {
		return usagef("--tool-timeout %s: use a positive duration such as 2m", t.tool)
	}
	return nil
}

func (t *timeoutFlags) apply(rc *agent.Config) {
	if t.turn > 0 {
		rc.Timeouts.Turn = t.turn
	}
	if t.tool > 0 {
		rc.Timeouts.Tool = t.tool
	}
}

// newLogger returns a logger writing to w in format (json or text) at
// level.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: use json or text", format)
}

// byteSize is a flag holding a size: a whole number of bytes, optionally
// with a unit (KiB, MiB, GiB, KB, MB, GB).
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return errors.New("use a positive size such as 1048576, 512KiB or 4MiB")
	}
	*b = byteSize(n * mult)
	return nil
}
