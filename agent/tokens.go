package agent

import "sync"

// tokenCacheMax bounds the continuation tokens kept in memory; past it the
// cache starts over.
const tokenCacheMax = 100_000

// tokenCache keeps the sessions of continuation tokens resolved on this
// host, so a follow-up does not look its token up in the session database
// again. A session's token never changes; a session removed here is
// dropped (drop). It changes how fast a token resolves, never to what.
type tokenCache struct {
	mu      sync.Mutex
	byToken map[string]string
	byID    map[string]string
}

func newTokenCache() *tokenCache {
	return &tokenCache{byToken: map[string]string{}, byID: map[string]string{}}
}

func (c *tokenCache) get(token string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.byToken[token]
	return id, ok
}

func (c *tokenCache) put(token, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byToken) >= tokenCacheMax {
		clear(c.byToken)
		clear(c.byID)
	}
	c.byToken[token], c.byID[id] = id, token
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
