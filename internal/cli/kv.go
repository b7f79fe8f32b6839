package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"agentkit/kv"
)

// DefaultStateRoot is the state root commands use when --state-root is not
// given.
const DefaultStateRoot = ".agentkit"

// DefaultStoreURL returns the embedded default store under a state root:
// the SQLite driver, one database file at kv/kv.db.
func DefaultStoreURL(stateRoot string) string {
	return "sqlite:" + filepath.Join(stateRoot, "kv", "kv.db")
}

func init() {
	register(command{name: "kv", summary: "look into a store: ls, get, put, rm", run: runKV})
}

const kvUsage = `kv ls [PREFIX] | get KEY | put KEY [VALUE|-] | rm KEY... [--storage URL]

  ls   lists the keys under PREFIX (all keys without one), one a line;
       --values prints "key<TAB>value" with values JSON-quoted when not
       printable text
  get  writes the value of KEY to standard output
  put  stores VALUE, or standard input when VALUE is "-" or absent
  rm   deletes the keys

Without --storage, the embedded default store of --state-root is used.`

type kvFlags struct {
	storage   string
	stateRoot string
	values    bool
}

func runKV(e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.stdout, "Usage: agentkit "+kvUsage)
		return nil
	}
	sub := args[0]
	var f kvFlags
	fs := newFlags(e, "kv "+sub, kvUsage)
	fs.StringVar(&f.storage, "storage", "", "store URL: mem://, file:PATH, sqlite:PATH, postgres://…, redis://…, nats://…, s3://…")
	fs.StringVar(&f.stateRoot, "state-root", DefaultStateRoot, "state root whose embedded store is used when --storage is empty")
	if sub == "ls" {
		fs.BoolVar(&f.values, "values", false, "print values beside the keys")
	}
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	var need func(n int) bool
	switch sub {
	case "ls":
		need = func(n int) bool { return n <= 1 }
	case "get":
		need = func(n int) bool { return n == 1 }
	case "put":
		need = func(n int) bool { return n == 1 || n == 2 }
	case "rm":
		need = func(n int) bool { return n >= 1 }
	default:
		return usagef("kv: unknown subcommand %q; use ls, get, put or rm", sub)
	}
	if !need(len(pos)) {
		return usagef("kv %s: wrong number of arguments; usage: agentkit kv %s", sub, subUsage(sub))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := openStore(ctx, f, sub == "ls" || sub == "get")
	if err != nil {
		return err
	}
	defer db.Close()

	switch sub {
	case "ls":
		prefix := ""
		if len(pos) == 1 {
			prefix = pos[0]
		}
		return kvList(ctx, e.stdout, db, prefix, f.values)
	case "get":
		v, err := db.Get(ctx, pos[0])
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(v)
		return err
	case "put":
		var v []byte
		if len(pos) == 2 && pos[1] != "-" {
			v = []byte(pos[1])
		} else if v, err = io.ReadAll(e.stdin); err != nil {
			return fmt.Errorf("kv put: reading the value from standard input: %w", err)
		}
		return db.Put(ctx, pos[0], v)
	default: // rm
		for _, k := range pos {
			if err := db.Delete(ctx, k); err != nil {
				return err
			}
		}
		return nil
	}
}

func subUsage(sub string) string {
	switch sub {
	case "ls":
		return "ls [PREFIX] [--values]"
	case "get":
		return "get KEY"
	case "put":
		return "put KEY [VALUE|-]"
	default:
		return "rm KEY..."
	}
}

// openStore opens --storage, or the state root's embedded store. Reading
// commands refuse to create an embedded store that does not exist yet.
func openStore(ctx context.Context, f kvFlags, readOnly bool) (*kv.DB, error) {
	url := f.storage
	if url == "" {
		path := filepath.Join(f.stateRoot, "kv", "kv.db")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if readOnly {
				return nil, fmt.Errorf("no store at %s yet (the embedded default of state root %s); pass --storage URL, or --state-root of a served agent", path, f.stateRoot)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, err
			}
		}
		url = DefaultStoreURL(f.stateRoot)
	}
	db, err := kv.Open(ctx, url)
	if err != nil {
		if f.storage != "" && strings.Contains(err.Error(), "no driver for") {
			return nil, usagef("--storage: %v", err)
		}
		return nil, err
	}
	return db, nil
}

func kvList(ctx context.Context, w io.Writer, db *kv.DB, prefix string, values bool) error {
	if !values {
		for k, err := range db.ListKeys(ctx, prefix) {
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintln(w, k); err != nil {
				return err
			}
		}
		return nil
	}
	for e, err := range db.List(ctx, prefix) {
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "%s\t%s\n", e.Key, printable(e.Value)); err != nil {
			return err
		}
	}
	return nil
}

// printable returns v as it is when it is one line of valid UTF-8 text, and
// JSON-quoted otherwise, so a listing stays one entry a line.
func printable(v []byte) string {
	if utf8.Valid(v) && !bytes.ContainsAny(v, "\n\r\t\x00") {
		return string(v)
	}
	q, _ := json.Marshal(string(v))
	return string(q)
}
