package adkbench

import (
	"context"
	"database/sql"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/adk/v2/session"
	"google.golang.org/genai"

	"agentkit/agent"
	"agentkit/agent/stateroot"
	"agentkit/keys"
)

// smokeEvents is the session length of the smoke test; it loads the last
// lastN of them.
const smokeEvents = 30

// adkText is the text of an ADK event's content.
func adkText(t *testing.T, ev *session.Event) string {
	t.Helper()
	if ev.Content == nil || len(ev.Content.Parts) != 1 {
		t.Fatalf("ADK event %s has content %+v; want one text part", ev.ID, ev.Content)
	}
	return ev.Content.Parts[0].Text
}

// TestSameEvents checks, on each database, that both sides store and load
// the events the benchmarks use: a filled session's last lastN events
// come back in order with the texts written, identically on both sides;
// the append and turn paths the benchmarks time store what they should;
// and the fill's rows are what ADK's own AppendEvent writes.
func TestSameEvents(t *testing.T) {
	for _, c := range setups {
		db := c.db
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			want := texts(smokeEvents-lastN+1, smokeEvents)

			s := newADK(t, db, c.mode, t.TempDir())
			if err := s.fill(ctx, "filled", smokeEvents); err != nil {
				t.Fatal(err)
			}
			evs, err := s.lastEvents(ctx, "filled", lastN)
			if err != nil {
				t.Fatal(err)
			}
			var adkTexts []string
			for _, ev := range evs {
				adkTexts = append(adkTexts, adkText(t, ev))
			}

			a := newAK(t, db, t.TempDir())
			id, err := a.fill(ctx, smokeEvents)
			if err != nil {
				t.Fatal(err)
			}
			aevs, err := a.rt.LastEvents(ctx, id, lastN)
			if err != nil {
				t.Fatal(err)
			}
			var akTexts []string
			for i, ev := range aevs {
				akTexts = append(akTexts, eventText(ev))
				if wantSeq := int64(smokeEvents - lastN + 1 + i); ev.Seq != wantSeq || ev.SessionID != id {
					t.Errorf("agentkit event %d is seq %d of session %s; want seq %d of %s", i, ev.Seq, ev.SessionID, wantSeq, id)
				}
			}

			for side, got := range map[string][]string{"ADK": adkTexts, "agentkit": akTexts} {
				if !slices.Equal(got, want) {
					t.Errorf("%s loaded %d events %v...; want the %d texts %v...", side, len(got), firstText(got), len(want), firstText(want))
				}
			}

			checkADKAppend(t, s)
			checkADKFillMatchesAppend(t, s)
			checkAKAppend(t, db)
			checkAKTurn(t, a)
			checkADKTurn(t, s)
		})
	}
}

func firstText(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return shorten(s[0])
}

// checkADKAppend appends through BenchmarkAppend's path and reads it back.
func checkADKAppend(t *testing.T, s *adkStore) {
	ctx := t.Context()
	sess, err := s.create(ctx, uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	c0 := s.commits.total()
	for i := 1; i <= 3; i++ {
		if err := s.appendEvent(ctx, sess, "inv", text(i)); err != nil {
			t.Fatal(err)
		}
	}
	if s.commits != nil {
		if got := s.commits.total() - c0; got != 3 {
			t.Errorf("three ADK appends committed %d transactions on PostgreSQL; the counter expects one each", got)
		}
	}
	evs, err := s.lastEvents(ctx, sess.ID(), lastN)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, adkText(t, ev))
	}
	if !slices.Equal(got, texts(1, 3)) {
		t.Errorf("ADK appended 3 events and loaded %d: %v", len(got), got)
	}
}

