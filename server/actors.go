package server

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"agentkit/agent"
	"agentkit/tool"
)

// Error codes of the session actor routes.
const (
	CodeInvalidJSON          = "invalid_json"           // 400: a patch or state that is not valid JSON; the message names the line and column
	CodeUnsupportedMediaType = "unsupported_media_type" // 415: PATCH without application/merge-patch+json, PUT without application/json
	CodeInvalidState         = "invalid_state"          // 422: a state the session's actor cannot hold
	CodeActorMigrated        = "actor_migrated"         // 409: the actor's database is on another host, named
	CodeActorStateLocal      = "actor_state_local"      // 409: serving mode ledger, where actor state does not follow a session
	CodeNewerFormat          = "newer_format"           // 500: the actor's database was written by a newer agentkit
)

// Media types of the state routes.
const (
	mergePatchType = "application/merge-patch+json"
	jsonType       = "application/json"
)

// actorRoutes registers the session actor routes: the state (read, merge
// patch, replace) and the messages.
func (s *Server) actorRoutes() {
	s.mux.HandleFunc("GET /v1/sessions/{id}/state", s.getState)
	s.mux.HandleFunc("PATCH /v1/sessions/{id}/state", s.patchState)
	s.mux.HandleFunc("PUT /v1/sessions/{id}/state", s.putState)
	s.mux.HandleFunc("GET /v1/sessions/{id}/messages", s.sessionMessages)
}

func (s *Server) getState(w http.ResponseWriter, r *http.Request) {
	a, err := s.rt.SessionActor(r.Context(), r.PathValue("id"))
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	st, err := a.State(r.Context())
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	writeRawJSON(w, http.StatusOK, st)
}

func (s *Server) patchState(w http.ResponseWriter, r *http.Request) {
	if !s.requireType(w, r, mergePatchType, "an RFC 7396 merge patch") {
		return
	}
	body, err := s.readRawBody(w, r, "a merge patch")
	if err == nil {
		err = checkJSONText(body, "patch")
	}
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	a, err := s.rt.SessionActor(r.Context(), r.PathValue("id"))
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	st, err := a.PatchState(r.Context(), body)
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	writeRawJSON(w, http.StatusOK, st)
}

func (s *Server) putState(w http.ResponseWriter, r *http.Request) {
	if !s.requireType(w, r, jsonType, "the new state as JSON") {
		return
	}
	body, err := s.readRawBody(w, r, "the new state")
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	if err := checkJSONText(body, "state"); err != nil {
		s.actorFail(w, r, err)
		return
	}
	st, err := agent.CompactJSON(body, "state")
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	a, err := s.rt.SessionActor(r.Context(), r.PathValue("id"))
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	if err := a.ReplaceState(r.Context(), st); err != nil {
		s.actorFail(w, r, err)
		return
	}
	writeRawJSON(w, http.StatusOK, st)
}

// messagePage is the answer of GET /v1/sessions/{id}/messages.
type messagePage struct {
	Messages []tool.Record `json:"messages"`
	// Next is the after of the next page: the last message's seq, or the
	// after asked for when the page is empty.
	Next int64 `json:"next"`
	More bool  `json:"more"`
}

func (s *Server) sessionMessages(w http.ResponseWriter, r *http.Request) {
	after, limit, err := eventParams(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if limit == 0 {
		limit = agent.DefaultPageSize
	}
	a, err := s.rt.SessionActor(r.Context(), r.PathValue("id"))
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	msgs, err := a.Messages(r.Context(), after, int(limit))
	if err != nil {
		s.actorFail(w, r, err)
		return
	}
	page := messagePage{Messages: msgs, Next: after}
	if len(msgs) > 0 {
		page.Next = msgs[len(msgs)-1].Seq
	}
	if len(msgs) == int(limit) {
		more, err := a.Messages(r.Context(), page.Next, 1)
		if err != nil {
			s.actorFail(w, r, err)
			return
		}
		page.More = len(more) > 0
	}
	writeJSON(w, http.StatusOK, page)
}

// requireType answers 415 unless the request's Content-Type is want
// (parameters such as charset aside).
func (s *Server) requireType(w http.ResponseWriter, r *http.Request, want, what string) bool {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && strings.EqualFold(mt, want) {
		return true
	}
	if want == mergePatchType {
		w.Header().Set("Accept-Patch", mergePatchType)
	}
	got := "no Content-Type"
	if ct != "" {
		got = fmt.Sprintf("Content-Type %q", ct)
	}
	writeError(w, http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
		fmt.Sprintf("%s %s takes %s with Content-Type: %s; the request has %s", r.Method, r.URL.Path, what, want, got))
	return false
}

// readRawBody reads a request body of at most the body limit, refusing an
// empty one.
func (s *Server) readRawBody(w http.ResponseWriter, r *http.Request, what string) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, mb
		}
		return nil, badBody("reading the request body failed: %v", err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, badBody("the request body is empty; send %s", what)
	}
	return data, nil
}

// checkJSONText refuses a body that is not one JSON text (naming the line
// and column) or holds a lone UTF-16 surrogate escape, as the other routes'
// bodies are refused (strictjson.go).
func checkJSONText(body []byte, doc string) error {
	if err := agent.CheckJSON(body, doc); err != nil {
		return err
	}
	return checkSurrogates(body)
}

// writeRawJSON answers with a JSON value already encoded.
func writeRawJSON(w http.ResponseWriter, status int, v []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(v[:len(v):len(v)], '\n'))
}

// actorFail answers an error of the session actor routes: the actor's own
// errors here, the runtime's through fail.
func (s *Server) actorFail(w http.ResponseWriter, r *http.Request, err error) {
	var se *agent.JSONError
	var me *agent.ActorMigratedError
	switch {
	case errors.As(err, &se) && (se.Doc == "patch" || se.Doc == "state"):
		writeError(w, http.StatusBadRequest, CodeInvalidJSON, se.Error())
	case errors.Is(err, agent.ErrActorStateLocal):
		writeError(w, http.StatusConflict, CodeActorStateLocal, strings.TrimPrefix(err.Error(), "agent: "))
	case errors.As(err, &me):
		s.log.Warn("server: the session's actor is on another host", "requestId", requestID(r.Context()), "error", err)
		writeError(w, http.StatusConflict, CodeActorMigrated, migratedMessage(me))
	case errors.Is(err, agent.ErrActorNewerFormat):
		s.log.Error("server: an actor database of a newer format", "requestId", requestID(r.Context()), "error", err)
		writeError(w, http.StatusInternalServerError, CodeNewerFormat, "the session's actor database was written by a newer agentkit; upgrade agentkit on this host (the server log names the file)")
	case errors.Is(err, agent.ErrInvalidState) && se == nil:
		writeError(w, http.StatusUnprocessableEntity, CodeInvalidState, strings.TrimPrefix(err.Error(), "actor: "))
	default:
		s.fail(w, r, err)
	}
}

// migratedMessage says which host has a migrated actor, without this
// host's paths.
func migratedMessage(e *agent.ActorMigratedError) string {
	switch {
	case e.Lost:
		return "this host migrated the session's actor from the key-value store and its database file is now missing; restore it from a backup (the server log names the file)"
	case e.State == "migrating":
		return fmt.Sprintf("the session's actor is being migrated from the key-value store by host %s; send the request to that host (if it is gone for good, the server log names the key to delete)", e.Host)
	}
	return fmt.Sprintf("the session's actor was migrated from the key-value store into the actor database of host %s, which this host does not have; send the request to that host, or copy its actors folder here", e.Host)
}
