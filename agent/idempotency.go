package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"agentkit/agent/sessiondb"
)

// Idempotency-Key errors, matched with errors.Is. The HTTP server maps
// ErrKeyInUse to 409 and ErrKeyReused to 422.
var (
	// ErrKeyInUse means another request with the same Idempotency-Key is
	// running on this host. Retry once it has answered: the retry gets
	// its answer.
	ErrKeyInUse = errors.New("agent: idempotency key in use")
	// ErrKeyReused means the Idempotency-Key was first sent with another
	// request (another message, files, title or session).
	ErrKeyReused = errors.New("agent: idempotency key reused for another request")
)

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted.
const MaxIdempotencyKeyLen = 255

// Routes an Idempotency-Key is scoped to: a key names one request on one
// route.
const (
	keyRouteStart    = "start"
	keyRouteContinue = "continue"
)

// Idempotency is the Idempotency-Key a client sent with a turn, recorded
// in the turn's turn.started event so that it travels with the session's
// events. Hash is a SHA-256 of the request's fields, to tell a retry from
// another request that reuses the key.
type Idempotency struct {
	Route string `json:"route"`
	Key   string `json:"key"`
	Hash  string `json:"hash"`
}

// checkKey validates an Idempotency-Key: none, or 1 to
// MaxIdempotencyKeyLen printable ASCII characters (a UUID is the usual
// choice).
func checkKey(key string, given bool) error {
	if !given {
		return nil
	}
	if len(key) > MaxIdempotencyKeyLen {
		return invalid("Idempotency-Key", "it is %d bytes, over the %d-byte limit; use a random UUID", len(key), MaxIdempotencyKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return invalid("Idempotency-Key", "it holds a control or non-ASCII byte; use printable ASCII, such as a random UUID")
		}
	}
	if strings.TrimSpace(key) == "" {
		return invalid("Idempotency-Key", "it is empty; send a random UUID, or no header")
	}
	return nil
}

