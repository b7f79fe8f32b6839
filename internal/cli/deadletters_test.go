package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentkit/kv"
	_ "agentkit/kv/sqlitekv"
	"agentkit/ledger"
)

// poisonLedger opens a serving ledger of agent over the store at url whose
// turns fail on payloads holding "poison" while poison is set.
func poisonLedger(t *testing.T, url, agent string, poison *atomic.Bool) (*ledger.Ledger, *kv.DB) {
	t.Helper()
	db, err := kv.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(ledger.Options{Tuning: ledger.Tuning{Lease: time.Second, MaxAttempts: 2},
		Store: db, Agent: agent,
		Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, tn *ledger.Turn) error {
			if poison.Load() && bytes.Contains(tn.Event.Payload, []byte("poison")) {
				return errors.New("the model choked on poison")
			}
			_, err := tn.Commit(ctx, []json.RawMessage{tn.Event.Payload})
			return err
		},
	})
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	return l, db
}

// TestDeadLettersCommand lists, drops and replays dead letters made by a
// ledger whose turns fail, with the built binary, and checks that a
// replayed message is then consumed by a serving host.
func TestDeadLettersCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := "sqlite:" + filepath.Join(dir, "store.db")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var poison atomic.Bool
	poison.Store(true)
	l, db := poisonLedger(t, url, "shop", &poison)
	for _, d := range []struct{ session, event, payload string }{
		{"s1", "e1", `{"message":"poison one"}`},
		{"s1", "e2", `{"message":"fine"}`},
		{"s2", "e3", `{"message":"poison three"}`},
	} {
		if _, err := l.Deliver(ctx, d.session, ledger.Event{ID: d.event, Payload: json.RawMessage(d.payload)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []struct{ session, event string }{{"s1", "e1"}, {"s1", "e2"}, {"s2", "e3"}} {
		if _, err := l.Await(ctx, w.session, w.event); err != nil && !errors.Is(err, ledger.ErrDeadLettered) {
			t.Fatalf("awaiting %s/%s: %v", w.session, w.event, err)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	db.Close()

	// ls: both dead letters, with their attempts and last error.
	r := run(t, dir, nil, "", "deadletters", "ls", "--storage", url, "--agent", "shop")
	if r.code != 0 {
		t.Fatalf("deadletters ls: exit %d, stderr %q", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SESSION") {
		t.Fatalf("deadletters ls printed %q; want a header and two rows", r.stdout)
	}
	for i, want := range []string{"s1 e1", "s2 e3"} {
		f := strings.Fields(lines[i+1])
		if len(f) < 5 || f[0]+" "+f[1] != want || f[2] != "2" || !strings.Contains(lines[i+1], "choked on poison") {
			t.Errorf("row %d %q; want %s with 2 attempts and the last error", i+1, lines[i+1], want)
		}
		if _, err := time.Parse(time.RFC3339, f[3]); err != nil {
			t.Errorf("row %d: the time %q is not RFC 3339", i+1, f[3])
		}
	}
	// ls --session and --json.
	r = run(t, dir, nil, "", "deadletters", "ls", "--storage", url, "--agent", "shop", "--session", "s2", "--json")
	var got struct {
		SessionID, EventID, LastError string
		Attempts                      int
		Payload                       json.RawMessage
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got.SessionID != "s2" || got.EventID != "e3" ||
		got.Attempts != 2 || string(got.Payload) != `{"message":"poison three"}` || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("ls --session s2 --json: exit %d, stdout %q, stderr %q; want one JSON line for s2/e3 with its payload", r.code, r.stdout, r.stderr)
	}

	// drop, then a second drop of the same letter fails naming it.
	if r = run(t, dir, nil, "", "deadletters", "drop", "--storage", url, "--agent", "shop", "s2", "e3"); r.code != 0 || !strings.Contains(r.stdout, "dropped") {
		t.Fatalf("drop: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r = run(t, dir, nil, "", "deadletters", "drop", "--storage", url, "--agent", "shop", "s2", "e3"); r.code != 1 || !strings.Contains(r.stderr, "no such dead letter") || !strings.Contains(r.stderr, "e3") {
		t.Fatalf("a second drop: exit %d, stderr %q; want exit 1 saying there is no such dead letter", r.code, r.stderr)
	}
	r = run(t, dir, nil, "", "deadletters", "ls", "--storage", url, "--agent", "shop")
	if r.code != 0 || strings.Contains(r.stdout, "e3") || !strings.Contains(r.stdout, "e1") {
		t.Fatalf("ls after the drop: exit %d, stdout %q; want e1 only", r.code, r.stdout)
	}

	// replay: the command holds no session, so the message waits,
	// pending with its attempts reset, for a serving host.
	r = run(t, dir, nil, "", "deadletters", "replay", "--storage", url, "--agent", "shop", "s1", "e1")
	if r.code != 0 || !strings.Contains(r.stdout, "replayed: event e1 is back at the end of session s1's inbox (inbox sequence number ") ||
		!strings.Contains(r.stdout, "janitor") || strings.Contains(r.stdout, "position") {
		t.Fatalf("replay: exit %d, stdout %q, stderr %q; want it back at the end of the inbox, by sequence number, not a position", r.code, r.stdout, r.stderr)
	}
	if r = run(t, dir, nil, "", "deadletters", "ls", "--storage", url, "--agent", "shop"); r.code != 0 || r.stdout != "no dead letters\n" {
		t.Fatalf("ls after the replay: exit %d, stdout %q; want none", r.code, r.stdout)
	}
	if r = run(t, dir, nil, "", "deadletters", "replay", "--storage", url, "--agent", "shop", "s1", "e1"); r.code != 0 || !strings.Contains(r.stdout, "already pending") {
		t.Fatalf("a second replay: exit %d, stdout %q, stderr %q; want already pending", r.code, r.stdout, r.stderr)
	}
	poison.Store(false) // the bug is fixed
	l, db = poisonLedger(t, url, "shop", &poison)
	defer db.Close()
	defer l.Close(context.Background())
	if st, err := l.Lookup(ctx, "s1", "e1"); err != nil || st.State != ledger.StatePending || st.Attempts != 0 {
		t.Fatalf("the replayed event: %+v, %v; want pending with no attempt (no host held the session)", st, err)
	}
	go l.Run(ctx)
	turn, err := l.Await(ctx, "s1", "e1")
	if err != nil || string(turn.Output[0]) != `{"message":"poison one"}` {
		t.Fatalf("the replayed event's turn: %+v, %v", turn, err)
	}
}

// TestDeadLetterOfAStoppedHostSaysNoErrorWasRecorded: a host stops
// (here: closes, canceling the turn) during the only attempt of a message;
// another host dead-letters it with no error in the ledger, and ls says
// so instead of showing a bare "-".
func TestDeadLetterOfAStoppedHostSaysNoErrorWasRecorded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	url := "sqlite:" + filepath.Join(dir, "store.db")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(h ledger.Handler) (*ledger.Ledger, *kv.DB) {
		db, err := kv.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		l, err := ledger.Open(ledger.Options{Tuning: ledger.Tuning{Lease: time.Second, MaxAttempts: 1}, Store: db, Agent: "shop", Logger: slog.New(slog.DiscardHandler), Handler: h})
		if err != nil {
			t.Fatal(err)
		}
		return l, db
	}
	entered := make(chan struct{})
	l1, db1 := open(func(ctx context.Context, tn *ledger.Turn) error {
		close(entered)
		<-ctx.Done() // the host stops mid-turn
		return ctx.Err()
	})
	if _, err := l1.Deliver(ctx, "s1", ledger.Event{ID: "e1", Payload: json.RawMessage(`{"message":"hello"}`)}); err != nil {
		t.Fatal(err)
	}
	<-entered
	stopCtx, stopNow := context.WithCancel(ctx)
	stopNow()
	l1.Close(stopCtx) // cancels the turn at once
	db1.Close()

	l2, db2 := open(func(ctx context.Context, tn *ledger.Turn) error {
		_, err := tn.Commit(ctx, []json.RawMessage{tn.Event.Payload})
		return err
	})
	go l2.Run(ctx)
	if _, err := l2.Await(ctx, "s1", "e1"); !errors.Is(err, ledger.ErrDeadLettered) {
		t.Fatalf("the message of the stopped host: %v; want it dead-lettered (its one attempt was spent)", err)
	}
	l2.Close(ctx)
	db2.Close()

	r := run(t, dir, nil, "", "deadletters", "ls", "--storage", url, "--agent", "shop")
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.HasSuffix(lines[1], "none recorded: the host stopped during the attempt, before it could record one (a crash, a kill or a lost lease)") {
		t.Fatalf("deadletters ls: exit %d, stdout %q, stderr %q; want one row saying no error was recorded and why", r.code, r.stdout, r.stderr)
	}
	if f := strings.Fields(lines[1]); f[0] != "s1" || f[1] != "e1" || f[2] != "1" {
		t.Errorf("the row %q; want s1 e1 with 1 attempt", lines[1])
	}
}

// TestDeadLettersFindsTheProjectsStore runs the command in a project folder
// whose agentkit.yaml names the agent and its store.
func TestDeadLettersFindsTheProjectsStore(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "project.db")
	dir := writeProject(t, fmt.Sprintf("name: desk\nstorage: sqlite:%s\n", store))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var poison atomic.Bool
	poison.Store(true)
	l, db := poisonLedger(t, "sqlite:"+store, "desk", &poison)
	if _, err := l.Deliver(ctx, "s", ledger.Event{ID: "bad", Payload: json.RawMessage(`"poison"`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Await(ctx, "s", "bad"); !errors.Is(err, ledger.ErrDeadLettered) {
		t.Fatalf("await: %v; want dead-lettered", err)
	}
	l.Close(ctx)
	db.Close()
	if r := run(t, dir, nil, "", "deadletters", "ls"); r.code != 0 || !strings.Contains(r.stdout, "bad") {
		t.Fatalf("ls in the project folder: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := run(t, t.TempDir(), nil, "", "deadletters", "ls", "--dir", dir); r.code != 0 || !strings.Contains(r.stdout, "bad") {
		t.Fatalf("ls --dir: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// ledger.store: names the coordination store, before storage:.
	other := writeProject(t, fmt.Sprintf("name: desk\nstorage: sqlite:%s\nledger:\n  store: sqlite:%s\n", filepath.Join(t.TempDir(), "data.db"), store))
	if r := run(t, other, nil, "", "deadletters", "ls"); r.code != 0 || !strings.Contains(r.stdout, "bad") {
		t.Fatalf("ls with ledger.store: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// Another agent of the same store has none.
	if r := run(t, dir, nil, "", "deadletters", "ls", "--agent", "other"); r.code != 0 || r.stdout != "no dead letters\n" {
		t.Fatalf("ls --agent other: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestDeadLettersUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"deadletters"}, 2, "ls, replay or drop"},
		{[]string{"deadletters", "frob"}, 2, "unknown subcommand \"frob\""},
		{[]string{"deadletters", "replay", "s1"}, 2, "replay SESSION EVENT"},
		{[]string{"deadletters", "drop", "s1", "e1", "e2"}, 2, "drop SESSION EVENT"},
		{[]string{"deadletters", "ls", "s1"}, 2, "--session"},
		{[]string{"deadletters", "replay", "--agent", "a", "", "e"}, 2, "must not be empty"},
		{[]string{"deadletters", "ls", "--session"}, 2, "-session"},
		{[]string{"deadletters", "ls"}, 2, "no agent name"},
		{[]string{"deadletters", "ls", "--agent", "a", "--storage", "mem://"}, 2, "memory"},
		{[]string{"deadletters", "ls", "--agent", "a", "--storage", "bogus://x"}, 2, "no driver for \"bogus\""},
		{[]string{"deadletters", "ls", "--agent", "a"}, 2, "no store"},
	} {
		r := run(t, dir, nil, "", c.args...)
		if r.code != c.code || !oneLine(r.stderr) || !strings.Contains(r.stderr, c.want) {
			t.Errorf("agentkit %q: exit %d, stderr %q; want exit %d and one line containing %q", c.args, r.code, r.stderr, c.code, c.want)
		}
	}
	r := run(t, dir, nil, "", "deadletters", "-h")
	if r.code != 0 || !strings.Contains(r.stdout, "replay SESSION EVENT") {
		t.Errorf("deadletters -h: exit %d, stdout %q", r.code, r.stdout)
	}
}
