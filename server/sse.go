package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"agentkit/agent"
)

// stream writes server-sent events. After a failed write (the client went
// away) it is broken and drops everything.
type stream struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	broken bool
}

// openStream sends the headers of an event stream.
func (s *Server) openStream(w http.ResponseWriter) *stream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	st := &stream{w: w, rc: http.NewResponseController(w)}
	// Streams outlive the server's write timeout, if it has one.
	_ = st.rc.SetWriteDeadline(time.Time{})
	st.flush()
	return st
}

// event sends one of a session's events: its type as the event name and
// its sequence number as the id, so a client reconnects with
// Last-Event-ID.
func (st *stream) event(ev agent.Event) {
	st.send(ev.Type, strconv.FormatInt(ev.Seq, 10), ev)
}

// send writes one event with a JSON data line.
func (st *stream) send(name, id string, v any) {
	if st.broken {
		return
	}
	var buf bytes.Buffer
	if id != "" {
		buf.WriteString("id: " + id + "\n")
	}
	buf.WriteString("event: " + name + "\n")
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteString("data: ")
	if err := enc.Encode(v); err != nil { // Encode ends the line
		return
	}
	buf.WriteString("\n")
	st.write(buf.Bytes())
}

// comment writes a comment line, which clients ignore.
func (st *stream) comment(text string) {
	if !st.broken {
		st.write([]byte(": " + text + "\n\n"))
	}
}

func (st *stream) write(b []byte) {
	if _, err := st.w.Write(b); err != nil {
		st.broken = true
		return
	}
	st.flush()
}

func (st *stream) flush() {
	if err := st.rc.Flush(); err != nil {
		st.broken = true
	}
}

func (s *Server) keepAliveTicker() *time.Ticker {
	return time.NewTicker(s.opts.KeepAlive)
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), sub)
}
