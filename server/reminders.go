package server

import (
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"agentkit/agent"
)

// reminderBody is the body of POST /v1/reminders: at (an RFC 3339 time)
// or delaySeconds, not both.
type reminderBody struct {
	SessionID    string   `json:"sessionId"`
	At           *string  `json:"at"`
	DelaySeconds *float64 `json:"delaySeconds"`
	Message      string   `json:"message"`
}

const reminderFields = "sessionId, at or delaySeconds, and message"

// maxDelaySeconds caps delaySeconds at about 100 years, far inside a
// time.Duration.
const maxDelaySeconds = 100 * 366 * 24 * 3600

func (s *Server) createReminder(w http.ResponseWriter, r *http.Request) {
	var b reminderBody
	if err := s.decodeBody(w, r, &b, reminderFields); err != nil {
		s.fail(w, r, err)
		return
	}
	req := agent.ReminderRequest{SessionID: b.SessionID, Message: b.Message}
	switch {
	case b.At != nil && b.DelaySeconds != nil:
		s.fail(w, r, badBody("at: give either at or delaySeconds, not both"))
		return
	case b.At == nil && b.DelaySeconds == nil:
		s.fail(w, r, badBody("at: missing; give at (an RFC 3339 time such as 2030-01-02T15:04:05Z) or delaySeconds"))
		return
	case b.At != nil:
		at, err := time.Parse(time.RFC3339Nano, *b.At)
		if err != nil {
			s.fail(w, r, badBody("at: %q is not an RFC 3339 time; use a form such as 2030-01-02T15:04:05Z", clip(*b.At)))
			return
		}
		req.At = at
	default:
		d := *b.DelaySeconds
		if math.IsNaN(d) || d < 0 || d > maxDelaySeconds {
			s.fail(w, r, badBody("delaySeconds: %v is out of range; use 0 to %d", d, maxDelaySeconds))
			return
		}
		req.Delay = time.Duration(d * float64(time.Second)) // zero: now
	}
	rem, err := s.rt.CreateReminder(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, rem)
}

// reminderList is GET /v1/reminders.
type reminderList struct {
	Reminders []agent.Reminder `json:"reminders"`
}

func (s *Server) listReminders(w http.ResponseWriter, r *http.Request) {
	rems, err := s.rt.ListReminders(r.Context(), r.URL.Query().Get("sessionId"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if rems == nil {
		rems = []agent.Reminder{}
	}
	writeJSON(w, http.StatusOK, reminderList{Reminders: rems})
}

func (s *Server) deleteReminder(w http.ResponseWriter, r *http.Request) {
	if err := s.rt.DeleteReminder(r.Context(), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// clip shortens a client's value quoted in an error.
func clip(s string) string {
	if utf8.RuneCountInString(s) <= 64 {
		return s
	}
	return string([]rune(s)[:64]) + "…"
}
