// Package config loads agentkit.yaml, the file that defines an agent
// project for the agentkit command: the agent's name, instructions file,
// model, memory switch, storage URL, serving mode, policy and A/B
// experiments.
//
//	name: support
//	instructions: instructions.md   # the default
//	maxSteps: 16
//	model:
//	  provider: openai              # echo (the default) or openai
//	  baseURL: http://127.0.0.1:8000/v1
//	  model: llama3.1
//	  apiKeyEnv: OPENAI_API_KEY     # the NAME of the variable holding the key
//	memory: true                    # the default
//	storage: ""                     # empty: the embedded default under --state-root
//	serving: local                  # or ledger: several hosts, one shared store (docs/ledger.md)
//	ledger:                         # serving: ledger only; every field optional
//	  store: postgres://db/agents   # the coordination store; the default is storage
//	  lease: 10s                    # a silent holder's sessions move after lease + margin
//	  margin: 2s
//	  maxAttempts: 5                # a message failing this often goes to the dead letters
//	  maxPending: 256               # queued messages per session; past it 429
//	  maxPendingBytes: 8MiB
//	  maxEventBytes: 256KiB         # one queued message; past it 413
//	  retryAfter: 2s                # the Retry-After of a 429
//	  idempotencyWindow: 24h        # how long a message's Idempotency-Key is kept
//	  clockSkew: 5m                 # the most the hosts' clocks differ by
//	  maxKeys: 10000                # kept keys per session; past it 429
//	policy:
//	  debounce: 30s
//	  restore:
//	    maxSessions: 500
//	    maxAge: 14d
//	    maxTotalBytes: 512MiB
//	  # or: restore: off
//	timeouts:
//	  turn: 10m                     # a turn is stopped (and fails) after this; the default
//	  tool: 2m                      # a tool call is stopped (an error to the model); the default
//	experiments:
//	  - name: tone
//	    variants:
//	      - {name: plain, weight: 1}
//	      - {name: friendly, weight: 1, instructions: instructions-friendly.md}
//	evals:
//	  historyWindow: 50             # eval runs kept
//	  heartbeat: 10s
//	cors:
//	  origins: [https://chat.example.com]
//	allowedHosts: [agent.example.com] # Host names served beyond loopback
//
// The model section also takes the shorthand "model: echo", and the
// provider settings may sit in echo: and openai: sub-sections instead, as
// package model's Config lays them out:
//
//	model:
//	  provider: echo
//	  echo:
//	    script:
//	      - tool: read_file
//	        args: {path: memory/journal.jsonl}
//	      - text: "{{.LastToolResult}}"
//
// Parsing is strict: an unknown field is an error naming it, where it is,
// and the fields allowed there; a bad value is an error naming the field
// and what it accepts. Every error starts with the file name and line.
//
// File.RuntimeConfig turns a loaded file into the agent.Config a Go program
// would write, so the command serves a config-defined agent with the same
// code as a Go program.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"agentkit/agent"
	"agentkit/model"
	"agentkit/workspace"
)

// FileName is the project file Load looks for in a folder.
const FileName = "agentkit.yaml"

// DefaultInstructions is the instructions file used when none is named.
const DefaultInstructions = "instructions.md"

// File is a parsed agentkit.yaml.
type File struct {
	// Path is the file read ("" for Parse); Dir is the folder relative
	// paths in it are resolved against.
	Path string
	Dir  string

	// Name is the agent's name. Required.
	Name string
	// Instructions is the instructions file, relative to Dir.
	Instructions string
	// InstructionsText is the instructions file's content ("" when the
	// default file does not exist).
	InstructionsText string
	// WorkspaceSeed holds the files of the project's workspace/ folder,
	// copied into every new session's workspace (nil without one).
	WorkspaceSeed map[string]string
	// MaxSteps is the turn's step limit; zero means the runtime's default.
	MaxSteps int
	// Model selects and configures the model.
	Model model.Config
	// Memory says whether the memory journal records turns (default
	// true); MemoryMaxText is its text cut (zero: the default).
	Memory        bool
	MemoryMaxText int
	// Storage is the store URL; empty means the embedded default.
	Storage string
	// Serving is "local" (the default) or "ledger".
	Serving string
	// Ledger tunes serving mode ledger (the ledger: section): LedgerStore
	// is the coordination store's URL (empty: the agent's store), Ledger
	// the lease and queue settings (zero fields: the ledger's defaults).
	// Both are ignored in serving mode local.
	LedgerStore string
	Ledger      agent.LedgerOptions
	// Policy holds the mirror debounce and the restore caps.
	Policy agent.Policy
	// Timeouts bound turns and tool calls; zero fields mean the runtime's
	// defaults.
	Timeouts agent.Timeouts
	// Experiments are the A/B experiments (docs/ab.md).
	Experiments []Experiment
	// Evals tunes eval runs: the history window and the heartbeat.
	Evals Evals
	// CORSOrigins are the origins of browser pages allowed to call the
	// API (cors.origins; --cors-origins overrides them).
	CORSOrigins []string
	// AllowedHosts are the names and addresses clients reach the server
	// by, beyond the loopback names (allowedHosts; --allowed-hosts
	// overrides them; server.Options.AllowedHosts).
	AllowedHosts []string
}

