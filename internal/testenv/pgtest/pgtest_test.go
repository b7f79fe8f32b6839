package pgtest_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"agentkit/internal/testenv/pgtest"
)

func exists(t *testing.T, table string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var ok bool
	if err := conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// A table made under a subtest is gone once the subtest ends, and two
// calls never share a name.
func TestTableIsUniqueAndDropped(t *testing.T) {
	var a, b string
	t.Run("make", func(t *testing.T) {
		a, b = pgtest.Table(t, "pgtest_"), pgtest.Table(t, "pgtest_")
		if a == b || !strings.HasPrefix(a, "pgtest_") {
			t.Fatalf("tables %q and %q: want two distinct names with the prefix", a, b)
		}
		conn, err := pgx.Connect(context.Background(), pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "CREATE TABLE "+a+" (x int)"); err != nil {
			t.Fatal(err)
		}
		if !exists(t, a) {
			t.Fatalf("table %s was not created", a)
		}
	})
	if exists(t, a) {
		t.Errorf("table %s outlived its test", a)
	}
}

func TestTableURLNamesAFreshTable(t *testing.T) {
	raw := pgtest.TableURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if table := u.Query().Get("table"); !strings.HasPrefix(table, "test_") || len(table) != len("test_")+12 {
		t.Errorf("TableURL = %s, want table=test_ and 12 hex digits", u.Redacted())
	}
}
