package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"agentkit/actor"
	"agentkit/actor/mergepatch"
	"agentkit/agent"
	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/kv"
)

func init() {
	register(command{name: "actor", summary: "read or merge-patch a session's actor state: get, patch", run: runActor})
}

const actorUsage = `actor get SESSION | patch SESSION [PATCH|-] [flags]

  get    prints the state of the session's actor (JSON, {} when nothing is
         stored)
  patch  applies PATCH, an RFC 7396 JSON merge patch (standard input when
         PATCH is "-" or absent), and prints the new state

On a state root (--state-root, default DIR/.agentkit): get reads it beside
anything, a running server included; patch takes the state root's lock, so
it is refused while a server holds it. Through a running server's HTTP API:
--url URL (or --addr HOST:PORT) with --auth-token when the server has one.`

type actorFlags struct {
	dir, stateRoot, storage string
	url, addr, authToken    string
}

func runActor(e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.stdout, "Usage: agentkit "+actorUsage)
		return nil
	}
	sub := args[0]
	var f actorFlags
	fs := newFlags(e, "actor "+sub, actorUsage)
	fs.StringVar(&f.dir, "dir", "", "the project folder, holding agentkit.yaml (default: the current folder if it has one, else the built-in agent)")
	fs.StringVar(&f.stateRoot, "state-root", "", "the state root (default DIR/.agentkit)")
	fs.StringVar(&f.storage, "storage", "", "store URL of the agent, overriding storage: in agentkit.yaml (it holds the actors of earlier builds' key-value layout)")
	fs.StringVar(&f.url, "url", "", "base URL of a running server, such as http://127.0.0.1:8080: work through its HTTP API")
	fs.StringVar(&f.addr, "addr", "", "HOST:PORT of a running server, for --url http://HOST:PORT")
	fs.StringVar(&f.authToken, "auth-token", "", "the server's bearer token, with --url or --addr")
	pos, err := parseFlags(fs, args[1:])
	if err != nil {
		return err
	}
	switch {
	case sub != "get" && sub != "patch":
		return usagef("actor: unknown subcommand %q; use get or patch", sub)
	case sub == "get" && len(pos) != 1:
		return usagef("actor get: wrong number of arguments; usage: agentkit actor get SESSION")
	case sub == "patch" && (len(pos) < 1 || len(pos) > 2):
		return usagef("actor patch: wrong number of arguments; usage: agentkit actor patch SESSION [PATCH|-]")
	case pos[0] == "":
		return usagef("actor %s: the session id is empty", sub)
	case f.url != "" && f.addr != "":
		return usagef("actor %s: give --url or --addr, not both", sub)
	}
	var patch []byte
	if sub == "patch" {
		if len(pos) == 2 && pos[1] != "-" {
			patch = []byte(pos[1])
		} else if patch, err = io.ReadAll(e.stdin); err != nil {
			return fmt.Errorf("actor patch: reading the patch from standard input: %w", err)
		}
		if err := mergepatch.Validate(patch, "patch"); err != nil {
			return usagef("actor patch: %v", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var out []byte
	if f.url != "" || f.addr != "" {
		out, err = remoteActor(ctx, f, pos[0], patch)
	} else {
		out, err = localActor(ctx, f, pos[0], patch)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "%s\n", bytes.TrimRight(out, "\n"))
	return err
}

// localActor reads (patch nil) or patches a session actor's state on the
// state root directly.
func localActor(ctx context.Context, f actorFlags, id string, patch []byte) ([]byte, error) {
	p, err := findProject(f.dir)
	if err != nil {
		return nil, err
	}
	name, storage, serving := DefaultAgentName, f.storage, ""
	dir := "."
	if p.file != nil {
		name, serving, dir = p.file.Name, p.file.Serving, p.dir
		if storage == "" {
			storage = p.file.Storage
		}
	}
	if serving == agent.ServingLedger {
		return nil, errors.New(strings.TrimPrefix(agent.ErrActorStateLocal.Error(), "agent: ") + "; this agent is configured with serving: ledger, so agentkit actor refuses its actor state as the server does")
	}
	root := f.stateRoot
	if root == "" {
		root = filepath.Join(dir, DefaultStateRoot)
	}
	if _, err := os.Stat(filepath.Join(root, stateroot.FormatFile)); err != nil {
		return nil, fmt.Errorf("no state root at %s (no %s in it); give --state-root of a served agent, or --url of its server", root, stateroot.FormatFile)
	}
	if err := stateroot.Check(root); err != nil {
		return nil, err
	}
	var hostID string
	if patch != nil {
		// The lock: no server may write this state root meanwhile.
		r, err := stateroot.Open(root)
		if err != nil {
			if errors.Is(err, stateroot.ErrLocked) {
				return nil, fmt.Errorf("%w; to patch the state of a served agent, go through its HTTP API: agentkit actor patch --url http://HOST:PORT %s PATCH", err, id)
			}
			return nil, err
		}
		defer r.Close()
		if hostID, err = r.HostID(); err != nil {
			return nil, err
		}
	} else if b, err := os.ReadFile(filepath.Join(root, stateroot.HostIDFile)); err == nil {
		hostID = strings.TrimSpace(string(b))
	}
	found, err := sessiondb.Exists(ctx, filepath.Join(root, stateroot.SessionsDir, "sessions.db"), id)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("no session %s in state root %s (a session's actor lives on the host that serves it; for a session this host has not loaded, go through the server with --url)", id, root)
	}
	store, err := actorStore(ctx, storage, root, patch == nil)
	if err != nil {
		return nil, err
	}
	if store != nil {
		defer store.Close()
	}
	h, err := actor.Open(actor.Options{
		Dir: filepath.Join(root, stateroot.ActorsDir), Store: store, Agent: name, HostID: hostID,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if _, err := agent.DefineSessionClass(h); err != nil {
		return nil, err
	}
	ref, err := h.Ref(agent.SessionClass, id)
	if err != nil {
		return nil, err
	}
	if patch == nil {
		return ref.StateJSON(ctx)
	}
	out, err := ref.PatchStateJSON(ctx, patch)
	if errors.Is(err, actor.ErrInvalidState) {
		return nil, usagef("actor patch: %s", strings.TrimPrefix(err.Error(), "actor: "))
	}
	return out, err
}

// actorStore opens the agent's store, which holds the actors of earlier
// builds' key-value layout: --storage or the project's, else the state
// root's embedded store when it exists. A store that cannot read, list and
// delete holds no such layout (nil), as for the runtime. get opens it
// read-only.
func actorStore(ctx context.Context, storage, root string, readOnly bool) (*kv.DB, error) {
	if storage == "" {
		if _, err := os.Stat(stateroot.KVPath(root)); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		storage = stateroot.DefaultStoreURL(root)
	}
	db, err := kv.OpenWith(ctx, storage, kv.OpenOptions{ReadOnly: readOnly})
	var nd *kv.NoDriverError
	switch {
	case errors.As(err, &nd):
		return nil, usagef("--storage: no driver for %q URLs; the schemes are %s", nd.Scheme, strings.Join(nd.Schemes, ", "))
	case errors.Is(err, kv.ErrInvalidURL):
		return nil, usagef("--storage: %v", err)
	case err != nil:
		return nil, fmt.Errorf("opening the store: %w", err)
	}
	if c := db.Capabilities(); !c.Get || !c.List || !c.Delete {
		db.Close()
		return nil, nil
	}
	return db, nil
}

// remoteActor reads or patches a session actor's state through a server's
// HTTP API.
func remoteActor(ctx context.Context, f actorFlags, id string, patch []byte) ([]byte, error) {
	base := f.url
	if base == "" {
		base = "http://" + f.addr
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("--url %q: give the server's base URL, such as http://127.0.0.1:8080", base)
	}
	target := strings.TrimRight(base, "/") + "/v1/sessions/" + url.PathEscape(id) + "/state"
	method := http.MethodGet
	var body io.Reader
	if patch != nil {
		method, body = http.MethodPatch, bytes.NewReader(patch)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return nil, usagef("--url: %v", err)
	}
	if patch != nil {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	if f.authToken != "" {
		req.Header.Set("Authorization", "Bearer "+f.authToken)
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("calling the server at %s: %w (is it running? without --url and --addr, agentkit actor works on the state root)", base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the server's answer: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		return data, nil
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if json.Unmarshal(data, &e) != nil || e.Error.Code == "" {
		return nil, fmt.Errorf("the server answered %s: %s", resp.Status, clipText(string(data), 200))
	}
	msg := fmt.Sprintf("the server answered %d %s: %s", resp.StatusCode, e.Error.Code, e.Error.Message)
	if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity {
		return nil, usagef("%s", msg)
	}
	return nil, errors.New(msg)
}
