package agent

import "context"

// DisableConversationCache makes r rebuild every turn's conversation from
// the session database, as if nothing were cached: the reference the
// cache's tests compare against.
func DisableConversationCache(r *Runtime) { r.convs = newConversationCache(0, conversationIdle) }

// CachedConversations returns how many conversations r holds in its cache.
func CachedConversations(r *Runtime) int { return r.convs.len() }

// LoseUnsavedMirrorState drops the mirror states r keeps in memory, as a
// crash would, and reports how many there were.
func LoseUnsavedMirrorState(r *Runtime) int {
	mr := r.mirror.(*storeMirror)
	mr.mu.Lock()
	defer mr.mu.Unlock()
	n := len(mr.unsaved)
	clear(mr.unsaved)
	return n
}

// FireLedgerReminder delivers a reminder's firing as the scheduler does in
// serving mode ledger.
func FireLedgerReminder(r *Runtime, sessionID, reminderID, message string) error {
	return r.fireLedgerReminder(context.Background(), sessionID, reminderID, message)
}
