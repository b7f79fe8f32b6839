package sessiondb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

func openTest(t testing.TB) *DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "sessions.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

var t0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// fill creates a session with n events in one transaction.
func fill(t testing.TB, db *DB, id string, n int) {
	t.Helper()
	ctx := context.Background()
	if err := db.Put(ctx, Meta{ID: id, CreatedAt: t0, UpdatedAt: t0, Token: "tok-" + id}); err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{SessionID: id, Seq: int64(i + 1), At: t0.Add(time.Duration(i) * time.Second), Type: "e", Data: []byte(fmt.Sprintf(`{"n":%d}`, i+1))}
	}
	if err := db.Append(ctx, recs...); err != nil {
		t.Fatal(err)
	}
}

func TestPaging(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	fill(t, db, "a", 95)
	fill(t, db, "b", 7) // another session's events never show up
	var seen []int64
	after := int64(0)
	for {
		page, err := db.After(ctx, "a", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			if r.SessionID != "a" || string(r.Data) != fmt.Sprintf(`{"n":%d}`, r.Seq) || !r.At.Equal(t0.Add(time.Duration(r.Seq-1)*time.Second)) {
				t.Fatalf("record %+v", r)
			}
			seen = append(seen, r.Seq)
		}
		after = page[len(page)-1].Seq
	}
	if len(seen) != 95 {
		t.Fatalf("paged %d events, want 95", len(seen))
	}
	for i, s := range seen {
		if s != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, s)
		}
	}
	last, err := db.Last(ctx, "a", 20)
	if err != nil || len(last) != 20 || last[0].Seq != 76 || last[19].Seq != 95 {
		t.Errorf("Last(20): %d events from %d, %v", len(last), last[0].Seq, err)
	}
	if last, _ := db.Last(ctx, "b", 20); len(last) != 7 || last[6].Seq != 7 {
		t.Errorf("Last of a short session: %d", len(last))
	}
	if r, _ := db.Range(ctx, "a", 90, 92); len(r) != 3 || r[0].Seq != 90 {
		t.Errorf("Range %+v", r)
	}
	if r, _ := db.After(ctx, "missing", 0, 10); len(r) != 0 {
		t.Errorf("events of a missing session: %d", len(r))
	}
	if seq, err := db.AppendNext(ctx, "a", "e", t0, []byte(`{"n":96}`)); err != nil || seq != 96 {
		t.Errorf("AppendNext: %d %v", seq, err)
	}
	if seq, err := db.AppendNext(ctx, "fresh", "e", t0, []byte(`{}`)); err != nil || seq != 1 {
		t.Errorf("AppendNext on an empty session: %d %v", seq, err)
	}
	// A sequence number cannot be used twice.
	if err := db.Append(ctx, Record{SessionID: "a", Seq: 5, Data: []byte("{}")}); err == nil {
		t.Error("a duplicate seq was accepted")
	}
}

