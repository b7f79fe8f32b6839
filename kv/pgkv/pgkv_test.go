package pgkv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"agentkit/internal/testenv/pgtest"
	"agentkit/kv"
)

// server returns the connection string of the test server, or skips (fails
// in CI) when it is not reachable.
func server(t testing.TB) string { return pgtest.URL(t) }

// fastServer is server with synchronous_commit=off for the test's sessions,
// to spare the shared machine a WAL flush per write.
func fastServer(t testing.TB) string {
	s := server(t)
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return s // keyword/value form: leave it
	}
	q := u.Query()
	q.Set("synchronous_commit", "off")
	u.RawQuery = q.Encode()
	return u.String()
}

// newTable returns a fresh table name, dropped when the test ends.
func newTable(t testing.TB) string { return pgtest.Table(t, "kvtest_") }

// openTable opens a new client (its own pool) on table.
func openTable(t testing.TB, table string, opts *Options) *kv.DB {
	t.Helper()
	o := Options{Table: table}
	if opts != nil {
		o = *opts
		o.Table = table
	}
	db, err := Open(context.Background(), fastServer(t), &o)
	if err != nil {
		t.Fatalf("Open table %s: %v", table, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpenURL(t *testing.T) {
	base := server(t)
	table := newTable(t)
	ctx := t.Context()
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	var dbs []*kv.DB
	for _, scheme := range []string{"postgres", "postgresql"} {
		u := scheme + strings.TrimPrefix(base, strings.SplitN(base, ":", 2)[0]) + sep + "table=" + table
		db, err := kv.Open(ctx, u)
		if err != nil {
			t.Fatalf("kv.Open(%s): %v", u, err)
		}
		defer db.Close()
		if db.Name() != "postgres" {
			t.Errorf("kv.Open(%s).Name() = %q, want postgres", u, db.Name())
		}
		s, ok := db.Backend().(*Store)
		if !ok {
			t.Fatalf("kv.Open(%s).Backend() is %T, want *pgkv.Store", u, db.Backend())
		}
		if s.Table() != table {
			t.Errorf("kv.Open(%s) uses table %q, want %q", u, s.Table(), table)
		}
		if !db.Capabilities().CAS || !db.Capabilities().List {
			t.Errorf("capabilities %v, want the full core and CAS", db.Capabilities())
		}
		dbs = append(dbs, db)
	}
	if err := dbs[0].Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := dbs[1].Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Errorf("Get through the postgresql:// client = %q, %v; want the value put through postgres://", v, err)
	}
}

func TestSplitURL(t *testing.T) {
	for _, tc := range []struct{ in, conn, table string }{
		{"postgres://u:p@h:5432/db?sslmode=disable&table=my_kv", "postgres://u:p@h:5432/db?sslmode=disable", "my_kv"},
		{"postgresql://h/db", "postgresql://h/db", ""},
		{"postgres://h/db?table=t1&application_name=x", "postgres://h/db?application_name=x", "t1"},
	} {
		u, err := parseURL(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		conn, opts, err := splitURL(u)
		if err != nil {
			t.Fatalf("splitURL(%s): %v", tc.in, err)
		}
		if conn != tc.conn || opts.Table != tc.table {
			t.Errorf("splitURL(%s) = %q, table %q; want %q, table %q", tc.in, conn, opts.Table, tc.conn, tc.table)
		}
	}
	u, _ := parseURL("postgres://h/db?table=")
	if _, _, err := splitURL(u); err == nil || !strings.Contains(err.Error(), "table parameter is empty") {
		t.Errorf("splitURL with table= gave %v, want an error about the empty table parameter", err)
	}
	u, _ = parseURL("postgres://h/db?table=a;b")
	if _, _, err := splitURL(u); err == nil || !strings.Contains(err.Error(), "query does not parse") {
		t.Errorf("splitURL with a semicolon gave %v, want an error about the query", err)
	}
}

func TestBadTableName(t *testing.T) {
	for _, name := range []string{"Upper", "1abc", "a-b", "a.b", `a"b`, "a b", "ä", strings.Repeat("a", 64), "x;drop table y"} {
		_, err := Open(t.Context(), "postgres://127.0.0.1:1/db", &Options{Table: name})
		if err == nil || !strings.Contains(err.Error(), "table name") || !strings.Contains(err.Error(), "lower-case") {
			t.Errorf("Open with table %q: got %v, want an error explaining table names", name, err)
		}
		_, err = kv.Open(t.Context(), "postgres://127.0.0.1:1/db?table="+url.QueryEscape(name))
		if err == nil || !strings.Contains(err.Error(), "table name") {
			t.Errorf("kv.Open with table %q: got %v, want an error explaining table names", name, err)
		}
	}
	for _, name := range []string{"a", "_", "agentkit_kv", "t_1", strings.Repeat("a", 63)} {
		if err := checkTable(name); err != nil {
			t.Errorf("checkTable(%q) = %v, want nil", name, err)
		}
	}
}

func TestErrorsHidePassword(t *testing.T) {
	const pw = "S3cretPassw0rd"
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error, want one", what)
			return
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(fmt.Sprintf("%+v", err), pw) {
			t.Errorf("%s: the error shows the password: %v", what, err)
		}
		var ce *pgconn.ConnectError
		if errors.As(err, &ce) {
			t.Errorf("%s: the error unwraps to *pgconn.ConnectError, whose Config holds the password", what)
		}
	}
	_, err := kv.Open(ctx, "postgres://root:"+pw+"@127.0.0.1:1/test?sslmode=disable&table=t")
	check("kv.Open on a closed port", err)
	if err != nil && !strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("the error does not say where it tried to connect: %v", err)
	}
	_, err = Open(ctx, "postgres://root:"+pw+"@127.0.0.1:1/test?sslmode=disable", nil)
	check("Open URL on a closed port", err)
	_, err = Open(ctx, "host=127.0.0.1 port=1 user=root password="+pw+" dbname=test sslmode=disable", nil)
	check("Open keyword/value on a closed port", err)
	_, err = Open(ctx, "postgres://root:"+pw+"@127.0.0.1:1/test?sslmode=bogus", nil)
	check("Open with a bad parameter", err)
	_, err = Open(ctx, "host=127.0.0.1 password='"+pw, nil)
	check("Open with a malformed string", err)
	_, err = kv.Open(ctx, "postgres://root:"+pw+"@127.0.0.1:99999/test")
	check("kv.Open with a bad port", err)
}

func TestExistingTableChecked(t *testing.T) {
	url := server(t)
	table := newTable(t)
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "CREATE TABLE "+table+" (key text PRIMARY KEY, value text)"); err != nil {
		t.Fatal(err)
	}
	_, err = Open(t.Context(), url, &Options{Table: table})
	if err == nil || !strings.Contains(err.Error(), "not a kv table") || !strings.Contains(err.Error(), `COLLATE "C"`) || !strings.Contains(err.Error(), "version") {
		t.Errorf("Open on a foreign table: got %v, want an error naming the wrong columns", err)
	}
}

