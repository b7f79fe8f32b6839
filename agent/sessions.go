package agent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"agentkit/agent/sessiondb"
	"agentkit/agent/stateroot"
	"agentkit/workspace"
)

// DefaultChannel is the channel of sessions started without one: the HTTP
// session API.
const DefaultChannel = "http"

// Limits on requests.
const (
	// MaxMessageBytes is the largest user message accepted.
	MaxMessageBytes = 1 << 20
	// MaxTitleBytes is the longest session title accepted.
	MaxTitleBytes = 1024
	// MaxChannelBytes is the longest channel id accepted.
	MaxChannelBytes = 1024
	// MaxPageSize is the largest page ListSessions and Events return.
	MaxPageSize = 1000
	// DefaultPageSize is the page size used when a limit is zero.
	DefaultPageSize = 50
)

// tokenBytes is the continuation token's entropy: 256 bits.
const tokenBytes = 32

// maxTokenLen bounds what is looked up as a token.
const maxTokenLen = 512

// newToken returns a continuation token: 256 bits from crypto/rand,
// base64url without padding (43 characters).
func newToken() string {
	b := make([]byte, tokenBytes)
	rand.Read(b) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

// newID returns a random (version 4) UUID.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func checkText(field, s string, required bool, max int) error {
	switch {
	case required && strings.TrimSpace(s) == "":
		return invalid(field, "it is empty; send a non-empty %s", field)
	case len(s) > max:
		return invalid(field, "it is %d bytes, over the %d-byte limit", len(s), max)
	case !utf8.ValidString(s):
		return invalid(field, "it is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return invalid(field, "it contains a NUL byte")
	}
	return nil
}

// checkFiles validates per-send workspace files.
func checkFiles(files map[string]string) error {
	if len(files) == 0 {
		return nil
	}
	err := workspace.ValidateFiles(files)
	if err == nil {
		return nil
	}
	ie := &InvalidError{Field: "workspaceFiles", Message: err.Error()}
	var fe *workspace.FileError
	if errors.As(err, &fe) {
		if errors.Is(fe, workspace.ErrReserved) {
			ie.Err = ErrReservedPath
			ie.Message = fmt.Sprintf("%q is under memory/, which is reserved for the memory journal's read-only view; put the file in another folder", fe.Path)
		}
	}
	return ie
}

// StartSession creates a session and runs its first turn. The session is
// stored with its first events, in one write: until then (while the
// OnSessionStart and FirstPrompt hooks run) it is not listed. The turn's
// failure (a model error, the step limit) is a result with status failed,
// not an error; errors are for requests that cannot run: an *InvalidError
// (ErrInvalid) naming the field, ErrClosed.
func (r *Runtime) StartSession(ctx context.Context, req StartRequest) (TurnResult, error) {
	if req.ChannelID == "" {
		req.ChannelID = DefaultChannel
	}
	for _, err := range []error{
		checkText("message", req.Message, true, MaxMessageBytes),
		checkText("channelId", req.ChannelID, false, MaxChannelBytes),
		checkText("title", req.Title, false, MaxTitleBytes),
		checkFiles(req.WorkspaceFiles),
		checkKey(req.IdempotencyKey, req.IdempotencyKey != ""),
	} {
		if err != nil {
			return TurnResult{}, err
		}
	}
	exit, err := r.enter()
	if err != nil {
		return TurnResult{}, err
	}
	defer exit()
	return r.path.submit(ctx, turnRequest{
		start: &req, message: req.Message, files: req.WorkspaceFiles, source: SourceAPI,
		key: req.IdempotencyKey, hash: startHash(req, req.ChannelID), onEvent: req.OnEvent,
	})
}

// sessionStarted runs the OnSessionStart hooks.
func (r *Runtime) sessionStarted(ctx context.Context, info SessionInfo) {
	if h := r.agent.Hooks.OnSessionStart; h != nil {
		if err := callHook(func() error { return h(ctx, info) }); err != nil {
			r.logger(info.SessionID).Warn("agent: OnSessionStart hook failed", "error", err)
		}
	}
	r.mem.PrepareSession(ctx, info.SessionID)
}

// firstPromptNote gathers the notes added to the first prompt: the
// agent's FirstPrompt hook and the memory journal's path.
func (r *Runtime) firstPromptNote(ctx context.Context, info SessionInfo) string {
	var notes []string
	if h := r.agent.Hooks.FirstPrompt; h != nil {
		var note string
		err := callHook(func() error {
			var err error
			note, err = h(ctx, info)
			return err
		})
		if err != nil {
			r.logger(info.SessionID).Warn("agent: FirstPrompt hook failed", "error", err)
		} else if note = strings.TrimSpace(note); note != "" {
			notes = append(notes, note)
		}
	}
	if n := r.mem.FirstPromptNote(); n != "" {
		notes = append(notes, n)
	}
	return strings.Join(notes, "\n\n")
}

// callHook runs a hook, turning a panic into an error.
func callHook(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("hook panicked: %v", p)
		}
	}()
	return f()
}

