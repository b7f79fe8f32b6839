package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"

	"agentkit/agent"
)

// startBody is the body of POST /v1/sessions.
type startBody struct {
	Message        string            `json:"message"`
	ChannelID      string            `json:"channelId"`
	Title          string            `json:"title"`
	WorkspaceFiles map[string]string `json:"workspaceFiles"`
}

const startFields = "message, channelId, title and workspaceFiles"

// continueBody is the body of POST /v1/sessions/continue.
type continueBody struct {
	ContinuationToken string            `json:"continuationToken"`
	Message           string            `json:"message"`
	WorkspaceFiles    map[string]string `json:"workspaceFiles"`
	// IfLastSeq is the follow-up's precondition (agent.ContinueRequest).
	IfLastSeq int64 `json:"ifLastSeq"`
}

const continueFields = "continuationToken, message, workspaceFiles and ifLastSeq"

func (s *Server) startSession(w http.ResponseWriter, r *http.Request) {
	var b startBody
	if err := s.decodeBody(w, r, &b, startFields); err != nil {
		s.fail(w, r, err)
		return
	}
	key, err := idempotencyKey(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req := agent.StartRequest{Message: b.Message, ChannelID: b.ChannelID, Title: b.Title, WorkspaceFiles: b.WorkspaceFiles, IdempotencyKey: key}
	s.runTurn(w, r, http.StatusCreated, func(ctx context.Context, onEvent func(agent.Event)) (agent.TurnResult, error) {
		req.OnEvent = onEvent
		return s.rt.StartSession(ctx, req)
	})
}

func (s *Server) continueSession(w http.ResponseWriter, r *http.Request) {
	var b continueBody
	if err := s.decodeBody(w, r, &b, continueFields); err != nil {
		s.fail(w, r, err)
		return
	}
	key, err := idempotencyKey(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// NoWait: a session busy with another turn is 409 at once. A client
	// that waited would have given up and retried by the time the turn
	// ran, and the retry would run it twice.
	req := agent.ContinueRequest{Token: b.ContinuationToken, Message: b.Message, WorkspaceFiles: b.WorkspaceFiles, IdempotencyKey: key, NoWait: true, IfLastSeq: b.IfLastSeq}
	s.runTurn(w, r, http.StatusOK, func(ctx context.Context, onEvent func(agent.Event)) (agent.TurnResult, error) {
		req.OnEvent = onEvent
		return s.rt.Continue(ctx, req)
	})
}

// runTurn runs a turn for a POST route: as one JSON answer, or, when the
// client accepts text/event-stream, as a stream of the turn's events
// ending with a "result" event that carries the JSON answer. The turn runs
// to its end even if the client goes away.
func (s *Server) runTurn(w http.ResponseWriter, r *http.Request, status int, call func(context.Context, func(agent.Event)) (agent.TurnResult, error)) {
	ctx, cancel := s.turnContext(r)
	defer cancel()
	if !wantsStream(r) {
		res, err := call(ctx, nil)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if res.Queued {
			writeQueued(w, res)
			return
		}
		if status == http.StatusCreated {
			w.Header().Set("Location", "/v1/sessions/"+res.SessionID)
		}
		if res.Replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		writeJSON(w, status, res)
		return
	}

	q := newEventQueue()
	var res agent.TurnResult
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = call(ctx, q.push)
	}()
	var st *stream // opened at the first event, so that an error before the turn starts is a plain JSON answer
	open := func() {
		if st == nil {
			st = s.openStream(w)
		}
	}
	ka := s.keepAliveTicker()
	defer ka.Stop()
	for {
		select {
		case <-q.wake:
			open()
			for _, ev := range q.take() {
				st.event(ev)
			}
		case <-ka.C:
			if st != nil {
				st.comment("keepalive")
			}
		case <-done:
			evs := q.take()
			if err != nil && st == nil && len(evs) == 0 {
				s.fail(w, r, err)
				return
			}
			if err == nil && res.Queued && st == nil {
				writeQueued(w, res)
				return
			}
			open()
			for _, ev := range evs {
				st.event(ev)
			}
			if err != nil {
				code, name, msg := s.classify(r, err)
				s.log.Warn("server: a streamed turn failed after it started", append(logAttrsOf(r, err), "status", code)...)
				st.send("error", "", errorBody{Error: errorDetail{Code: name, Message: msg}})
				return
			}
			st.send("result", "", res)
			return
		}
	}
}

// queuedBody is the 202 answer of serving mode ledger: the message is
// accepted into the session's queue, and its turn runs on the host holding
// the session. The turn's turn.started event carries eventId.
type queuedBody struct {
	SessionID string `json:"sessionId"`
	EventID   string `json:"eventId"`
	Status    string `json:"status"`
}

func writeQueued(w http.ResponseWriter, res agent.TurnResult) {
	w.Header().Set("Location", "/v1/sessions/"+res.SessionID)
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, http.StatusAccepted, queuedBody{SessionID: res.SessionID, EventID: res.EventID, Status: "queued"})
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r, "limit")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, err := s.rt.ListSessions(r.Context(), int(limit), r.URL.Query().Get("cursor"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// sessionResponse is GET /v1/sessions/{id}: the metadata and one page of
// events.
type sessionResponse struct {
	Session agent.Session `json:"session"`
	agent.EventPage
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	after, limit, err := eventParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sess, err := s.rt.GetSession(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, err := s.rt.Events(r.Context(), id, after, int(limit))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionResponse{Session: sess, EventPage: page})
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	if err := s.rt.DeleteSession(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sessionEvents answers GET /v1/sessions/{id}/events: one page of events
// after a cursor, or, for text/event-stream, the events after the cursor
// and then every new one as it is recorded, until the client goes away,
// the session is deleted or the server shuts down.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	after, limit, err := eventParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !wantsStream(r) {
		page, err := s.rt.Events(r.Context(), id, after, int(limit))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, page)
		return
	}
	// Last-Event-ID wins over ?after=: an EventSource reconnects to the URL
	// it was given, after= included, and sends the id of the last event it
	// received.
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil || n < 0 {
			s.fail(w, r, badBody("Last-Event-ID: %q is not an event sequence number; reconnect with the id of the last event received", last))
			return
		}
		after = n
	}

	live, unsubscribe := s.rt.Subscribe(id)
	defer unsubscribe()
	// The backlog's first page also checks that the session exists.
	page, err := s.rt.Events(r.Context(), id, after, agent.MaxPageSize)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.metrics.streamOpened()
	defer s.metrics.streamClosed()
	st := s.openStream(w)
	last := after
	// catchUp sends the stored events after last, up to upTo (0: all).
	catchUp := func(page agent.EventPage, upTo int64) bool {
		for {
			for _, ev := range page.Events {
				if upTo > 0 && ev.Seq >= upTo {
					return true
				}
				if ev.Seq > last {
					st.event(ev)
					last = ev.Seq
				}
			}
			if !page.More || st.broken {
				return !st.broken
			}
			var err error
			if page, err = s.rt.Events(r.Context(), id, last, agent.MaxPageSize); err != nil {
				st.send("error", "", errorBody{Error: errorDetail{Code: CodeStoreUnavailable, Message: "reading the session's events failed; reconnect with Last-Event-ID"}})
				return false
			}
		}
	}
	if !catchUp(page, 0) {
		return
	}
	ka := s.keepAliveTicker()
	defer ka.Stop()
	for {
		select {
		case ev, ok := <-live:
			if !ok {
				st.send("end", "", map[string]string{"reason": "the session was deleted or the server is stopping"})
				return
			}
			if ev.Seq <= last {
				continue
			}
			if ev.Seq > last+1 { // missed events: fill the gap from the log
				page, err := s.rt.Events(r.Context(), id, last, agent.MaxPageSize)
				if err != nil || !catchUp(page, ev.Seq) {
					return
				}
			}
			st.event(ev)
			last = ev.Seq
		case <-ka.C:
			st.comment("keepalive")
		case <-s.draining:
			st.send("end", "", map[string]string{"reason": "the server is shutting down; reconnect with Last-Event-ID"})
			return
		case <-r.Context().Done():
			return
		}
		if st.broken {
			return
		}
	}
}

