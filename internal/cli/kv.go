package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"unicode"
	"unicode/utf8"

	"agentkit/agent/stateroot"
	"agentkit/kv"
)

// DefaultStateRoot is the state root commands use when --state-root is not
// given.
const DefaultStateRoot = ".agentkit"

// DefaultStoreURL returns the embedded default store under a state root:
// the SQLite driver on the session database, sessions/sessions.db (on
// kv/kv.db in a state root of format 1; see package stateroot).
func DefaultStoreURL(stateRoot string) string {
	return "sqlite:" + stateroot.KVPath(stateRoot)
}

func init() {
	register(command{name: "kv", summary: "look into a store: ls, get, put, rm", run: runKV})
}

const kvUsage = `kv ls [PREFIX] | get KEY | put KEY [VALUE|-] | rm KEY... [flags]

  ls   lists the keys under PREFIX (all keys without one), one a line;
       a key holding control characters, a backslash or a leading quote
       is printed JSON-quoted; --values prints "key<TAB>value" with
       values JSON-quoted when not printable text
  get  writes the value of KEY to standard output
  put  stores VALUE, or standard input when VALUE is "-" or absent
  rm   deletes the keys

ls and get only read: they create nothing (no database file, folder,
table or bucket). Without --storage, the embedded default store of
--state-root is used.`

// storageHelp is the --storage flag's help, and the schemes CLI errors name.
const storageHelp = "store URL: mem://, file:PATH, sqlite:PATH, postgres://…, redis://…, nats://…, s3://…, agentkit+http(s)://TOKEN@HOST/NAMESPACE"

type kvFlags struct {
	storage   string
	stateRoot string
	values    bool
}

// kvFlagSet returns the flags of kv SUB (--values only for ls; every
// flag for the help page).
func kvFlagSet(e *env, sub string, f *kvFlags) *flag.FlagSet {
	name := "kv"
	if sub != "" {
		name += " " + sub
	}
	fs := newFlags(e, name, kvUsage)
	fs.StringVar(&f.storage, "storage", "", storageHelp)
	fs.StringVar(&f.stateRoot, "state-root", DefaultStateRoot, "state root whose embedded store is used when --storage is empty")
	if sub == "ls" || sub == "" {
		fs.BoolVar(&f.values, "values", false, "ls: print values beside the keys")
	}
	return fs
}

func runKV(e *env, args []string) error {
	if len(args) == 0 {
		return usagef("kv: name a subcommand: ls, get, put or rm (run \"agentkit kv -h\" for the usage)")
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		kvFlagSet(e, "", &kvFlags{}).Usage()
		return nil
	}
	sub := args[0]
	var f kvFlags
	fs := kvFlagSet(e, sub, &f)
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
		if err := db.Put(ctx, pos[0], v); err != nil {
			return err
		}
		warnProcessLocal(e, db, "value")
		return nil
	default: // rm
		for _, k := range pos {
			if err := db.Delete(ctx, k); err != nil {
				return err
			}
		}
		warnProcessLocal(e, db, "change")
		return nil
	}
}

// warnProcessLocal says on standard error that a write to a store held in
// this process's memory (mem://) is gone when the command exits.
func warnProcessLocal(e *env, db *kv.DB, what string) {
	if db.ProcessLocal() {
		fmt.Fprintf(e.stderr, "agentkit: note: %s keeps data in this process's memory only; the %s is gone now that agentkit exits (use a durable store, such as sqlite:PATH)\n", db.Name()+"://", what)
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
// commands open read-only, so they create nothing: not the embedded store,
// nor a database file, folder, table or bucket a URL names.
func openStore(ctx context.Context, f kvFlags, readOnly bool) (*kv.DB, error) {
	url := f.storage
	if url == "" {
		path := stateroot.KVPath(f.stateRoot)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if readOnly {
				return nil, fmt.Errorf("no store at %s yet (the embedded default of state root %s); pass --storage URL, or --state-root of a served agent", path, f.stateRoot)
			}
			if err := os.MkdirAll(filepath.Dir(path), stateroot.DirPerm); err != nil {
				return nil, err
			}
		}
		url = DefaultStoreURL(f.stateRoot)
	}
	db, err := kv.OpenWith(ctx, url, kv.OpenOptions{ReadOnly: readOnly})
	var nd *kv.NoDriverError
	switch {
	case err == nil:
		return db, nil
	case errors.As(err, &nd):
		return nil, usagef("--storage: no driver for %q URLs; the schemes are %s, as in --storage sqlite:/var/lib/agentkit/kv.db or --storage postgres://USER:PASSWORD@HOST:5432/DB", nd.Scheme, strings.Join(nd.Schemes, ", "))
	case errors.Is(err, kv.ErrInvalidURL):
		return nil, usagef("--storage: %v", err)
	}
	return nil, err
}

func kvList(ctx context.Context, w io.Writer, db *kv.DB, prefix string, values bool) error {
	if !values {
		for k, err := range db.ListKeys(ctx, prefix) {
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintln(w, printableKey(k)); err != nil {
				return err
			}
		}
		return nil
	}
	for e, err := range db.List(ctx, prefix) {
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "%s\t%s\n", printableKey(e.Key), printable(e.Value)); err != nil {
			return err
		}
	}
	return nil
}

// printableKey returns a key as it is when a terminal shows it as it is,
// and JSON-quoted when it holds a control character (which a terminal
// would act on, or which would break the one-key-a-line listing), a
// backslash, or a leading quote (so a quoted key is never mistaken for
// a plain one).
func printableKey(k string) string {
	plain := !strings.HasPrefix(k, `"`) && !strings.ContainsRune(k, '\\')
	for _, r := range k {
		if !plain {
			break
		}
		plain = !unicode.IsControl(r) && r != '\u2028' && r != '\u2029'
	}
	if plain {
		return k
	}
	q, _ := json.Marshal(k)
	return string(q)
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
