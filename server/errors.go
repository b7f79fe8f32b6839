package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"

	"agentkit/agent"
	"agentkit/internal/jsonerr"
)

// Error codes of the JSON error answers.
const (
	CodeInvalid          = "invalid_request"        // 400: the message names the field
	CodeReservedPath     = "reserved_path"          // 400: a workspace file under memory/
	CodeUnauthorized     = "unauthorized"           // 401
	CodeNotFound         = "not_found"              // 404: no such route
	CodeUnknownToken     = "unknown_token"          // 404
	CodeSessionNotFound  = "session_not_found"      // 404
	CodeReminderNotFound = "reminder_not_found"     // 404
	CodeMethodNotAllowed = "method_not_allowed"     // 405
	CodeSessionBusy      = "session_busy"           // 409
	CodeKeyInUse         = "idempotency_key_in_use" // 409: a request with this Idempotency-Key is running
	CodeTurnForked       = "turn_forked"            // 409: the turn ran and was recorded as a fork (ifLastSeq)
	CodeSessionMoved     = "session_moved"          // 409: serving mode local, the session moved to serving mode ledger
	CodePrecondition     = "precondition_failed"    // 412: the session moved on since ifLastSeq; nothing ran
	CodeKeyReused        = "idempotency_key_reused" // 422: the Idempotency-Key names another request
	CodeTooLarge         = "body_too_large"         // 413
	CodeMessageTooLarge  = "message_too_large"      // 413: over the ledger's limit on one queued message
	CodeInboxFull        = "inbox_full"             // 429: the session's queue is full (serving mode ledger)
	CodeTooManyKeys      = "too_many_keys"          // 429: the session keeps ledger.maxKeys Idempotency-Keys (serving mode ledger)
	CodeDeadLettered     = "dead_lettered"          // 422: the message went to the dead-letter store (serving mode ledger)
	CodeStoreUnavailable = "store_unavailable"      // 503
	CodeShuttingDown     = "shutting_down"          // 503
	CodeInternal         = "internal"               // 500
)

// errorBody is the JSON shape of every error answer.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		writeError(w, http.StatusInternalServerError, CodeInternal, "encoding the answer failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	b, _ := json.Marshal(errorBody{Error: errorDetail{Code: code, Message: msg}})
	w.Write(append(b, '\n'))
}