// idempotencyKey reads the Idempotency-Key header: absent, or one value,
// bare or as the quoted string of the IETF draft.
func idempotencyKey(r *http.Request) (string, error) {
	vals := r.Header.Values("Idempotency-Key")
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", badBody("Idempotency-Key: the header is given %d times; send it once", len(vals))
	}
	v := vals[0]
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if v == "" {
		return "", badBody("Idempotency-Key: the header is empty; send a random UUID, or no header")
	}
	return v, nil
}

func wantsStream(r *http.Request) bool {
	for _, a := range r.Header.Values("Accept") {
		if containsFold(a, "text/event-stream") {
			return true
		}
	}
	return false
}

// eventParams reads the after and limit query parameters.
func eventParams(r *http.Request) (after, limit int64, err error) {
	if after, err = intParam(r, "after"); err != nil {
		return 0, 0, err
	}
	limit, err = intParam(r, "limit")
	return after, limit, err
}

// intParam reads an integer query parameter: after, an event sequence
// number (0 or more), or limit, a page size (1 to agent.MaxPageSize). An
// absent one is 0. A number outside the range, however many digits it
// has, is called out of range and the range is named; anything else is not
// a whole number.
func intParam(r *http.Request, name string) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	lo, hi, absent := int64(0), int64(math.MaxInt64), ""
	if name == "limit" {
		lo, hi, absent = 1, agent.MaxPageSize, fmt.Sprintf(", or leave it out for %d", agent.DefaultPageSize)
	}
	shown := v
	if len(shown) > 24 {
		shown = shown[:20] + "…"
	}
	n, err := strconv.ParseInt(v, 10, 64)
	var ne *strconv.NumError
	if errors.As(err, &ne) && ne.Err == strconv.ErrRange || err == nil && (n < lo || n > hi) {
		return 0, badBody("%s: %s is out of range; use %d to %d%s", name, shown, lo, hi, absent)
	}
	if err != nil {
		return 0, badBody("%s: %q is not a whole number; use one from %d to %d%s", name, shown, lo, hi, absent)
	}
	return n, nil
}

// eventQueue hands a turn's events from the turn's goroutine to the
// handler's without ever blocking the turn.
type eventQueue struct {
	mu   sync.Mutex
	evs  []agent.Event
	wake chan struct{}
}

func newEventQueue() *eventQueue { return &eventQueue{wake: make(chan struct{}, 1)} }

func (q *eventQueue) push(ev agent.Event) {
	q.mu.Lock()
	q.evs = append(q.evs, ev)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take() []agent.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs := q.evs
	q.evs = nil
	return evs
}