// TestCreateRace opens one new table from many clients at once: every Open
// must succeed (CREATE TABLE IF NOT EXISTS alone fails this way).
func TestCreateRace(t *testing.T) {
	url := server(t)
	table := newTable(t)
	const n = 6
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			db, err := Open(t.Context(), url, &Options{Table: table})
			if err == nil {
				err = db.Put(t.Context(), fmt.Sprint("k", i), []byte("v"))
				db.Close()
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
}

// TestUnknownOutcomeIsNotConflict makes conditional writes wait on a row
// lock until their deadline passes: the error must be the deadline, never a
// conflict, since the server might still have run the write.
func TestUnknownOutcomeIsNotConflict(t *testing.T) {
	url := server(t)
	table := newTable(t)
	db := openTable(t, table, nil)
	ctx := t.Context()
	ver, err := db.PutIfAbsent(ctx, "locked", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+table+" WHERE key = 'locked' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, value) VALUES ('pending', '')"); err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"PutIfVersion", func(ctx context.Context) error {
			_, err := db.PutIfVersion(ctx, "locked", []byte("w"), ver)
			return err
		}},
		{"PutIfAbsent", func(ctx context.Context) error {
			_, err := db.PutIfAbsent(ctx, "pending", []byte("w"))
			return err
		}},
	} {
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := op.run(tctx)
		cancel()
		if errors.Is(err, kv.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s blocked past its deadline: got %v, want context.DeadlineExceeded and no conflict", op.name, err)
		}
	}
}

