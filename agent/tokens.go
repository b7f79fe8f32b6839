package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"agentkit/agent/sessiondb"
	"agentkit/keys"
	"agentkit/kv"
	"agentkit/storage"
)

// tokenCacheMax bounds the continuation tokens kept in memory; past it the
// cache starts over.
const tokenCacheMax = 100_000

// tokenCache keeps the sessions of continuation tokens resolved on this
// host, by the tokens' digests, so a follow-up does not look its token up
// in the session database again. A session's token never changes; a session removed here is
// dropped (drop). It changes how fast a token resolves, never to what.
type tokenCache struct {
	mu      sync.Mutex
	byToken map[string]string
	byID    map[string]string
}

func newTokenCache() *tokenCache {
	return &tokenCache{byToken: map[string]string{}, byID: map[string]string{}}
}

func (c *tokenCache) get(digest string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.byToken[digest]
	return id, ok
}

func (c *tokenCache) put(digest, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byToken) >= tokenCacheMax {
		clear(c.byToken)
		clear(c.byID)
	}
	c.byToken[digest], c.byID[id] = id, digest
}

// drop forgets a session's token.
func (c *tokenCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if token, ok := c.byID[id]; ok {
		delete(c.byToken, token)
		delete(c.byID, id)
	}
}

// resolveToken returns the session a continuation token names, in every
// serving mode: from this host's memory, else its local database, else
// the store's continuation record. An unknown token is ErrUnknownToken
// (and so is every token on a store that cannot Get); a store failure or
// a continuation record no one can read is ErrStoreUnavailable; a local
// database failure is returned as it is. It does not check that the
// session still exists: the commit path does, when it takes the session.
func (r *Runtime) resolveToken(ctx context.Context, token string) (string, error) {
	if len(token) > maxTokenLen {
		return "", ErrUnknownToken
	}
	digest := keys.TokenDigest(token)
	if id, ok := r.tokens.get(digest); ok {
		return id, nil
	}
	id, err := r.db.SessionOfDigest(ctx, digest)
	if err == nil {
		r.tokens.put(digest, id)
		return id, nil
	}
	if !errors.Is(err, sessiondb.ErrNotFound) {
		return "", err
	}
	if !r.caps.Get {
		return "", ErrUnknownToken
	}
	id, err = r.agentStore.Sessions().ResolveToken(ctx, token)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return "", ErrUnknownToken
	case storage.IsRecordError(err):
		return "", fmt.Errorf("%w: the stored continuation record is unreadable: %w", ErrStoreUnavailable, err)
	case err != nil:
		return "", storeErr("resolving a continuation token", err)
	}
	r.tokens.put(digest, id)
	return id, nil
}

// issueToken gives a session another continuation token and returns it:
// its digest is written to the local database and, awaited, to the store,
// so that every host resolves it before anyone is given it. A keyed start
// answered again gets its token this way, because the first answer's
// token is stored only as a digest and cannot be given twice.
func (r *Runtime) issueToken(ctx context.Context, sessionID string) (string, error) {
	token := newToken()
	digest := keys.TokenDigest(token)
	if err := r.db.Write(ctx, func(tx *sessiondb.Tx) error { return tx.AddToken(digest, sessionID) }); err != nil {
		return "", fmt.Errorf("agent: recording a continuation token: %w", err)
	}
	if err := r.agentStore.Sessions().PutToken(ctx, digest, sessionID); err != nil {
		return "", storeErr("writing the continuation token", err)
	}
	r.tokens.put(digest, sessionID)
	return token, nil
}