// requestHash is the SHA-256, in hex, of a request's fields as JSON.
func requestHash(fields any) string {
	b, _ := json.Marshal(fields) // maps are encoded in key order
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// keyClaims are the Idempotency-Keys of requests running in this process.
type keyClaims struct {
	mu   sync.Mutex
	held map[[2]string]bool
}

// claim holds route's key until release is called, or fails with
// ErrKeyInUse.
func (c *keyClaims) claim(route, key string) (release func(), err error) {
	k := [2]string{route, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[k] {
		return nil, fmt.Errorf("%w: a request with Idempotency-Key %q is running; retry when it has answered", ErrKeyInUse, key)
	}
	if c.held == nil {
		c.held = map[[2]string]bool{}
	}
	c.held[k] = true
	return func() {
		c.mu.Lock()
		delete(c.held, k)
		c.mu.Unlock()
	}, nil
}

// keyed handles a request's Idempotency-Key before its turn runs. Without
// a key it does nothing. With one it claims the key in this process
// (ErrKeyInUse when a request holding it runs) and looks it up: for a key
// seen before it returns the first turn's answer, replayed true, after
// passing that turn's events to onEvent; a key seen with another request
// is ErrKeyReused. Otherwise it returns the Idempotency to record with the
// new turn. release frees the claim once the turn has answered.
//
// sessionID is the session a follow-up continues and token its
// continuation token ("" for a new session: a replayed start is answered
// with a new token for the session, as only the first token's digest is
// stored).
func (r *Runtime) keyed(ctx context.Context, route, key, hash, sessionID, token string, onEvent func(Event)) (idem *Idempotency, res TurnResult, replayed bool, release func(), err error) {
	release = func() {}
	if key == "" {
		return nil, TurnResult{}, false, release, nil
	}
	if release, err = r.claims.claim(route, key); err != nil {
		return nil, TurnResult{}, false, func() {}, err
	}
	kt, err := r.db.KeyedTurn(ctx, route, key)
	switch {
	case errors.Is(err, sessiondb.ErrNotFound):
		return &Idempotency{Route: route, Key: key, Hash: hash}, TurnResult{}, false, release, nil
	case err != nil:
		release()
		return nil, TurnResult{}, false, func() {}, err
	case sessionID != "" && kt.SessionID != sessionID:
		release()
		return nil, TurnResult{}, false, func() {}, fmt.Errorf("%w: Idempotency-Key %q was first sent to continue another session; use a new key for a new request", ErrKeyReused, key)
	case kt.Hash != hash:
		release()
		return nil, TurnResult{}, false, func() {}, fmt.Errorf("%w: Idempotency-Key %q was first sent with another request (another message, files or title); use a new key for a new request", ErrKeyReused, key)
	}
	res, err = r.replayTurn(ctx, kt, token, onEvent)
	release()
	if err != nil {
		return nil, TurnResult{}, false, func() {}, err
	}
	return nil, res, true, func() {}, nil
}

// interruptedResult is the result replayed for a keyed turn that started
// but never finished: the process running it stopped (a crash, a kill)
// before its turn.finished event.
const interruptedResult = "the turn this Idempotency-Key started was interrupted before it finished (the server stopped); its events up to then are in the session's log. Send the message again with a new Idempotency-Key to run it again"

// replayTurn rebuilds the answer of the turn whose turn.started event is
// kt.Seq, passing its events to onEvent. The answer carries token, or a
// new token of the session when token is "".
func (r *Runtime) replayTurn(ctx context.Context, kt sessiondb.KeyedTurn, token string, onEvent func(Event)) (TurnResult, error) {
	m, err := r.db.Get(ctx, kt.SessionID)
	if err != nil {
		return TurnResult{}, err
	}
	if token == "" {
		if token, err = r.issueToken(ctx, m.ID); err != nil {
			return TurnResult{}, err
		}
	}
	res := TurnResult{SessionID: m.ID, ContinuationToken: token, Replayed: true}
	res.Turn = Turn{Status: StatusFailed, Result: interruptedResult}
	after, number := kt.Seq-1, int64(0)
	for {
		recs, err := r.db.After(ctx, kt.SessionID, after, MaxPageSize)
		if err != nil {
			return TurnResult{}, err
		}
		for _, rec := range recs {
			ev, err := decodeEvent(rec)
			if err != nil {
				return TurnResult{}, err
			}
			if number == 0 {
				number = ev.Turn
			}
			if ev.Turn != number {
				return res, nil
			}
			if onEvent != nil {
				onEvent(ev)
			}
			if ev.Type == EventTurnFinished {
				res.Turn = Turn{Status: ev.Status, Result: ev.Result}
				res.LastSeq = ev.Seq
				if ev.Usage != nil {
					res.Turn.Usage = *ev.Usage
				}
				return res, nil
			}
			after = rec.Seq
		}
		if len(recs) < MaxPageSize {
			return res, nil
		}
	}
}

// startHash and continueHash are the request hashes of the two routes.
func startHash(req StartRequest, channel string) string {
	return requestHash(struct {
		Message   string            `json:"message"`
		ChannelID string            `json:"channelId"`
		Title     string            `json:"title"`
		Files     map[string]string `json:"workspaceFiles"`
	}{req.Message, channel, req.Title, req.WorkspaceFiles})
}

func continueHash(req ContinueRequest) string {
	return requestHash(struct {
		Message string            `json:"message"`
		Files   map[string]string `json:"workspaceFiles"`
	}{req.Message, req.WorkspaceFiles})
}

// noWaitContext returns a context that is already done, for a lockSession
// that must not wait: lockSession takes a free session at once and
// answers ErrBusy for a busy one.
func noWaitContext(ctx context.Context) context.Context {
	c, cancel := context.WithCancel(ctx)
	cancel()
	return c
}
