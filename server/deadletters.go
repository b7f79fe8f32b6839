package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"agentkit/agent"
)

// Error codes of the dead-letter routes.
const (
	// CodeNotLedger is a 404 of a route that exists only in serving mode
	// ledger, asked of a server in serving mode local.
	CodeNotLedger = "not_ledger_mode"
	// CodeDeadLetterNotFound is a 404: no current dead letter has this
	// session and event id.
	CodeDeadLetterNotFound = "dead_letter_not_found"
)

// deadLetterRoutes registers the dead-letter routes. In serving mode
// local they answer 404 not_ledger_mode, so a client learns why, and the
// routes stay in the route table the auth test walks.
func (s *Server) deadLetterRoutes() {
	d := &deadLetterRoutes{s: s}
	s.mux.HandleFunc("GET /v1/deadletters", d.list)
	s.mux.HandleFunc("POST /v1/deadletters/{sessionId}/{eventId}/replay", d.replay)
	s.mux.HandleFunc("DELETE /v1/deadletters/{sessionId}/{eventId}", d.drop)
}

type deadLetterRoutes struct {
	s *Server
}

// deadLetterJSON is one dead letter in an answer.
type deadLetterJSON struct {
	SessionID string          `json:"sessionId"`
	EventID   string          `json:"eventId"`
	Attempts  int             `json:"attempts"`
	LastError string          `json:"lastError,omitempty"`
	At        time.Time       `json:"at"`
	Payload   json.RawMessage `json:"payload"`
}

type deadLetterPage struct {
	DeadLetters []deadLetterJSON `json:"deadLetters"`
	// More is true when the limit cut the list short.
	More bool `json:"more"`
}

func (d *deadLetterRoutes) list(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r, "limit")
	if err != nil {
		d.s.fail(w, r, err)
		return
	}
	if limit == 0 {
		limit = agent.DefaultPageSize
	}
	page := deadLetterPage{DeadLetters: []deadLetterJSON{}}
	for dl, err := range d.s.rt.DeadLetters(r.Context(), r.URL.Query().Get("sessionId")) {
		if err != nil {
			d.fail(w, r, err)
			return
		}
		if int64(len(page.DeadLetters)) == limit {
			page.More = true
			break
		}
		page.DeadLetters = append(page.DeadLetters, deadLetterJSON{
			SessionID: dl.SessionID, EventID: dl.EventID, Attempts: dl.Attempts, LastError: dl.LastError,
			At: dl.At.UTC(), Payload: dl.Payload,
		})
	}
	writeJSON(w, http.StatusOK, page)
}

// replayAnswer is the answer of a replay: status queued (202: back in the
// inbox), or pending or committed (200: the event was not dead-lettered,
// nothing changed).
type replayAnswer struct {
	SessionID string `json:"sessionId"`
	EventID   string `json:"eventId"`
	Status    string `json:"status"`
	// CommitSeq is the turn that consumed a committed event.
	CommitSeq uint64 `json:"commitSeq,omitempty"`
}

func (d *deadLetterRoutes) replay(w http.ResponseWriter, r *http.Request) {
	sid, eid := r.PathValue("sessionId"), r.PathValue("eventId")
	res, err := d.s.rt.ReplayDeadLetter(r.Context(), sid, eid)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	a := replayAnswer{SessionID: sid, EventID: eid, Status: res.State, CommitSeq: res.CommitSeq}
	if res.State == agent.ReplayQueued {
		writeJSON(w, http.StatusAccepted, a)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func (d *deadLetterRoutes) drop(w http.ResponseWriter, r *http.Request) {
	if err := d.s.rt.DropDeadLetter(r.Context(), r.PathValue("sessionId"), r.PathValue("eventId")); err != nil {
		d.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// fail answers an error of the dead-letter operations: 404 in serving
// mode local, for an unknown dead letter or a deleted session, 429 for a
// full inbox, 503 for the store (the only other thing these routes
// touch).
func (d *deadLetterRoutes) fail(w http.ResponseWriter, r *http.Request, err error) {
	var full *agent.InboxFullError
	switch {
	case errors.Is(err, agent.ErrNotLedgerMode):
		writeError(w, http.StatusNotFound, CodeNotLedger,
			"this agent serves in mode "+d.s.rt.Info().Serving+": dead letters exist only in serving mode ledger (serving: ledger in agentkit.yaml, or agentkit serve --serving ledger)")
	case errors.Is(err, agent.ErrDeadLetterNotFound):
		writeError(w, http.StatusNotFound, CodeDeadLetterNotFound, "no dead letter has this session and event id; GET /v1/deadletters lists them")
	case errors.Is(err, agent.ErrSessionNotFound):
		writeError(w, http.StatusNotFound, CodeSessionNotFound, "no session has this id (a deleted session's dead letters went with it)")
	case errors.As(err, &full):
		secs := int(math.Ceil(full.RetryAfter.Seconds()))
		if secs < 1 {
			secs = 1
		}
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		writeError(w, http.StatusTooManyRequests, CodeInboxFull,
			fmt.Sprintf("the session's inbox is full (%d messages pending); nothing was replayed, retry after %d s", full.Pending, secs))
	case r.Context().Err() != nil:
		// the client went away; nobody reads the answer
		writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the request was canceled")
	default:
		d.s.log.Warn("server: dead letters: the store failed", "requestId", requestID(r.Context()), "error", err)
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the store is unavailable; retry later (the server log has the details)")
	}
}
