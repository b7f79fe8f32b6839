package agent

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"agentkit/model"
)

// Bounds of the conversation cache.
const (
	// conversationCacheBytes bounds the cached conversations' size (their
	// texts and tool arguments, plus a fixed cost per message); the least
	// recently used go first.
	conversationCacheBytes = 256 << 20
	// conversationIdle is how long a session's conversation stays cached
	// after its last turn.
	conversationIdle = 10 * time.Minute
	// messageOverhead is what one message counts for beyond its texts.
	messageOverhead = 128
)

// conversation is a session's model conversation: the fold of its events
// that a turn sends the model as history (foldEvent says how each event
// contributes). A turn extends it with the events it records instead of
// rebuilding it, so a turn's cost does not grow with the session.
//
// buf[0] is kept for the system prompt and the messages are buf[1:n]; a
// turn's request is a slice of buf, so the history is never copied. A slot
// of buf is written once, before any request covers it (slot 0 again only
// when the prompt changes, which it does not within a session), so a
// request handed to a model stays what it was even if the model keeps
// reading it after its turn ended.
type conversation struct {
	buf     []model.Message
	note    string            // the first turn's first-prompt note
	pending map[string]string // tool call id -> tool name, awaiting a result
	lastSeq int64             // the last event folded in
	bytes   int64             // size for the cache's bound
}

func newConversation() *conversation {
	return &conversation{buf: make([]model.Message, 1, 16), pending: map[string]string{}}
}

// foldEvent is what the conversation reads of an event's JSON.
type foldEvent struct {
	Type       string            `json:"type"`
	Turn       int64             `json:"turn"`
	Message    string            `json:"message"`
	Note       string            `json:"note"`
	Text       string            `json:"text"`
	ToolCalls  []model.ToolCall  `json:"toolCalls"`
	ToolCallID string            `json:"toolCallId"`
	Tool       string            `json:"tool"`
	Output     string            `json:"output"`
	Status     string            `json:"status"`
	Result     string            `json:"result"`
	Forked     []json.RawMessage `json:"forked"`
}

// applyJSON folds in the event seq of the session, stored as data. The
// conversation is built from what was stored, never from the values a
// turn held before encoding them, so a cached conversation and one rebuilt
// from the database are the same.
func (c *conversation) applyJSON(sessionID string, seq int64, data []byte) error {
	var ev foldEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return fmt.Errorf("agent: event %d of session %s is damaged: %w", seq, sessionID, err)
	}
	c.apply(ev)
	c.lastSeq = seq
	return nil
}

// apply folds in one event: a turn.started adds the user's message, a
// model.call the assistant's message (its tool calls then await results),
// a tool.result the tool's message when its call awaits one. Calls still
// awaiting a result when the next turn or model call begins (a turn that
// ended between a tool call and its result) are answered with an error
// message, because models reject a conversation with unanswered calls.
func (c *conversation) apply(ev foldEvent) {
	switch ev.Type {
	case EventTurnStarted:
		c.closePending()
		if ev.Turn == 1 && ev.Note != "" {
			c.note = ev.Note
		}
		c.add(model.Message{Role: model.RoleUser, Content: ev.Message})
	case EventModelCall:
		c.closePending()
		c.add(model.Message{Role: model.RoleAssistant, Content: ev.Text, ToolCalls: ev.ToolCalls})
		for _, call := range ev.ToolCalls {
			c.pending[call.ID] = call.Name
		}
	case EventToolResult:
		if _, ok := c.pending[ev.ToolCallID]; ok {
			delete(c.pending, ev.ToolCallID)
			c.add(model.Message{Role: model.RoleTool, ToolCallID: ev.ToolCallID, Name: ev.Tool, Content: ev.Output})
		}
	case EventTurnForked:
		// The forked turns' messages and their answers, without their tool
		// steps: the answers were given, and the turns after this one
		// follow them.
		c.closePending()
		for _, raw := range ev.Forked {
			var f foldEvent
			if json.Unmarshal(raw, &f) != nil {
				continue
			}
			switch {
			case f.Type == EventTurnStarted:
				c.add(model.Message{Role: model.RoleUser, Content: f.Message})
			case f.Type == EventTurnFinished && f.Result != "":
				c.add(model.Message{Role: model.RoleAssistant, Content: f.Result})
			}
		}
	}
}

// closePending answers the calls awaiting a result, in id order.
func (c *conversation) closePending() {
	if len(c.pending) == 0 {
		return
	}
	ids := make([]string, 0, len(c.pending))
	for id := range c.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c.add(model.Message{Role: model.RoleTool, ToolCallID: id, Name: c.pending[id], Content: "error: the turn ended before this tool returned"})
	}
	clear(c.pending)
}

