package turnbench

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"agentkit/agent"
	"agentkit/agent/sessiondb"
	"agentkit/bench/pair"
	"agentkit/model"
)

// Session lengths of BenchmarkSessionLength, in whole echo turns of three
// events: 334 turns are 1,002 events, 33,334 turns 100,002 events.
const (
	shortTurns = 334
	longTurns  = 33_334
	// shortSessions is how many short sessions the benchmark cycles
	// through, so that each grows by few turns over a run (a turn adds
	// three events) and stays about 1,000 events long.
	shortSessions = 32
)

// lengths is a runtime on the embedded default store holding one long
// session and several short ones.
type lengths struct {
	rt    *agent.Runtime
	long  sessiondb.Meta
	short []sessiondb.Meta
}

// openLengths opens a runtime on a state root in dir and fills its
// session database with one session of long turns and count sessions of
// short turns (fillSession, through a second handle on the same file).
func openLengths(ctx context.Context, dir string, long, short, count int) (*lengths, error) {
	rt, err := openRuntime(ctx, dir+"/state", nil, nil)
	if err != nil {
		return nil, err
	}
	l := &lengths{rt: rt}
	db, err := sessiondb.Open(ctx, sessionsPath(rt.StateRoot()))
	if err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	defer db.Close()
	if l.long, err = fillSession(ctx, db, "long", long); err != nil {
		return nil, errors.Join(err, rt.Close())
	}
	for i := range count {
		m, err := fillSession(ctx, db, fmt.Sprintf("short-%02d", i), short)
		if err != nil {
			return nil, errors.Join(err, rt.Close())
		}
		l.short = append(l.short, m)
	}
	return l, nil
}

// turn runs one turn in session m with message number i, and checks that
// it completed with the echo model's answer.
func (l *lengths) turn(ctx context.Context, m sessiondb.Meta, i int) (agent.TurnResult, error) {
	msg := text(1_000_000 + i)
	res, err := l.rt.Continue(ctx, agent.ContinueRequest{Token: benchToken(m.ID), Message: msg})
	if err != nil {
		return res, err
	}
	if res.SessionID != m.ID || res.Turn.Status != agent.StatusCompleted || res.Turn.Result != echoPrefix+msg {
		return res, fmt.Errorf("the turn in session %s ended %s in session %s: %.40q", m.ID, res.Turn.Status, res.SessionID, res.Turn.Result)
	}
	return res, nil
}

// ops returns the two sides: a turn in the next short session, and a turn
// in the long one.
func (l *lengths) ops(ctx context.Context, shortName, longName string) []pair.Op {
	return []pair.Op{
		{Name: shortName, Run: func(i int) error {
			_, err := l.turn(ctx, l.short[i%len(l.short)], i)
			return err
		}},
		{Name: longName, Run: func(i int) error {
			_, err := l.turn(ctx, l.long, i)
			return err
		}},
	}
}

// modelOps are the floor of BenchmarkSessionLength: the echo model alone,
// answering a conversation as long as the short sessions' and one as long
// as the long session's (the turns' own requests: a user message and an
// answer per filled turn). A turn hands the model the whole conversation,
// and this model reads all of it (it counts the request's tokens), so
// its time grows with the session whatever the runtime does.
func modelOps(ctx context.Context, shortTurns, longTurns int) ([]pair.Op, error) {
	echo, err := model.NewEcho(nil)
	if err != nil {
		return nil, err
	}
	conversation := func(turns int) []model.Message {
		msgs := make([]model.Message, 0, 2*turns+1)
		for i := 1; i <= turns; i++ {
			msgs = append(msgs, model.Message{Role: model.RoleUser, Content: text(i)}, model.Message{Role: model.RoleAssistant, Content: echoPrefix + text(i)})
		}
		return append(msgs, model.Message{Role: model.RoleUser, Content: text(0)})
	}
	side := func(name string, msgs []model.Message) pair.Op {
		return pair.Op{Name: name, Run: func(int) error {
			res, err := echo.Generate(ctx, model.Request{Messages: msgs})
			if err == nil && res.Message.Content != echoPrefix+text(0) {
				err = fmt.Errorf("the echo model answered %.40q", res.Message.Content)
			}
			return err
		}}
	}
	return []pair.Op{side("model-1k", conversation(shortTurns)), side("model-100k", conversation(longTurns))}, nil
}

