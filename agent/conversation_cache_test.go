package agent

import (
	"strings"
	"testing"
	"time"

	"agentkit/model"
)

// conversationOf returns a conversation of one user message of n bytes.
func conversationOf(n int) *conversation {
	c := newConversation()
	c.add(model.Message{Role: model.RoleUser, Content: strings.Repeat("x", n)})
	return c
}

// cachedIDs returns the ids in the cache, most recently used first.
func cachedIDs(cc *conversationCache) []string {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	var ids []string
	for e := cc.lru.Front(); e != nil; e = e.Next() {
		ids = append(ids, e.Value.(*cached).id)
	}
	return ids
}

// TestConversationCacheKeepsItsSizeBound fills the cache past its bound:
// the least recently used conversations go first, the bytes it counts
// stay within the bound and match what it holds, and a conversation
// larger than the whole bound is not kept at all.
func TestConversationCacheKeepsItsSizeBound(t *testing.T) {
	one := conversationOf(1000).bytes
	cc := newConversationCache(3*one, time.Hour)
	t0 := time.Unix(0, 0)
	for i, id := range []string{"a", "b", "c"} {
		cc.take(id)
		cc.put(id, conversationOf(1000), t0.Add(time.Duration(i)*time.Second))
	}
	if got := strings.Join(cachedIDs(cc), ","); got != "c,b,a" {
		t.Fatalf("cached %s, want c,b,a", got)
	}
	// Using a makes b the least recently used one.
	cc.put("a", cc.take("a"), t0.Add(10*time.Second))
	cc.take("d")
	cc.put("d", conversationOf(1000), t0.Add(11*time.Second))
	if got := strings.Join(cachedIDs(cc), ","); got != "d,a,c" {
		t.Fatalf("after a fourth: cached %s, want d,a,c (b, least recently used, evicted)", got)
	}
	if cc.bytes != 3*one || cc.bytes > cc.maxBytes {
		t.Fatalf("cache counts %d bytes, holds 3 of %d, bound %d", cc.bytes, one, cc.maxBytes)
	}
	cc.take("huge")
	cc.put("huge", conversationOf(int(4*one)), t0.Add(12*time.Second))
	if got := strings.Join(cachedIDs(cc), ","); got != "d,a,c" {
		t.Fatalf("a conversation over the bound changed the cache: %s", got)
	}
	cc.drop("d")
	cc.drop("a")
	cc.drop("c")
	if cc.len() != 0 || cc.bytes != 0 {
		t.Fatalf("after dropping everything: %d cached, %d bytes counted", cc.len(), cc.bytes)
	}
}

// TestConversationCacheEvictsIdleSessions: sweep removes exactly the
// conversations unused for longer than the idle time.
func TestConversationCacheEvictsIdleSessions(t *testing.T) {
	cc := newConversationCache(1<<20, 10*time.Minute)
	t0 := time.Unix(0, 0)
	for i, id := range []string{"old", "mid", "new"} {
		cc.take(id)
		cc.put(id, conversationOf(10), t0.Add(time.Duration(i)*5*time.Minute))
	}
	cc.sweep(t0.Add(10 * time.Minute)) // old is exactly 10 minutes idle: kept
	if got := strings.Join(cachedIDs(cc), ","); got != "new,mid,old" {
		t.Fatalf("after a sweep at the idle time: %s, want all three", got)
	}
	cc.sweep(t0.Add(16 * time.Minute)) // old 16, mid 11 minutes idle
	if got := strings.Join(cachedIDs(cc), ","); got != "new" {
		t.Fatalf("after a sweep at 16 minutes: %s, want new", got)
	}
	if want := conversationOf(10).bytes; cc.bytes != want {
		t.Fatalf("cache counts %d bytes, want %d", cc.bytes, want)
	}
}

// TestADroppedConversationDoesNotComeBack: a delete (or an import of
// another host's events) during a turn drops the conversation the turn
// holds, and the turn's put at its end does not bring it back.
func TestADroppedConversationDoesNotComeBack(t *testing.T) {
	cc := newConversationCache(1<<20, time.Hour)
	c := cc.take("s")
	cc.drop("s")
	cc.put("s", conversationOf(10), time.Unix(0, 0))
	if c != nil || cc.len() != 0 {
		t.Fatalf("cached %d conversations after a drop during the turn, want 0", cc.len())
	}
	// The next turn caches again.
	cc.take("s")
	cc.put("s", conversationOf(10), time.Unix(1, 0))
	if cc.len() != 1 {
		t.Fatalf("the turn after the drop cached %d, want 1", cc.len())
	}
}