// Experiment is one A/B experiment: a name and two or more variants.
type Experiment struct {
	Name     string
	Variants []Variant
}

// Variant is one arm of an experiment. Weight is relative (default 1).
// Instructions, Model and Options, when set, change the agent for sessions
// enrolled in the variant.
type Variant struct {
	Name         string
	Weight       float64
	Instructions string
	Model        *model.Config
	Options      map[string]any

	// InstructionsText is the content of the Instructions file, read by
	// Load.
	InstructionsText string
}

// Load reads and parses an agentkit.yaml: path is the file, or a folder
// holding agentkit.yaml. It also reads the instructions file.
func Load(path string) (*File, error) {
	if path == "" {
		path = "."
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, FileName)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("config: %s does not exist; run agentkit init to create a project, or pass --dir to the project folder", path)
		}
		return nil, fmt.Errorf("config: reading %s: %w", path, err)
	}
	f, err := Parse(data, path)
	if err != nil {
		return nil, err
	}
	f.Path = path
	f.Dir = filepath.Dir(path)
	if err := f.loadInstructions(); err != nil {
		return nil, err
	}
	if err := f.loadWorkspaceSeed(); err != nil {
		return nil, err
	}
	if err := f.loadVariantInstructions(); err != nil {
		return nil, err
	}
	return f, nil
}

// SeedDir is the project folder whose files seed every new session's
// workspace.
const SeedDir = "workspace"

// loadWorkspaceSeed reads the project's workspace/ folder, when there is
// one. A memory/ folder in it is refused: memory/ in a session workspace is
// the journal's read-only view, and seeding it would let the project write
// records.
func (f *File) loadWorkspaceSeed() error {
	dir := filepath.Join(f.Dir, SeedDir)
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("config: %s: %w", dir, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("config: %s is not a folder; the project's workspace/ seeds every new session's workspace", dir)
	}
	seed, err := workspace.LoadDir(os.DirFS(dir))
	if err != nil {
		return fmt.Errorf("config: %s: %w; remove it (memory/ is reserved for the journal, which the agent sees read-only)", dir, err)
	}
	f.WorkspaceSeed = seed
	return nil
}

// loadInstructions reads the instructions file. A missing default file
// means no instructions; a missing named file is an error.
func (f *File) loadInstructions() error {
	p := f.Instructions
	if !filepath.IsAbs(p) {
		p = filepath.Join(f.Dir, p)
	}
	b, err := os.ReadFile(p)
	switch {
	case err == nil:
		f.InstructionsText = string(b)
	case errors.Is(err, os.ErrNotExist) && f.Instructions == DefaultInstructions:
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("config: %s: instructions: the file %s does not exist; create it or fix the path (relative to the project folder)", f.Path, p)
	default:
		return fmt.Errorf("config: %s: instructions: %w", f.Path, err)
	}
	return nil
}

// Agent returns the agent the file defines, with its model built. Tools and
// hooks are the caller's to add.
func (f *File) Agent() (agent.Agent, error) {
	m, err := model.FromConfig(&f.Model)
	if err != nil {
		return agent.Agent{}, fmt.Errorf("config: %s: %w", f.where(), err)
	}
	exps, err := f.abExperiments()
	if err != nil {
		return agent.Agent{}, err
	}
	return agent.Agent{
		Name:          f.Name,
		Instructions:  f.InstructionsText,
		Model:         m,
		MaxSteps:      f.MaxSteps,
		WorkspaceSeed: f.WorkspaceSeed,
		Experiments:   exps,
	}, nil
}

// RuntimeConfig returns the agent.Config the file describes: the agent,
// policy, serving mode and ledger settings, memory switch and timeouts.
// The caller sets StateRoot and, when Storage is not empty, Store
// (kv.Open(ctx, f.Storage)), when LedgerStore is not empty Ledger.Store
// (kv.Open(ctx, f.LedgerStore)), plus a logger and an observer.
func (f *File) RuntimeConfig() (agent.Config, error) {
	a, err := f.Agent()
	if err != nil {
		return agent.Config{}, err
	}
	return agent.Config{
		Agent:    a,
		Policy:   f.Policy,
		Serving:  f.Serving,
		Ledger:   f.Ledger,
		Memory:   agent.Memory{Off: !f.Memory, MaxTextLength: f.MemoryMaxText},
		Timeouts: f.Timeouts,
	}, nil
}

func (f *File) where() string {
	if f.Path != "" {
		return f.Path
	}
	return FileName
}

// parseDuration reads a Go duration ("90s", "1h30m") or a number of days
// ("30d").
func parseDuration(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		var n int64
		if _, err := fmt.Sscanf(d, "%d", &n); err == nil && fmt.Sprint(n) == d && n >= 0 && n < 1<<20 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
		return 0, errors.New("bad days")
	}
	return time.ParseDuration(s)
}

// byteUnits are the size suffixes parseBytes accepts.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"B", 1},
}

// parseBytes reads a size: a whole number of bytes, optionally with a unit
// (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	var n int64
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || fmt.Sprint(n) != s || n < 0 {
		return 0, errors.New("bad size")
	}
	if n > (1<<62)/mult {
		return 0, errors.New("too large")
	}
	return n * mult, nil
}
