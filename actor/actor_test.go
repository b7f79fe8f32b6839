package actor

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"agentkit/actor/mergepatch"
)

// Status is the state type most tests use.
type Status struct {
	Status    string            `json:"status"`
	LastReply string            `json:"lastReply"`
	At        int64             `json:"at"`
	Tags      map[string]string `json:"tags,omitempty"`
}

func openHost(t testing.TB, opts Options) *Host {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = filepath.Join(t.TempDir(), "actors")
	}
	h, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func defineStatus(t testing.TB, h *Host) *Class[Status] {
	t.Helper()
	c, err := Define(h, "agent", func() Status { return Status{Status: "idle"} })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func actorOf[S any](t testing.TB, c *Class[S], id string) *Actor[S] {
	t.Helper()
	a, err := c.Actor(id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// files lists every file under dir (relative), or nil if dir is missing.
func files(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

func TestStateStartsInitialAndMerges(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "user-42")
	st, err := a.State(ctx)
	if err != nil || st.Status != "idle" || st.LastReply != "" {
		t.Fatalf("new actor: %+v, %v; want the initial state", st, err)
	}
	st, err = a.SetState(ctx, []byte(`{"status":"processing","tags":{"a":"1","b":"2"}}`))
	if err != nil || st.Status != "processing" || st.Tags["a"] != "1" {
		t.Fatalf("SetState returned %+v, %v", st, err)
	}
	st, err = a.SetState(ctx, []byte(`{"lastReply":"Done.","tags":{"a":null,"c":"3"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Status{Status: "processing", LastReply: "Done.", Tags: map[string]string{"b": "2", "c": "3"}}
	if got, _ := a.State(ctx); fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(st) != fmt.Sprint(want) {
		t.Fatalf("after two patches: %+v (returned %+v), want %+v", got, st, want)
	}
	if err := a.ReplaceState(ctx, Status{Status: "waiting", At: 7}); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.State(ctx); got.Status != "waiting" || got.At != 7 || got.LastReply != "" || got.Tags != nil {
		t.Fatalf("after ReplaceState: %+v", got)
	}
	js, _ := a.StateJSON(ctx)
	if string(js) != `{"status":"waiting","lastReply":"","at":7}` {
		t.Errorf("StateJSON = %s", js)
	}
}

// TestStateIsDurable: a new Host on the same folder reads what the last
// one wrote, and a patch on a replaced state starts from it.
func TestStateIsDurable(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "actors")
	h := openHost(t, Options{Dir: dir})
	a := actorOf(t, defineStatus(t, h), "a")
	if _, err := a.SetState(ctx, []byte(`{"status":"processing"}`)); err != nil {
		t.Fatal(err)
	}
	h.Close()
	h2 := openHost(t, Options{Dir: dir})
	a2 := actorOf(t, defineStatus(t, h2), "a")
	if st, err := a2.State(ctx); err != nil || st.Status != "processing" {
		t.Fatalf("after reopening: %+v, %v", st, err)
	}
}

func TestConcurrentSetStateLosesNoPatch(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{Synchronous: "normal"})
	c, err := Define[map[string]int](h, "counter", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := actorOf(t, c, "x")
	const writers, each = 8, 12
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			// Each writer through its own handle, as separate callers do.
			a := actorOf(t, c, "x")
			for i := range each {
				if _, err := a.SetState(ctx, fmt.Appendf(nil, `{"w%d_%d":%d}`, w, i, i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st, err := a.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != writers*each {
		t.Fatalf("the state holds %d keys after %d patches of one new key each: patches were lost", len(st), writers*each)
	}
}

func TestPatchThatDoesNotFitTheTypeIsRefused(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "a")
	if _, err := a.SetState(ctx, []byte(`{"at":5}`)); err != nil {
		t.Fatal(err)
	}
	// The error names the field and the JSON types, never the Go type (it
	// reaches HTTP clients as it is).
	for _, c := range []struct{ patch, want string }{
		{`{"at":"soon"}`, "at: expected a whole number, found a JSON string"},
		{`[1]`, "the state must be an object, not a JSON array"},
		{`{"tags":{"a":1}}`, "tags: expected a string, found a JSON number"},
	} {
		_, err := a.SetState(ctx, []byte(c.patch))
		if !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "actor.Status") {
			t.Errorf("SetState(%s) = %v; want ErrInvalidState saying %q", c.patch, err, c.want)
		}
	}
	if err := a.ReplaceStateJSON(ctx, []byte(`{"at":true}`)); !errors.Is(err, ErrInvalidState) {
		t.Errorf("ReplaceStateJSON of a mistyped value = %v", err)
	}
	if st, _ := a.State(ctx); st.At != 5 {
		t.Errorf("a refused patch changed the state: %+v", st)
	}
}

// TestRefusedFirstPatchCreatesNothing: a patch whose result the type
// cannot hold, sent to an actor that has no database yet, leaves no file.
func TestRefusedFirstPatchCreatesNothing(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "new")
	if _, err := a.SetState(ctx, []byte(`{"at":"soon"}`)); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("SetState of a mistyped first patch = %v; want ErrInvalidState", err)
	}
	if fs := files(t, h.Dir()); fs != nil {
		t.Errorf("a refused first patch created files: %v", fs)
	}
}

// TestUnknownKeysSurvive: the stored JSON is the state; keys the Go type
// does not know are kept through later patches.
func TestUnknownKeysSurvive(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "a")
	if _, err := a.PatchStateJSON(ctx, []byte(`{"extra":{"n":12345678901234567890}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetState(ctx, []byte(`{"status":"busy"}`)); err != nil {
		t.Fatal(err)
	}
	js, _ := a.StateJSON(ctx)
	if want := `{"status":"busy","lastReply":"","at":0,"extra":{"n":12345678901234567890}}`; string(js) != want {
		t.Errorf("state = %s, want %s", js, want)
	}
}

func TestRawStateKeepsExactDigits(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	c, err := Define(h, "raw", func() json.RawMessage { return json.RawMessage(`{}`) })
	if err != nil {
		t.Fatal(err)
	}
	a := actorOf(t, c, "r")
	st, err := a.SetState(ctx, []byte(`{"big":12345678901234567890,"small":0.1000000000000000055511151231257827,"arr":[1,null,{"x":null}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"big":12345678901234567890,"small":0.1000000000000000055511151231257827,"arr":[1,null,{"x":null}]}`
	if string(st) != want {
		t.Fatalf("SetState = %s", st)
	}
	if got, _ := a.State(ctx); string(got) != want {
		t.Fatalf("State = %s", got)
	}
}

func TestInvalidPatchNamesThePositionAndCreatesNothing(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "a")
	_, err := a.SetState(ctx, []byte("{\n  \"status\": idle\n}"))
	var se *mergepatch.SyntaxError
	if !errors.As(err, &se) || se.Line != 2 || se.Column != 13 {
		t.Fatalf("SetState of invalid JSON = %v; want a SyntaxError at line 2, column 13", err)
	}
	if fs := files(t, h.Dir()); fs != nil {
		t.Errorf("a refused patch created files: %v", fs)
	}
}

// TestReadingCreatesNoFile: an actor that is only read costs no file.
func TestReadingCreatesNoFile(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "never-written")
	if _, err := a.State(ctx); err != nil {
		t.Fatal(err)
	}
	if recs, err := a.Messages().Last(ctx, 10); err != nil || len(recs) != 0 {
		t.Fatalf("Last = %v, %v", recs, err)
	}
	if recs, err := a.Events().After(ctx, 0, 10); err != nil || len(recs) != 0 {
		t.Fatalf("After = %v, %v", recs, err)
	}
	if ts, err := a.Schedules(ctx); err != nil || len(ts) != 0 {
		t.Fatalf("Schedules = %v, %v", ts, err)
	}
	if err := a.CancelSchedule(ctx, "task_x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("CancelSchedule on a new actor = %v", err)
	}
	if a.HasDatabase() {
		t.Error("HasDatabase is true for an actor never written")
	}
	if fs := files(t, h.Dir()); fs != nil {
		t.Errorf("reading created files: %v", fs)
	}
	if _, err := a.SetState(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if !a.HasDatabase() {
		t.Error("no database after a write")
	}
}

// TestFilesAreOwnerOnly: folders 0700, databases and their journal files
// 0600, whatever the umask.
func TestFilesAreOwnerOnly(t *testing.T) {
	ctx := context.Background()
	h := openHost(t, Options{})
	a := actorOf(t, defineStatus(t, h), "Secret/../id")
	if _, err := a.SetState(ctx, []byte(`{"status":"x"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Schedule(ctx, After(3600e9), "h", nil); err != nil {
		t.Fatal(err)
	}
	db, err := a.SQL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (x)`); err != nil {
		t.Fatal(err)
	}
	n := 0
	filepath.WalkDir(h.Dir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := d.Info()
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), want)
		}
		n++
		return nil
	})
	if got := files(t, h.Dir()); !strings.Contains(strings.Join(got, " "), "system.db-wal") || !strings.Contains(strings.Join(got, " "), "data.db") {
		t.Errorf("expected the WAL and the author's database among %v", got)
	}
	if n < 8 {
		t.Errorf("only %d entries checked", n)
	}
}

func TestFileNamesAreSafeAndDistinct(t *testing.T) {
	long := strings.Repeat("x", 129)
	for raw, want := range map[string]string{
		"a": "a", "user-42_x": "user-42_x", "A": "%41", ".": "%2E", "..": "%2E%2E",
		"a/b": "a%2Fb", "a%2Fb": "a%252%46b", "é": "%C3%A9", "=": "%3D", "\x00": "%00",
		strings.Repeat("x", 128): strings.Repeat("x", 128),
		long:                     "=" + fmt.Sprintf("%x", sha256.Sum256([]byte(long))),
	} {
		if got := fileName(raw); got != want {
			t.Errorf("fileName(%q) = %q, want %q", raw, got, want)
		}
	}
	seen := map[string]string{}
	for _, n := range []string{"a", "A", "%41", "=", "a.b", "a%2Eb", strings.Repeat("é", 100), strings.Repeat("é", 101)} {
		f := fileName(n)
		if prev, ok := seen[f]; ok {
			t.Errorf("fileName(%q) = fileName(%q) = %q", n, prev, f)
		}
		seen[f] = n
	}
}

func TestNewerFormatIsRefused(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "actors")
	h := openHost(t, Options{Dir: dir})
	a := actorOf(t, defineStatus(t, h), "a")
	if _, err := a.SetState(ctx, []byte(`{"status":"x"}`)); err != nil {
		t.Fatal(err)
	}
	h.Close()
	path := filepath.Join(dir, "agent", "a", systemFile)
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	raw.Close()

	h2 := openHost(t, Options{Dir: dir})
	a2 := actorOf(t, defineStatus(t, h2), "a")
	_, err = a2.State(ctx)
	if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), "upgrade agentkit") || !strings.Contains(err.Error(), "format 99") {
		t.Fatalf("State on a newer database = %v; want ErrNewerFormat saying to upgrade", err)
	}
	if _, err := a2.SetState(ctx, []byte(`{}`)); !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("SetState on a newer database = %v", err)
	}
	if _, err := a2.Messages().Append(ctx, "user", nil); !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("Append on a newer database = %v", err)
	}
}