// checkADKFillMatchesAppend writes the same events to two sessions, one
// through AppendEvent and one as the fill writes rows, and checks that
// ADK's Get returns them identically.
func checkADKFillMatchesAppend(t *testing.T, s *adkStore) {
	ctx := t.Context()
	base := time.Now().UTC().Add(-time.Minute)
	var events []*session.Event
	for i := range 3 {
		ev := adkEvent(ctx, "inv-x", adkBot, genai.RoleModel, text(100+i), base.Add(time.Duration(i)*time.Second))
		events = append(events, ev)
	}
	appended, err := s.create(ctx, "via-append")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		c := *ev
		if err := s.svc.AppendEvent(ctx, appended, &c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.create(ctx, "via-fill"); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		row, err := adkRow("via-fill", ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.gdb.Create(&row).Error; err != nil {
			t.Fatal(err)
		}
	}
	a, err := s.lastEvents(ctx, "via-append", 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.lastEvents(ctx, "via-fill", 0)
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jf, _ := json.Marshal(f)
	if len(a) != 3 || string(ja) != string(jf) {
		t.Errorf("ADK loads filled rows differently from appended ones:\nappended: %s\nfilled:   %s", ja, jf)
	}
}

// checkAKAppend appends through BenchmarkAppend's path and reads it back;
// on PostgreSQL it also finds each event on the server.
func checkAKAppend(t *testing.T, db string) {
	ctx := t.Context()
	l := newAKLog(t, db, t.TempDir())
	for i := 1; i <= 3; i++ {
		if err := l.append(ctx, text(i)); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := l.db.Last(ctx, l.meta.ID, lastN)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range recs {
		var ev agent.Event
		if err := json.Unmarshal(rec.Data, &ev); err != nil {
			t.Fatal(err)
		}
		got = append(got, eventText(ev))
	}
	if !slices.Equal(got, texts(1, 3)) {
		t.Errorf("agentkit appended 3 events and loaded %d: %v", len(got), got)
	}
	m, err := l.db.Get(ctx, l.meta.ID)
	if err != nil || m.LastSeq != 3 {
		t.Errorf("agentkit session row after 3 appends: LastSeq %d, %v; want 3", m.LastSeq, err)
	}
	if db != "postgres" {
		if l.store != nil {
			t.Errorf("the SQLite append writes through to a store")
		}
		return
	}
	for seq := uint64(1); seq <= 3; seq++ {
		key, err := l.scope.EventBatch(l.meta.ID, seq)
		if err != nil {
			t.Fatal(err)
		}
		data, err := l.store.Get(ctx, key)
		if err != nil {
			t.Fatalf("event %d is not on the PostgreSQL server after its append: %v", seq, err)
		}
		var b akBatch
		if err := json.Unmarshal(data, &b); err != nil || len(b.Events) != 1 {
			t.Fatalf("the stored batch of event %d does not hold it: %s (%v)", seq, shorten(string(data)), err)
		}
		var ev agent.Event
		if err := json.Unmarshal(b.Events[0], &ev); err != nil || eventText(ev) != text(int(seq)) {
			t.Errorf("the stored event %d carries %q (%v); want %q", seq, shorten(eventText(ev)), err, shorten(text(int(seq))))
		}
	}
}

// checkAKTurn runs two turns through BenchmarkTurn's path and checks the
// six events and the mirror in the store.
func checkAKTurn(t *testing.T, a *akRuntime) {
	ctx := t.Context()
	res, err := a.rt.StartSession(ctx, agent.StartRequest{Message: text(1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.rt.Continue(ctx, agent.ContinueRequest{Token: res.ContinuationToken, Message: text(2)}); err != nil {
		t.Fatal(err)
	}
	evs, err := a.rt.LastEvents(ctx, res.SessionID, lastN)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range evs {
		got = append(got, eventText(ev))
	}
	want := []string{text(1), echoPrefix + text(1), echoPrefix + text(1), text(2), echoPrefix + text(2), echoPrefix + text(2)}
	if !slices.Equal(got, want) {
		t.Errorf("agentkit turns recorded %d events %q; want %q", len(got), got, want)
	}
	// The mirror wrote the session to the store the runtime was given: for
	// db=postgres, read it from the PostgreSQL store directly.
	store := a.rt.Store()
	if a.store != nil {
		store = a.store
	}
	scope, err := keys.Agent(akAgent)
	if err != nil {
		t.Fatal(err)
	}
	key, err := scope.SessionMeta(res.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := store.Get(ctx, key)
	if err != nil {
		t.Fatalf("the session's metadata is not in the store after two turns: %v", err)
	}
	var m struct {
		LastSeq int64 `json:"lastSeq"`
	}
	if err := json.Unmarshal(meta, &m); err != nil || m.LastSeq != 6 {
		t.Errorf("the store's session metadata has lastSeq %d (%v); want 6", m.LastSeq, err)
	}
	if n := a.rt.Info().MirrorDropped; n != 0 {
		t.Errorf("%d mirror writes were dropped", n)
	}
}

// checkADKTurn runs two turns through BenchmarkTurn's path, ADK's runner,
// and checks their answers and the four events they stored.
func checkADKTurn(t *testing.T, s *adkStore) {
	ctx := t.Context()
	r, err := newADKRunner(s)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := s.create(ctx, uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	c0 := s.commits.total()
	for i := 1; i <= 2; i++ {
		answer, err := r.turn(ctx, sess.ID(), text(i))
		if err != nil {
			t.Fatal(err)
		}
		if answer != echoPrefix+text(i) {
			t.Errorf("ADK's turn %d answered %q; want the echo of its message", i, shorten(answer))
		}
	}
	if s.commits != nil {
		if got := s.commits.total() - c0; got != 4 {
			t.Errorf("two ADK turns committed %d transactions on PostgreSQL; want 4 (two AppendEvents each)", got)
		}
	}
	resp, err := s.svc.Get(ctx, &session.GetRequest{AppName: adkApp, UserID: adkUser, SessionID: sess.ID()})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{text(1), echoPrefix + text(1), text(2), echoPrefix + text(2)}
	if got := adkEventsOf(resp.Session); !slices.Equal(got, want) {
		t.Errorf("ADK's turns stored %d events %q; want %d: each message and its echo", len(got), got, len(want))
	}
}

// TestDurabilitySettings checks the SQLite settings README states: ADK's
// file in WAL mode with synchronous=FULL (adk=wal) and in rollback-journal
// mode (DELETE) with synchronous=FULL (adk=default); agentkit's session
// database in WAL mode. It logs PostgreSQL's.
func TestDurabilitySettings(t *testing.T) {
	ctx := t.Context()
	for mode, want := range map[string]string{adkWAL: "wal", adkDefault: "delete"} {
		s := newADK(t, "sqlite", mode, t.TempDir())
		journal, syncMode, err := s.pragmas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if journal != want || syncMode != 2 {
			t.Errorf("ADK's SQLite connection (adk=%s) has journal_mode=%s synchronous=%d; README says %s and 2 (FULL)", mode, journal, syncMode, want)
		}
	}

	a := newAK(t, "sqlite", t.TempDir())
	if _, err := a.fill(ctx, 3); err != nil {
		t.Fatal(err)
	}
	mode, err := journalMode(ctx, filepath.Join(a.root, stateroot.SessionsDir, sessionsFile))
	if err != nil {
		t.Fatal(err)
	}
	if mode != "wal" {
		t.Errorf("agentkit's session database has journal_mode=%s; README says wal", mode)
	}

	if testing.Short() {
		return
	}
	srv := pgServer(t)
	for _, name := range []string{"fsync", "synchronous_commit", "wal_sync_method"} {
		var v string
		if err := pgShow(ctx, srv, name, &v); err != nil {
			t.Fatal(err)
		}
		t.Logf("PostgreSQL %s = %s", name, v)
	}
}

// journalMode opens a SQLite file read-only and returns its journal mode
// (WAL is recorded in the file).
func journalMode(ctx context.Context, path string) (string, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return "", err
	}
	defer db.Close()
	var mode string
	err = db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode)
	return strings.ToLower(mode), err
}

// pgShow reads one server setting.
func pgShow(ctx context.Context, serverURL, name string, v *string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, "SHOW "+name).Scan(v)
}