func (r *Runtime) sessionInfo(m sessiondb.Meta) SessionInfo {
	return SessionInfo{
		AgentName:   r.agent.Name,
		SessionID:   m.ID,
		ChannelID:   m.ChannelID,
		Title:       m.Title,
		CreatedAt:   m.CreatedAt,
		StateRoot:   r.root.Dir(),
		Workspace:   r.workspaceDir(m.ID),
		JournalPath: r.mem.JournalPath(),
	}
}

// workspaceDir is the session's workspace folder. Session ids the runtime
// makes are UUIDs; ids restored from a store are encoded as a key segment
// so that they are always one safe folder name.
func (r *Runtime) workspaceDir(id string) string {
	return r.root.Path(stateroot.WorkspaceDir, folderName(id))
}

func folderName(id string) string {
	ok := id != "" && id != "." && id != ".." && len(id) <= 128
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if ok {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "x-" + hex.EncodeToString(sum[:16])
}

// Continue runs a follow-up turn in the session the token names. An
// unknown token is ErrUnknownToken (never a new session); when the token is
// not on local disk it is resolved through the store, and a store failure
// is ErrStoreUnavailable.
func (r *Runtime) Continue(ctx context.Context, req ContinueRequest) (TurnResult, error) {
	if req.Token == "" {
		return TurnResult{}, invalid("continuationToken", "it is empty; send the continuationToken of an earlier turn")
	}
	if req.IfLastSeq < 0 {
		return TurnResult{}, invalid("ifLastSeq", "%d is negative; send the lastSeq of an earlier answer, or leave it out", req.IfLastSeq)
	}
	for _, err := range []error{
		checkText("message", req.Message, true, MaxMessageBytes),
		checkFiles(req.WorkspaceFiles),
		checkKey(req.IdempotencyKey, req.IdempotencyKey != ""),
	} {
		if err != nil {
			return TurnResult{}, err
		}
	}
	exit, err := r.enter()
	if err != nil {
		return TurnResult{}, err
	}
	defer exit()
	id, err := r.resolveToken(ctx, req.Token)
	if err != nil {
		return TurnResult{}, err
	}
	hash := ""
	if req.IdempotencyKey != "" {
		hash = continueHash(req)
	}
	res, err := r.path.submit(ctx, turnRequest{
		sessionID: id, token: req.Token, message: req.Message, files: req.WorkspaceFiles, source: SourceAPI,
		key: req.IdempotencyKey, hash: hash, onEvent: req.OnEvent, noWait: req.NoWait,
		ifLastSeq: req.IfLastSeq,
	})
	if errors.Is(err, ErrSessionNotFound) {
		// Deleted (here or on another host) since the token was issued,
		// or never in this mode's store.
		return TurnResult{}, fmt.Errorf("%w: %w", ErrUnknownToken, err)
	}
	return res, err
}

// GetSession returns a session's metadata. A session not on local disk is
// loaded from the store when the store can Get; ErrSessionNotFound when it
// is nowhere, ErrStoreUnavailable when the store fails.
func (r *Runtime) GetSession(ctx context.Context, id string) (Session, error) {
	exit, err := r.enter()
	if err != nil {
		return Session{}, err
	}
	defer exit()
	m, err := r.localOrStore(ctx, id)
	if err != nil {
		return Session{}, err
	}
	return sessionOf(m), nil
}

// localOrStore returns a session's row, the local copy brought up to
// the store's by the commit path.
func (r *Runtime) localOrStore(ctx context.Context, id string) (sessiondb.Meta, error) {
	if id == "" {
		return sessiondb.Meta{}, invalid("sessionId", "it is empty")
	}
	return r.path.session(ctx, id)
}

func sessionOf(m sessiondb.Meta) Session {
	return Session{
		ID: m.ID, ChannelID: m.ChannelID, Title: m.Title,
		CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt,
		Turns: m.Turns, LastSeq: m.LastSeq, LastStatus: TurnStatus(m.LastStatus),
	}
}

// cursor is the decoded form of a ListSessions cursor.
type cursor struct {
	U int64  `json:"u"`
	I string `json:"i"`
}

// decodeCursor reads a page's NextCursor; "" is nil, the newest first.
func decodeCursor(cur string) (*cursor, error) {
	if cur == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(cur)
	var c cursor
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.I == "" {
		return nil, invalid("cursor", "it is not a cursor this server returned; pass nextCursor from the previous page, or nothing to start")
	}
	return &c, nil
}

// ListSessions returns the sessions on this host, newest first by update
// time, limit at a time (0 means DefaultPageSize, at most MaxPageSize).
// Pass the page's NextCursor to get the next page; "" starts at the newest.
// A malformed cursor is an *InvalidError.
func (r *Runtime) ListSessions(ctx context.Context, limit int, cur string) (SessionPage, error) {
	exit, err := r.enter()
	if err != nil {
		return SessionPage{}, err
	}
	defer exit()
	limit, err = pageSize(limit)
	if err != nil {
		return SessionPage{}, err
	}
	c, err := decodeCursor(cur)
	if err != nil {
		return SessionPage{}, err
	}
	return r.path.list(ctx, limit, c)
}

func pageSize(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultPageSize, nil
	case limit < 0 || limit > MaxPageSize:
		return 0, invalid("limit", "%d is out of range; use 1 to %d", limit, MaxPageSize)
	}
	return limit, nil
}