func TestClassesAndNames(t *testing.T) {
	h := openHost(t, Options{})
	defineStatus(t, h)
	if _, err := Define(h, "agent", func() int { return 0 }); !errors.Is(err, ErrClassDefined) {
		t.Errorf("defining a class twice = %v", err)
	}
	if _, err := Define(h, "", func() int { return 0 }); !errors.Is(err, ErrInvalidName) {
		t.Errorf("an empty class name = %v", err)
	}
	if _, err := Define(h, "chan", func() chan int { return nil }); err == nil {
		t.Error("a state type JSON cannot encode was accepted")
	}
	if _, err := h.Ref("nope", "a"); !errors.Is(err, ErrUnknownClass) {
		t.Errorf("Ref of an undefined class = %v", err)
	}
	if _, err := h.Ref("agent", ""); !errors.Is(err, ErrInvalidName) {
		t.Errorf("Ref with an empty id = %v", err)
	}
	r, err := h.Ref("agent", "a")
	if err != nil || r.Class() != "agent" || r.ID() != "a" {
		t.Fatalf("Ref = %v, %v", r, err)
	}
	if js, err := r.StateJSON(context.Background()); err != nil || string(js) != `{"status":"idle","lastReply":"","at":0}` {
		t.Errorf("Ref's initial state = %s, %v", js, err)
	}
	if _, err := Open(Options{}); err == nil {
		t.Error("Open without a folder succeeded")
	}
	if _, err := Open(Options{Dir: t.TempDir(), Synchronous: "off"}); err == nil {
		t.Error("Open with synchronous=off succeeded")
	}
}

