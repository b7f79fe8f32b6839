package agent

import (
	"context"
	"errors"
	"sync"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
)

// memPath is a test double of commitPath: sessions live in the local
// database only, every turn is committed by one write of its events
// there, and each commit is also kept in memory (commits), so a test can
// see what the turn handed its path. It shows what a commit path must do
// for the turn suite to pass, and nothing more.
type memPath struct {
	r  *Runtime
	mu sync.Mutex
	// commits holds, per session, the events of each committed turn.
	commits map[string][][]sessiondb.Record
	// checks counts the turns' checks; from the fenceAt-th on (when
	// fenceAt > 0) check fails with errFenced. commitErr, when set, is
	// every commit's answer.
	checks    int
	fenceAt   int
	commitErr error
}

// errFenced is the double's fence.
var errFenced = errors.New("memPath: fenced")

func (p *memPath) submit(ctx context.Context, req turnRequest) (TurnResult, error) {
	r := p.r
	mc := &memCommit{p: p, id: req.sessionID}
	if req.start != nil {
		now := r.now().UTC()
		req.token = newToken()
		mc.created = &sessiondb.Meta{ID: newID(), ChannelID: req.start.ChannelID, Title: req.start.Title, CreatedAt: now, UpdatedAt: now, TokenDigest: keys.TokenDigest(req.token)}
		mc.id = mc.created.ID
	} else if _, err := p.session(ctx, req.sessionID); err != nil {
		return TurnResult{}, err
	}
	idem, res, replayed, release, err := r.keyed(ctx, req.route(), req.key, req.hash, req.sessionID, req.token, req.onEvent)
	if err != nil || replayed {
		return res, err
	}
	defer release()
	_, unlock, err := r.lockSession(ctx, mc.id)
	if err != nil {
		return TurnResult{}, err
	}
	defer unlock()
	res, err = r.runTurn(ctx, mc, turnInput{message: req.message, files: req.files, source: req.source, onEvent: req.onEvent, idem: idem})
	res.ContinuationToken = req.token
	return res, err
}

func (p *memPath) session(ctx context.Context, id string) (sessiondb.Meta, error) {
	m, err := p.r.db.Get(ctx, id)
	if errors.Is(err, sessiondb.ErrNotFound) {
		return m, ErrSessionNotFound
	}
	return m, err
}

func (p *memPath) list(ctx context.Context, limit int, c *cursor) (SessionPage, error) {
	return p.r.listLocal(ctx, limit, c)
}

func (p *memPath) remove(ctx context.Context, id string) error {
	_, unlock, err := p.r.lockSession(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	return p.r.removeLocal(ctx, id)
}

func (p *memPath) follow(string) func()                   { return func() {} }
func (p *memPath) unfollow(string)                        {}
func (p *memPath) start(context.Context)                  {}
func (p *memPath) drain()                                 {}
func (p *memPath) stop()                                  {}
func (p *memPath) close()                                 {}
func (p *memPath) stats() (failed int64, b int, f int64)  { return 0, 0, 0 }
func (p *memPath) flushOwed(context.Context) (int, error) { return 0, nil }

// memCommit is a turn's hold on memPath.
type memCommit struct {
	p       *memPath
	id      string
	created *sessiondb.Meta
}

func (mc *memCommit) begin(ctx context.Context) (sessiondb.Meta, error) {
	if mc.created != nil {
		return *mc.created, nil
	}
	return mc.p.session(ctx, mc.id)
}

func (mc *memCommit) check() error {
	p := mc.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.checks++
	if p.fenceAt > 0 && p.checks >= p.fenceAt {
		return errFenced
	}
	return nil
}

func (mc *memCommit) flush(t *turn) error {
	if err := t.writeLocal(mc.created, nil); err != nil {
		return err
	}
	mc.created = nil
	return nil
}

func (mc *memCommit) commit(ctx context.Context, t *turn) error {
	if err := mc.p.commitErr; err != nil {
		return err
	}
	recs := append([]sessiondb.Record(nil), t.recs...)
	if err := mc.flush(t); err != nil {
		return err
	}
	mc.p.mu.Lock()
	defer mc.p.mu.Unlock()
	mc.p.commits[mc.id] = append(mc.p.commits[mc.id], recs)
	return nil
}