func TestListPaging(t *testing.T) {
	db := openTable(t, newTable(t), &Options{PageSize: 3})
	ctx := t.Context()
	var want []string
	for i := range 11 {
		want = append(want, fmt.Sprintf("p/%02d", i))
	}
	top := string(utf8.MaxRune)
	others := []string{"o", "p", "p.", "q", top, top + "a", top + top, top + top + "z"}
	for _, k := range append(slices.Clone(want), others...) {
		if err := db.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	got := collectKeys(t, db, "p/")
	if !slices.Equal(got, want) {
		t.Errorf("ListKeys(p/) with 3-row pages = %q, want %q", got, want)
	}
	// A prefix with no successor is listed without an upper bound.
	if got, want := collectKeys(t, db, top+top), []string{top + top, top + top + "z"}; !slices.Equal(got, want) {
		t.Errorf("ListKeys(U+10FFFF x2) = %q, want %q", got, want)
	}
	var all []string
	for e, err := range db.List(ctx, "") {
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Value) != e.Key {
			t.Errorf("List yielded %q with value %q", e.Key, e.Value)
		}
		all = append(all, e.Key)
	}
	wantAll := append(slices.Clone(want), others...)
	slices.Sort(wantAll)
	if !slices.Equal(all, wantAll) {
		t.Errorf("List(\"\") = %q, want %q", all, wantAll)
	}
}

func parseURL(s string) (*url.URL, error) { return url.Parse(s) }

func collectKeys(t *testing.T, db *kv.DB, prefix string) []string {
	t.Helper()
	var out []string
	for k, err := range db.ListKeys(t.Context(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

// TestListBigValues checks values above the inline limit, which List reads
// one by one: they round-trip, and one deleted after its page was read is
// skipped.
func TestListBigValues(t *testing.T) {
	db := openTable(t, newTable(t), nil)
	ctx := t.Context()
	big := func(c byte) []byte { return []byte(strings.Repeat(string(c), inlineValueLimit+1)) }
	vals := map[string][]byte{"b/1": big('1'), "b/2": []byte("small"), "b/3": big('3'), "b/4": {}, "b/5": big('5')}
	for k, v := range vals {
		if err := db.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for e, err := range db.List(ctx, "b/") {
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Value) != string(vals[e.Key]) {
			t.Errorf("List yielded %q with %d bytes, want %d", e.Key, len(e.Value), len(vals[e.Key]))
		}
		got = append(got, e.Key)
		if e.Key == "b/1" {
			if err := db.Delete(ctx, "b/3"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if want := []string{"b/1", "b/2", "b/4", "b/5"}; !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q (b/3 deleted during the listing)", got, want)
	}
}

func TestTooLarge(t *testing.T) {
	db := openTable(t, newTable(t), nil)
	s := db.Backend().(*Store)
	s.maxValue = 10
	ctx := t.Context()
	if err := db.Put(ctx, "k", make([]byte, 10)); err != nil {
		t.Fatalf("Put at the limit: %v", err)
	}
	ver, err := db.PutIfAbsent(ctx, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	over := make([]byte, 11)
	if err := db.Put(ctx, "k", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("Put over the limit: %v, want kv.ErrTooLarge", err)
	}
	if _, err := db.PutIfAbsent(ctx, "n", over); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("PutIfAbsent over the limit: %v, want kv.ErrTooLarge", err)
	}
	if _, err := db.PutIfVersion(ctx, "c", over, ver); !errors.Is(err, kv.ErrTooLarge) {
		t.Errorf("PutIfVersion over the limit: %v, want kv.ErrTooLarge", err)
	}
	if v, err := db.Get(ctx, "k"); err != nil || len(v) != 10 {
		t.Errorf("after a rejected Put, Get = %d bytes, %v; want the 10 bytes stored before", len(v), err)
	}
}

func TestDrop(t *testing.T) {
	table := newTable(t)
	db := openTable(t, table, nil)
	if err := db.Put(t.Context(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := db.Backend().(*Store).Drop(t.Context()); err != nil {
		t.Fatal(err)
	}
	var exists bool
	conn, err := pgx.Connect(t.Context(), server(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("table %s still exists after Drop", table)
	}
}
