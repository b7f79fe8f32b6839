package actorbench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	_ "modernc.org/sqlite"

	"agentkit/actor"
)

// state10KB is a state of about 10 KB: 100 keys of 90-character strings
// and a nested object.
func state10KB() []byte {
	m := map[string]any{}
	for i := range 100 {
		m[fmt.Sprintf("k%03d", i)] = strings.Repeat(string(rune('a'+i%26)), 90)
	}
	m["profile"] = map[string]any{"name": "Ada", "tz": "UTC", "visits": 12}
	b, _ := json.Marshal(m)
	return b
}

// patch changes two keys and a nested one; the state keeps its size.
func patch(i int) []byte {
	return fmt.Appendf(nil, `{"k007":"%090d","profile":{"visits":%d},"status":%q}`, i, i, []string{"idle", "busy"}[i%2])
}

// refStore is the reference's durable write: one row of a SQLite table in
// WAL mode with synchronous=FULL, written in a BEGIN IMMEDIATE
// transaction, the settings the actor package uses.
type refStore struct{ db *sql.DB }

func openRef(b *testing.B, path string) *refStore {
	q := url.Values{}
	for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(FULL)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE state (id INTEGER PRIMARY KEY CHECK (id = 1), value BLOB NOT NULL, updated_at INTEGER NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return &refStore{db: db}
}

func (r *refStore) write(ctx context.Context, v []byte) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO state (id, value, updated_at) VALUES (1, ?, ?)
		ON CONFLICT (id) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`, v, time.Now().UnixNano()); err != nil {
		return err
	}
	return tx.Commit()
}

// BenchmarkSetState10KB applies a merge patch to a 10 KB state and stores
// it durably, alternately:
//
//   - agentkit: actor.Ref.SetState (json.RawMessage state): read the state
//     from the actor's database, merge (package mergepatch), write it back,
//     in one transaction.
//   - jsonpatch: evanphx/json-patch/v5 MergePatch on a state kept in
//     memory (no read), then the same durable write to a one-row table.
//
// ratio is agentkit's time over jsonpatch's.
func BenchmarkSetState10KB(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	h, err := actor.Open(actor.Options{Dir: filepath.Join(dir, "actors")})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	c, err := actor.Define(h, "bench", func() json.RawMessage { return state10KB() })
	if err != nil {
		b.Fatal(err)
	}
	a, err := c.Actor("a")
	if err != nil {
		b.Fatal(err)
	}
	if err := a.ReplaceStateJSON(ctx, state10KB()); err != nil {
		b.Fatal(err)
	}
	ref := openRef(b, filepath.Join(dir, "ref.db"))
	doc := state10KB()
	if err := ref.write(ctx, doc); err != nil {
		b.Fatal(err)
	}
	var tAK, tJP time.Duration
	i := 0
	for b.Loop() {
		i++
		p := patch(i)
		t0 := time.Now()
		if _, err := a.SetState(ctx, p); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		out, err := jsonpatch.MergePatch(doc, p)
		if err != nil {
			b.Fatal(err)
		}
		if err := ref.write(ctx, out); err != nil {
			b.Fatal(err)
		}
		doc = out
		tAK, tJP = tAK+t1.Sub(t0), tJP+time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tAK.Nanoseconds())/n, "ns/op-agentkit")
	b.ReportMetric(float64(tJP.Nanoseconds())/n, "ns/op-jsonpatch")
	b.ReportMetric(float64(tAK)/float64(tJP), "ratio")
}

// BenchmarkMerge10KB compares the merges alone, in memory, alternately.
func BenchmarkMerge10KB(b *testing.B) {
	doc := state10KB()
	var tAK, tJP time.Duration
	i := 0
	for b.Loop() {
		i++
		p := patch(i)
		t0 := time.Now()
		if _, err := mergepatchApply(doc, p); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := jsonpatch.MergePatch(doc, p); err != nil {
			b.Fatal(err)
		}
		tAK, tJP = tAK+t1.Sub(t0), tJP+time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tAK.Nanoseconds())/n, "ns/op-agentkit")
	b.ReportMetric(float64(tJP.Nanoseconds())/n, "ns/op-jsonpatch")
	b.ReportMetric(float64(tAK)/float64(tJP), "ratio")
}