// classify maps an error of the runtime (or of reading the request) to a
// status, a code and a message for the client.
func (s *Server) classify(r *http.Request, err error) (int, string, string) {
	var ie *agent.InvalidError
	var mb *http.MaxBytesError
	var be *bodyError
	var full *agent.InboxFullError
	switch {
	case errors.As(err, &mb):
		return http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the request body is over the %d-byte limit; send less, or raise the server's --max-body-bytes", mb.Limit)
	case errors.As(err, &be):
		return http.StatusBadRequest, CodeInvalid, be.msg
	case errors.Is(err, agent.ErrReservedPath) && errors.As(err, &ie):
		return http.StatusBadRequest, CodeReservedPath, fieldMessage(ie)
	case errors.As(err, &ie):
		return http.StatusBadRequest, CodeInvalid, fieldMessage(ie)
	case errors.Is(err, agent.ErrUnknownToken):
		return http.StatusNotFound, CodeUnknownToken, "no session has this continuation token; start a new session with POST /v1/sessions"
	case errors.Is(err, agent.ErrSessionNotFound):
		return http.StatusNotFound, CodeSessionNotFound, "no session has this id"
	case errors.Is(err, agent.ErrReminderNotFound):
		return http.StatusNotFound, CodeReminderNotFound, "no reminder has this id"
	case errors.Is(err, agent.ErrStoreUnavailable):
		s.log.Warn("server: the store is unavailable", "requestId", requestID(r.Context()), "error", err)
		return http.StatusServiceUnavailable, CodeStoreUnavailable, "the store is unavailable; retry later (the server log has the details)"
	case errors.Is(err, agent.ErrBusy):
		return http.StatusConflict, CodeSessionBusy, "another turn of this session is running; retry when it ends (send an Idempotency-Key, and the same one on every retry, so a retry never runs the turn twice)"
	case errors.Is(err, agent.ErrSessionMoved):
		return http.StatusConflict, CodeSessionMoved, "this session moved to serving mode ledger, and this server serves in mode local; send its requests to a server of serving mode ledger"
	case errors.Is(err, agent.ErrPreconditionFailed):
		return http.StatusPreconditionFailed, CodePrecondition, strings.TrimPrefix(err.Error(), "agent: ")
	case errors.Is(err, agent.ErrTurnForked):
		return http.StatusConflict, CodeTurnForked, strings.TrimPrefix(err.Error(), "agent: ")
	case errors.Is(err, agent.ErrKeyInUse):
		return http.StatusConflict, CodeKeyInUse, "a request with this Idempotency-Key is running; retry when it has answered, and the retry gets its answer"
	case errors.Is(err, agent.ErrKeyReused):
		return http.StatusUnprocessableEntity, CodeKeyReused, strings.TrimPrefix(err.Error(), agent.ErrKeyReused.Error()+": ")
	case errors.As(err, &full) && full.Keys > 0:
		return http.StatusTooManyRequests, CodeTooManyKeys, "the session keeps as many Idempotency-Keys of recent messages as the server allows (ledger.maxKeys in agentkit.yaml; each is kept for ledger.idempotencyWindow); send the message again after Retry-After seconds, once the oldest have expired"
	case errors.Is(err, agent.ErrInboxFull):
		return http.StatusTooManyRequests, CodeInboxFull, "the session has as many messages queued as the server allows; send the message again (with the same Idempotency-Key) after Retry-After seconds"
	case errors.Is(err, agent.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, CodeMessageTooLarge, "the message is over the limit on one queued message (ledger.maxEventBytes in agentkit.yaml), or its Idempotency-Key over 256 bytes; send less"
	case errors.Is(err, agent.ErrDeadLettered):
		return http.StatusUnprocessableEntity, CodeDeadLettered, "the message's turn failed too many times and the message went to the dead-letter store; the session moved on without it"
	case errors.Is(err, agent.ErrClosed):
		return http.StatusServiceUnavailable, CodeShuttingDown, "the server is shutting down; retry on another host or after the restart"
	}
	id := requestID(r.Context())
	s.log.Error("server: request failed", "requestId", id, "error", err)
	return http.StatusInternalServerError, CodeInternal, "internal error; the server log has the details (request id " + id + ")"
}

func fieldMessage(ie *agent.InvalidError) string {
	return ie.Field + ": " + ie.Message
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, code, msg := s.classify(r, err)
	switch status {
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "5")
	case http.StatusConflict:
		if code != CodeTurnForked { // a forked turn is done: read the events, do not retry
			w.Header().Set("Retry-After", "1")
		}
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", retryAfter(err))
	}
	writeError(w, status, code, msg)
}

// retryAfter is the Retry-After of a full inbox, in whole seconds (at
// least 1).
func retryAfter(err error) string {
	var full *agent.InboxFullError
	secs := int64(1)
	if errors.As(err, &full) {
		secs = max(1, int64(math.Ceil(full.RetryAfter.Seconds())))
	}
	return strconv.FormatInt(secs, 10)
}

// bodyError is a request body that is not what the route takes. Its
// message names the field.
type bodyError struct{ msg string }

func (e *bodyError) Error() string { return e.msg }

func badBody(format string, args ...any) error {
	return &bodyError{msg: fmt.Sprintf(format, args...)}
}

// decodeBody reads a JSON object into v: at most the body limit, UTF-8, no
// unknown fields, field names in their exact case, no field (or nested key)
// given twice, nothing after the object. allowed lists the fields for the
// error message.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any, allowed string) error {
	body := http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	data, err := io.ReadAll(body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return mb
		}
		return badBody("reading the request body failed: %v", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return badBody("the request body is empty; send a JSON object with %s", allowed)
	}
	if err := checkUTF8(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, allowed)
	}
	if dec.More() {
		return badBody("the request body holds more than one JSON value; send one object")
	}
	return strictCheck(data, v, allowed)
}

// jsonError words a decoding error, naming the field.
func jsonError(err error, allowed string) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		if te.Field == "" {
			return badBody("the request body must be a JSON object with %s, not a JSON %s", allowed, te.Value)
		}
		return badBody("%s", jsonerr.Describe(err, "the request body"))
	case errors.As(err, &se):
		return badBody("the request body is not valid JSON (at byte %d): %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badBody("the request body is cut short: it is not a complete JSON object")
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return badBody("%s: unknown field; the allowed fields are %s", strings.Trim(f, `"`), allowed)
	}
	return badBody("the request body is not valid: %s", strings.TrimPrefix(msg, "json: "))
}

// logAttrsOf is slog attributes for an error answer streamed after the
// headers were sent.
func logAttrsOf(r *http.Request, err error) []any {
	return []any{slog.String("requestId", requestID(r.Context())), slog.Any("error", err)}
}
