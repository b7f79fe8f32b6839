package sessiondb

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheListingSeeksTheIndex: both listing queries read
// sessions_by_updated from the cursor (a SEARCH or an ordered SCAN of the
// index that stops at the limit), never the whole table in another order.
// The page cost at 1,000,000 sessions rests on it (BenchmarkListPage).
func TestTheListingSeeksTheIndex(t *testing.T) {
	d, err := Open(context.Background(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for name, q := range map[string]string{"first page": listFirst, "from a cursor": listAfter} {
		args := []any{int64(1), "x", 50}
		if q == listFirst {
			args = []any{50}
		}
		rows, err := d.db.Query("EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		got := strings.Join(plan, "; ")
		if !strings.Contains(got, "sessions_by_updated") || strings.Contains(got, "TEMP B-TREE") {
			t.Errorf("%s: the plan is %q; want it to read sessions_by_updated in order", name, got)
		}
		if q == listAfter && !strings.Contains(got, "SEARCH") {
			t.Errorf("%s: the plan is %q; want a SEARCH of the index from the cursor", name, got)
		}
	}
}