// add appends a message, growing buf by doubling.
func (c *conversation) add(m model.Message) {
	c.buf = append(c.buf, m)
	n := int64(messageOverhead + len(m.Content) + len(m.ToolCallID) + len(m.Name))
	for _, call := range m.ToolCalls {
		n += int64(len(call.ID) + len(call.Name) + len(call.Arguments))
	}
	c.bytes += n
}

// history returns the messages folded so far, as a model request starts
// them: the system prompt first when there is one. The result shares
// memory with the conversation: it must not be modified, and appending to
// it copies.
func (c *conversation) history(system string) []model.Message {
	if system == "" {
		return c.buf[1:len(c.buf):len(c.buf)]
	}
	if c.buf[0].Role != model.RoleSystem || c.buf[0].Content != system {
		c.buf[0] = model.Message{Role: model.RoleSystem, Content: system}
	}
	return c.buf[0:len(c.buf):len(c.buf)]
}

// loadConversation brings c (nil: none kept) up to the session's last
// event, lastSeq: the events after c.lastSeq are read from the local
// database and folded in. A conversation ahead of the session (events
// were removed) is rebuilt from the start.
func (r *Runtime) loadConversation(ctx context.Context, id string, c *conversation, lastSeq int64) (*conversation, error) {
	if c == nil || c.lastSeq > lastSeq {
		c = newConversation()
	}
	for c.lastSeq < lastSeq {
		recs, err := r.db.After(ctx, id, c.lastSeq, MaxPageSize)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			if err := c.applyJSON(id, rec.Seq, rec.Data); err != nil {
				return nil, err
			}
		}
		if len(recs) < MaxPageSize {
			break
		}
	}
	return c, nil
}

// conversationCache keeps the conversations of active sessions, bounded
// in size and evicting those idle for conversationIdle. A turn takes its
// session's conversation out (take) and gives it back at its end (put);
// anything that rewrites a session's events here (taking another host's
// history, a fork, a delete, an import) drops it (drop), so the next turn
// rebuilds it from the database. It changes how fast a turn starts, never
// what the model is sent.
type conversationCache struct {
	mu       sync.Mutex
	lru      *list.List // of *cached, most recent first
	entries  map[string]*list.Element
	taken    map[string]*takenConversation
	bytes    int64
	maxBytes int64
	idle     time.Duration
}

type cached struct {
	id   string
	conv *conversation
	used time.Time
}

// takenConversation marks a conversation a turn holds; dropped says it
// must not come back.
type takenConversation struct{ dropped bool }

func newConversationCache(maxBytes int64, idle time.Duration) *conversationCache {
	return &conversationCache{lru: list.New(), entries: map[string]*list.Element{}, taken: map[string]*takenConversation{}, maxBytes: maxBytes, idle: idle}
}

// take removes and returns the session's conversation (nil when none is
// cached). The caller holds the session's turn lock.
func (cc *conversationCache) take(id string) *conversation {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.taken[id] = &takenConversation{}
	e, ok := cc.entries[id]
	if !ok {
		return nil
	}
	cc.remove(e)
	return e.Value.(*cached).conv
}

// put gives a taken conversation back (nil: none), unless it was dropped
// meanwhile, and evicts the least recently used past the size bound.
func (cc *conversationCache) put(id string, c *conversation, now time.Time) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	t := cc.taken[id]
	delete(cc.taken, id)
	if c == nil || t == nil || t.dropped || c.bytes > cc.maxBytes {
		return
	}
	if e, ok := cc.entries[id]; ok {
		cc.remove(e)
	}
	cc.entries[id] = cc.lru.PushFront(&cached{id: id, conv: c, used: now})
	cc.bytes += c.bytes
	for cc.bytes > cc.maxBytes {
		cc.remove(cc.lru.Back())
	}
}

// drop forgets the session's conversation, also one a turn holds.
func (cc *conversationCache) drop(id string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if t := cc.taken[id]; t != nil {
		t.dropped = true
	}
	if e, ok := cc.entries[id]; ok {
		cc.remove(e)
	}
}

// sweep evicts the conversations unused since before now-idle.
func (cc *conversationCache) sweep(now time.Time) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for e := cc.lru.Back(); e != nil && now.Sub(e.Value.(*cached).used) > cc.idle; e = cc.lru.Back() {
		cc.remove(e)
	}
}

// len returns how many conversations are cached.
func (cc *conversationCache) len() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.lru.Len()
}

func (cc *conversationCache) remove(e *list.Element) {
	c := e.Value.(*cached)
	cc.lru.Remove(e)
	delete(cc.entries, c.id)
	cc.bytes -= c.conv.bytes
}