// Events returns a session's events with Seq > afterSeq, in order, limit
// at a time (0 means DefaultPageSize, at most MaxPageSize). The cost is one
// index lookup, whatever the session's length.
func (r *Runtime) Events(ctx context.Context, sessionID string, afterSeq int64, limit int) (EventPage, error) {
	exit, err := r.enter()
	if err != nil {
		return EventPage{}, err
	}
	defer exit()
	limit, err = pageSize(limit)
	if err != nil {
		return EventPage{}, err
	}
	if afterSeq < 0 {
		return EventPage{}, invalid("after", "%d is negative; use 0 for the first page", afterSeq)
	}
	if _, err := r.localOrStore(ctx, sessionID); err != nil {
		return EventPage{}, err
	}
	recs, err := r.db.After(ctx, sessionID, afterSeq, limit+1)
	if err != nil {
		return EventPage{}, err
	}
	page := EventPage{Events: []Event{}, Next: afterSeq}
	if len(recs) > limit {
		page.More = true
		recs = recs[:limit]
	}
	for _, rec := range recs {
		ev, err := decodeEvent(rec)
		if err != nil {
			return EventPage{}, err
		}
		page.Events = append(page.Events, ev)
		page.Next = ev.Seq
	}
	return page, nil
}

// LastEvents returns a session's last n events (at most MaxPageSize), in
// order. Its cost does not grow with the session's length.
func (r *Runtime) LastEvents(ctx context.Context, sessionID string, n int) ([]Event, error) {
	exit, err := r.enter()
	if err != nil {
		return nil, err
	}
	defer exit()
	n, err = pageSize(n)
	if err != nil {
		return nil, err
	}
	if _, err := r.localOrStore(ctx, sessionID); err != nil {
		return nil, err
	}
	recs, err := r.db.Last(ctx, sessionID, n)
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, len(recs))
	for _, rec := range recs {
		ev, err := decodeEvent(rec)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

func decodeEvent(rec sessiondb.Record) (Event, error) {
	var ev Event
	if err := json.Unmarshal(rec.Data, &ev); err != nil {
		return Event{}, fmt.Errorf("agent: event %d of session %s is damaged: %w", rec.Seq, rec.SessionID, err)
	}
	ev.Seq, ev.SessionID = rec.Seq, rec.SessionID
	return ev, nil
}

// DeleteSession deletes a session for every host: in the store its head
// becomes a tombstone (so no host's later write, restore or token lookup
// brings it back) and its batches, metadata, token and index entries are
// removed; here its events, token, forked events, reminders, workspace and
// memory journal records are removed, and the SQLite write-ahead logs that
// held them are checkpointed. It waits for a running turn of the session
// to end. A session that is nowhere is ErrSessionNotFound; a store failure
// is ErrStoreUnavailable and leaves the local copy in place, so the delete
// can be retried.
func (r *Runtime) DeleteSession(ctx context.Context, id string) error {
	exit, err := r.enter()
	if err != nil {
		return err
	}
	defer exit()
	if _, err := r.localOrStore(ctx, id); err != nil {
		return err
	}
	return r.path.remove(ctx, id)
}

// removeLocal removes a session from this host: its reminders, its records
// in the memory journal, its actor (actors.go), its rows in the local
// database (events, token, mirror state, forks, idempotency keys), its
// workspace and its subscriptions, then checkpoints the SQLite write-ahead
// logs.
func (r *Runtime) removeLocal(ctx context.Context, id string) error {
	if r.reminders != nil {
		if err := r.reminders.deleteSession(ctx, id); err != nil {
			return err
		}
	}
	if err := r.mem.PurgeSession(ctx, id); err != nil {
		return fmt.Errorf("agent: removing the session's records from the memory journal: %w", err)
	}
	if r.actors != nil {
		// Until the rows are gone, no write from outside a turn lands on
		// the actor (actors.go).
		unlock := r.holdActorWrites()
		defer unlock()
		if err := r.deleteSessionActor(ctx, id); err != nil {
			return err
		}
	}
	r.convs.drop(id)
	r.tokens.drop(id)
	if err := r.db.Delete(ctx, id); err != nil {
		return err
	}
	if err := os.RemoveAll(r.workspaceDir(id)); err != nil {
		r.logger(id).Warn("agent: removing the session workspace failed", "error", err)
	}
	r.checkpointAfterDelete(ctx, id)
	r.closeSubscribers(id)
	return nil
}

// lockSession waits until no turn of the session runs, then holds it. It
// returns ErrBusy (with ctx's error) if ctx ends first; with ctx already
// done it takes a free session and answers ErrBusy for a busy one, without
// waiting.
func (r *Runtime) lockSession(ctx context.Context, id string) (*sessionState, func(), error) {
	st, unref := r.refSession(id)
	// A free session is taken at once, even with ctx done: a caller that
	// must not wait passes a done context.
	select {
	case st.lock <- struct{}{}:
		return st, func() { <-st.lock; unref() }, nil
	default:
	}
	select {
	case st.lock <- struct{}{}:
		return st, func() { <-st.lock; unref() }, nil
	case <-ctx.Done():
		unref()
		return nil, nil, fmt.Errorf("%w: another turn of session %s is running: %w", ErrBusy, id, ctx.Err())
	}
}

// tryLockSession holds the session if no turn of it runs, without waiting.
func (r *Runtime) tryLockSession(id string) (*sessionState, func(), bool) {
	st, unref := r.refSession(id)
	select {
	case st.lock <- struct{}{}:
		return st, func() { <-st.lock; unref() }, true
	default:
		unref()
		return nil, nil, false
	}
}

// refSession returns the session's in-process state, counting a user, and
// the function that ends the use.
func (r *Runtime) refSession(id string) (*sessionState, func()) {
	r.mu.Lock()
	st := r.sessions[id]
	if st == nil {
		st = &sessionState{lock: make(chan struct{}, 1)}
		r.sessions[id] = st
	}
	st.refs++
	r.mu.Unlock()
	return st, func() {
		r.mu.Lock()
		st.refs--
		if st.refs == 0 && st.timer == nil {
			delete(r.sessions, id)
		}
		r.mu.Unlock()
	}
}