func TestSessionsAndTokens(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	for i := range 5 {
		m := Meta{ID: fmt.Sprintf("s%d", i), CreatedAt: t0, UpdatedAt: t0.Add(time.Duration(i%3) * time.Minute), Token: fmt.Sprintf("t%d", i)}
		if err := db.Put(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// Newest first, ties by id descending, paged with a cursor.
	var order []string
	var cur *Cursor
	for {
		page, err := db.List(ctx, 2, cur)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			order = append(order, m.ID)
		}
		l := page[len(page)-1]
		cur = &Cursor{UpdatedAt: l.UpdatedAt, ID: l.ID}
	}
	if fmt.Sprint(order) != "[s2 s4 s1 s3 s0]" {
		t.Errorf("order %v", order)
	}
	if id, err := db.SessionOfToken(ctx, "t3"); err != nil || id != "s3" {
		t.Errorf("token: %q %v", id, err)
	}
	if _, err := db.SessionOfToken(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown token: %v", err)
	}
	// Record updates the session's state but not its mirror fields.
	if err := db.SetMirrored(ctx, Meta{ID: "s1", MirroredSeq: 9, Batches: 2, IndexKey: "k", TokenMirrored: true}); err != nil {
		t.Fatal(err)
	}
	m, _ := db.Get(ctx, "s1")
	m.Turns, m.LastSeq, m.LastStatus, m.MirroredSeq = 3, 12, "completed", 0
	if err := db.Record(ctx, m, Record{SessionID: "s1", Seq: 12, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	got, _ := db.Get(ctx, "s1")
	if got.Turns != 3 || got.LastSeq != 12 || got.MirroredSeq != 9 || got.Batches != 2 || got.IndexKey != "k" || !got.TokenMirrored || got.Token != "t1" {
		t.Errorf("after Record %+v", got)
	}
	if ids, _ := db.Unmirrored(ctx); fmt.Sprint(ids) != "[s1]" {
		t.Errorf("unmirrored %v", ids)
	}
	if err := db.Record(ctx, Meta{ID: "ghost"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Record of a missing session: %v", err)
	}
	// Import never replaces a local session.
	if ok, err := db.Import(ctx, Meta{ID: "s1", Turns: 99}, nil); ok || err != nil {
		t.Errorf("Import over a local session: %v %v", ok, err)
	}
	if ok, err := db.Import(ctx, Meta{ID: "new", Token: "tn"}, []Record{{SessionID: "new", Seq: 1, Data: []byte("{}")}}); !ok || err != nil {
		t.Errorf("Import: %v %v", ok, err)
	}
	if id, _ := db.SessionOfToken(ctx, "tn"); id != "new" {
		t.Error("imported token not found")
	}
	if err := db.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Get(ctx, "s1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted: %v", err)
	}
	if r, _ := db.After(ctx, "s1", 0, 10); len(r) != 0 {
		t.Error("events survived the delete")
	}
	if _, err := db.SessionOfToken(ctx, "t1"); !errors.Is(err, ErrNotFound) {
		t.Error("token survived the delete")
	}
	if n, _ := db.Count(ctx); n != 5 {
		t.Errorf("count %d", n)
	}
}

// BenchmarkLast20 reads the last 20 events of a session holding 1,000
// events and of one holding 100,000, in a database that also holds another
// 100,000 events of other sessions, and reports the ratio of the two read
// times (ratio_100k_vs_1k, expected near 1) next to the per-read times.
// It also appends one event to each and reports that ratio.
//
//	go test -run '^$' -bench Last20 -benchtime 2000x ./agent/sessiondb/
func BenchmarkLast20(b *testing.B) {
	db := openTest(b)
	ctx := context.Background()
	fill(b, db, "small", 1000)
	fill(b, db, "large", 100000)
	for i := range 100 {
		fill(b, db, fmt.Sprintf("other-%03d", i), 1000)
	}
	measure := func(id string, n int) time.Duration {
		start := time.Now()
		for range n {
			recs, err := db.Last(ctx, id, 20)
			if err != nil || len(recs) != 20 {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	appendOne := func(id string, n int) time.Duration {
		start := time.Now()
		for range n {
			if _, err := db.AppendNext(ctx, id, "e", t0, []byte(`{"n":0}`)); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	measure("small", 100) // warm up
	measure("large", 100)
	b.ResetTimer()
	small := measure("small", b.N)
	large := measure("large", b.N)
	b.StopTimer()
	n := max(b.N/20, 10)
	appSmall := appendOne("small", n)
	appLarge := appendOne("large", n)
	b.ReportMetric(float64(small.Nanoseconds())/float64(b.N), "ns/last20_1k")
	b.ReportMetric(float64(large.Nanoseconds())/float64(b.N), "ns/last20_100k")
	b.ReportMetric(float64(large)/float64(small), "ratio_100k_vs_1k")
	b.ReportMetric(float64(appSmall.Nanoseconds())/float64(n), "ns/append_1k")
	b.ReportMetric(float64(appLarge.Nanoseconds())/float64(n), "ns/append_100k")
	b.ReportMetric(float64(appLarge)/float64(appSmall), "append_ratio_100k_vs_1k")
}