// BenchmarkSessionLength alternates a full turn (Runtime.Continue, echo
// model, memory journal off, the embedded default store) in a session of
// 1,002 events with one in a session of 100,002 events, and reports
// 100k/1k (the target: at most 1.2). Beside them it times the echo
// model alone on conversations of the two lengths (modelOps: the floor,
// model-100k/model-1k) and reports 100k/1k-without-model, the growth of
// the turn's time less the model's. The short turns cycle through
// 32 sessions, so each stays near 1,000 events. Both sessions live in one
// session database, filled once per process through the runtime's own
// storage layer (about 50 MB of events).
func BenchmarkSessionLength(b *testing.B) {
	l := shared(b, "lengths", func(ctx context.Context, dir string) (*lengths, func(context.Context) error, error) {
		l, err := openLengths(ctx, dir, longTurns, shortTurns, shortSessions)
		if err != nil {
			return nil, nil, err
		}
		return l, func(context.Context) error { return l.rt.Close() }, nil
	})
	floor, err := modelOps(b.Context(), shortTurns, longTurns)
	if err != nil {
		b.Fatal(err)
	}
	t := pair.Loop(b, append(l.ops(b.Context(), "1k", "100k"), floor...),
		pair.Ratio{Num: "100k", Den: "1k"},
		pair.Ratio{Num: "model-100k", Den: "model-1k"})
	// The runtime's own part of a turn: the turn's time less the model's.
	if own := t.Mean("1k") - t.Mean("model-1k"); own > 0 {
		b.ReportMetric(float64(t.Mean("100k")-t.Mean("model-100k"))/float64(own), "100k/1k-without-model")
	}
}

// TestSessionLengthTurnsSeeTheWholeSession runs BenchmarkSessionLength's
// sides on small sessions and checks that each turn answered in its own
// session with the whole history in the model's request (the echo model
// counts the request's tokens), so the benchmark measures a turn over the
// session's full length.
func TestSessionLengthTurnsSeeTheWholeSession(t *testing.T) {
	ctx := t.Context()
	const long, short = 60, 6
	l, err := openLengths(ctx, t.TempDir(), long, short, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.rt.Close()
	for i, op := range l.ops(ctx, "short", "long") {
		if err := op.Run(i); err != nil {
			t.Fatalf("%s: %v", op.Name, err)
		}
	}
	// Each filled turn is a user message and an answer of about 50 tokens
	// each (textSize/4): the request of a turn after n turns carries at
	// least 100·n tokens.
	res, err := l.turn(ctx, l.long, 99)
	if err != nil {
		t.Fatal(err)
	}
	if got, min := res.Turn.Usage.InputTokens, int64(100*(long+1)); got < min {
		t.Errorf("a turn after %d turns sent %d input tokens; want at least %d (the whole history)", long+1, got, min)
	}
	res, err = l.turn(ctx, l.short[1], 99)
	if err != nil {
		t.Fatal(err)
	}
	if got, max := res.Turn.Usage.InputTokens, int64(100*(long+1)); got >= max {
		t.Errorf("a turn in a short session sent %d input tokens, as many as the long one's; the sessions are mixed up", got)
	}
	got, err := l.rt.GetSession(ctx, l.long.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(3 * (long + 2)); got.LastSeq != want || got.Turns != long+2 {
		t.Errorf("the long session has %d events in %d turns; want %d in %d", got.LastSeq, got.Turns, want, long+2)
	}
}