func TestWriteCheckRefusesWrites(t *testing.T) {
	ctx := context.Background()
	refuse := errors.New("refused by the check")
	h := openHost(t, Options{WriteCheck: func(ctx context.Context, class, id string) error {
		if id == "locked" {
			return refuse
		}
		return nil
	}})
	c := defineStatus(t, h)
	a := actorOf(t, c, "locked")
	if _, err := a.SetState(ctx, []byte(`{}`)); !errors.Is(err, refuse) {
		t.Errorf("SetState = %v", err)
	}
	if _, err := a.Messages().Append(ctx, "user", nil); !errors.Is(err, refuse) {
		t.Errorf("Append = %v", err)
	}
	if _, err := a.Schedule(ctx, After(0), "h", nil); !errors.Is(err, refuse) {
		t.Errorf("Schedule = %v", err)
	}
	if _, err := a.State(ctx); err != nil {
		t.Errorf("a read was refused: %v", err)
	}
	if fs := files(t, h.Dir()); fs != nil {
		t.Errorf("refused writes created %v", fs)
	}
	if _, err := actorOf(t, c, "free").SetState(ctx, []byte(`{}`)); err != nil {
		t.Error(err)
	}
}

func TestAuthorSQLDatabase(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "actors")
	h := openHost(t, Options{Dir: dir})
	a := actorOf(t, defineStatus(t, h), "a")
	db, err := a.SQL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := a.SQL(ctx); again != db {
		t.Error("SQL returned a second *sql.DB for one actor")
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO orders (total) VALUES (5), (7)`); err != nil {
		t.Fatal(err)
	}
	// The author's database is not the system database.
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE name = 'state'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the author's database holds the system tables (%d, %v)", n, err)
	}
	h.Close()
	if _, err := a.SQL(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("SQL after Close = %v", err)
	}
	h2 := openHost(t, Options{Dir: dir})
	db2, err := actorOf(t, defineStatus(t, h2), "a").SQL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sum int
	if err := db2.QueryRowContext(ctx, `SELECT sum(total) FROM orders`).Scan(&sum); err != nil || sum != 12 {
		t.Fatalf("after reopening: sum %d, %v", sum, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "agent", "a", systemFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("opening the author's database created the system database (%v)", err)
	}
}

// TestDurabilitySettings: system databases run in WAL mode with
// synchronous=FULL unless the Host says normal, like every other SQLite
// file of agentkit.
func TestDurabilitySettings(t *testing.T) {
	ctx := context.Background()
	for sync, want := range map[string]int{"": 2, "full": 2, "normal": 1} {
		h := openHost(t, Options{Synchronous: sync})
		a := actorOf(t, defineStatus(t, h), "a")
		e, err := a.acquireWrite(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var mode string
		if err := e.db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := e.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		h.pool.release(e)
		if got != want || mode != "wal" {
			t.Errorf("Synchronous %q: synchronous=%d journal_mode=%s; want %d and wal", sync, got, mode, want)
		}
	}
}

// TestTwoHostsCreateOneDatabase: two Hosts (as two processes) writing a
// new actor at once create its database once; neither write is lost.
func TestTwoHostsCreateOneDatabase(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "actors")
	ha, hb := openHost(t, Options{Dir: dir, Synchronous: "normal"}), openHost(t, Options{Dir: dir, Synchronous: "normal"})
	ca, err := Define[map[string]int](ha, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := Define[map[string]int](hb, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id := fmt.Sprint("actor-", i)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, c := range []*Class[map[string]int]{ca, cb} {
			wg.Go(func() {
				_, errs[j] = actorOf(t, c, id).SetState(ctx, fmt.Appendf(nil, `{"host%d":1}`, j))
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		st, err := actorOf(t, ca, id).State(ctx)
		if err != nil || len(st) != 2 {
			t.Fatalf("%s = %v, %v; want both hosts' keys", id, st, err)
		}
	}
}
