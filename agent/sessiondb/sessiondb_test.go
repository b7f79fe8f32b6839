package sessiondb

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentkit/keys"
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
	if err := db.Put(ctx, Meta{ID: id, CreatedAt: t0, UpdatedAt: t0, TokenDigest: keys.TokenDigest("tok-" + id)}); err != nil {
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
		m := Meta{ID: fmt.Sprintf("s%d", i), CreatedAt: t0, UpdatedAt: t0.Add(time.Duration(i%3) * time.Minute), TokenDigest: keys.TokenDigest(fmt.Sprintf("t%d", i))}
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
	if id, err := db.SessionOfDigest(ctx, keys.TokenDigest("t3")); err != nil || id != "s3" {
		t.Errorf("token: %q %v", id, err)
	}
	if _, err := db.SessionOfDigest(ctx, keys.TokenDigest("nope")); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown token: %v", err)
	}
	// Record updates the session's state but not its mirror fields.
	if err := db.SetMirror(ctx, "s1", MirrorState{MirroredSeq: 9, Batch: 2, BatchID: "b2", IndexKey: "k", TokenMirrored: true, MetaSeq: 9}); err != nil {
		t.Fatal(err)
	}
	m, _ := db.Get(ctx, "s1")
	m.Turns, m.LastSeq, m.LastStatus, m.MirroredSeq = 3, 12, "completed", 0
	if err := db.Record(ctx, m, Record{SessionID: "s1", Seq: 12, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	got, _ := db.Get(ctx, "s1")
	if got.Turns != 3 || got.LastSeq != 12 || got.MirroredSeq != 9 || got.Batches != 2 || got.IndexKey != "k" || !got.TokenMirrored || got.TokenDigest != keys.TokenDigest("t1") {
		t.Errorf("after Record %+v", got)
	}
	if _, st, err := db.Mirror(ctx, "s1"); err != nil || st.BatchID != "b2" || st.MetaSeq != 9 || !st.Owes(12) || st.Owes(9) {
		t.Errorf("mirror state %+v %v", st, err)
	}
	if ids, _ := db.Backlog(ctx); !slices.Contains(ids, "s1") {
		t.Errorf("backlog %v lacks s1", ids)
	}
	if err := db.Record(ctx, Meta{ID: "ghost"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Record of a missing session: %v", err)
	}
	// Import never replaces a local session.
	if ok, err := db.ImportMirrored(ctx, Meta{ID: "s1", Turns: 99}, nil, MirrorState{}); ok || err != nil {
		t.Errorf("Import over a local session: %v %v", ok, err)
	}
	if ok, err := db.ImportMirrored(ctx, Meta{ID: "new", TokenDigest: keys.TokenDigest("tn"), LastSeq: 1}, []Record{{SessionID: "new", Seq: 1, Data: []byte("{}")}}, MirrorState{MirroredSeq: 1, Batch: 1, BatchID: "x", MetaSeq: 1, TokenMirrored: true}); !ok || err != nil {
		t.Errorf("Import: %v %v", ok, err)
	}
	if _, st, _ := db.Mirror(ctx, "new"); st.BatchID != "x" || st.Owes(1) {
		t.Errorf("imported mirror state %+v", st)
	}
	if id, _ := db.SessionOfDigest(ctx, keys.TokenDigest("tn")); id != "new" {
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
	if _, err := db.SessionOfDigest(ctx, keys.TokenDigest("t1")); !errors.Is(err, ErrNotFound) {
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

func TestAdoptForksOnlyWhatDiffers(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Unix(1700000000, 0).UTC()
	rec := func(seq int64, by string) Record {
		return Record{SessionID: "s", Seq: seq, At: t0, Type: "e", Data: []byte(fmt.Sprintf(`{"seq":%d,"by":%q}`, seq, by))}
	}
	if err := db.Put(ctx, Meta{ID: "s", TokenDigest: keys.TokenDigest("t"), CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	for i := int64(1); i <= 5; i++ {
		if err := db.Record(ctx, Meta{ID: "s", LastSeq: i, UpdatedAt: t0}, rec(i, "local")); err != nil {
			t.Fatal(err)
		}
	}
	// The store has events 4 and 5 as this host wrote them (its own
	// commit, whose answer was lost) and 6 from another host: nothing is
	// forked.
	st := MirrorState{MirroredSeq: 6, Batch: 3, BatchID: "b3", MetaSeq: 6, TokenMirrored: true}
	n, err := db.Adopt(ctx, Meta{ID: "s", LastSeq: 6, Turns: 2, UpdatedAt: t0}, []Record{rec(4, "local"), rec(5, "local"), rec(6, "other")}, st, "B", t0)
	if err != nil || n != 0 {
		t.Fatalf("Adopt of the same events: %d forked, %v", n, err)
	}
	// Two more local events, then the store's 7 and 8 come from another
	// host: 7 and 8 are forked and replaced.
	for i := int64(7); i <= 8; i++ {
		if err := db.Record(ctx, Meta{ID: "s", LastSeq: i, UpdatedAt: t0}, rec(i, "local")); err != nil {
			t.Fatal(err)
		}
	}
	st = MirrorState{MirroredSeq: 9, Batch: 5, BatchID: "b5", MetaSeq: 9, TokenMirrored: true}
	n, err = db.Adopt(ctx, Meta{ID: "s", LastSeq: 9, Turns: 3, UpdatedAt: t0}, []Record{rec(7, "other"), rec(8, "other"), rec(9, "other")}, st, "B", t0)
	if err != nil || n != 2 {
		t.Fatalf("Adopt over a fork: %d forked, %v", n, err)
	}
	got, _ := db.After(ctx, "s", 0, 100)
	var by []string
	for _, r := range got {
		by = append(by, string(r.Data))
	}
	if len(got) != 9 || !strings.Contains(by[5], `"other"`) || !strings.Contains(by[6], `"other"`) || !strings.Contains(by[3], `"local"`) {
		t.Errorf("events after the fork %q", by)
	}
	forks, err := db.Forked(ctx, "s")
	if err != nil || len(forks) != 2 || forks[0].Seq != 7 || forks[0].LostTo != "B" || !strings.Contains(string(forks[1].Data), `"local"`) {
		t.Errorf("forked events %+v %v", forks, err)
	}
	m, ms, _ := db.Mirror(ctx, "s")
	if m.LastSeq != 9 || m.Turns != 3 || ms.BatchID != "b5" || ms.Owes(9) {
		t.Errorf("after Adopt: %+v %+v", m, ms)
	}
	if err := db.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if forks, _ := db.Forked(ctx, "s"); len(forks) != 0 {
		t.Error("forked events survived the session's delete")
	}
}
