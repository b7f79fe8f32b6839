package memory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"agentkit/model"
)

// Status values of a Record.
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed"
)

// DefaultMaxTextLength is the default cut, in characters (runes), for a
// record's userMessage and result.
const DefaultMaxTextLength = 2000

// timeLayout is the record's `at`: RFC 3339, UTC, exactly three
// millisecond digits.
const timeLayout = "2006-01-02T15:04:05.000Z"

// Record is one line of the journal: one turn that completed or failed.
//
// Its JSON form (MarshalJSON, Line) has the fields in this order: at,
// sessionId, channelId, status, title (omitted when empty), userMessage,
// result, usage (written for completed turns only). At is written as
// RFC 3339 UTC with exactly three millisecond digits, such as
// 2026-10-01T16:42:09.118Z; finer digits are truncated.
type Record struct {
	// At is when the turn finished.
	At time.Time
	// SessionID is the session that ran the turn.
	SessionID string
	// ChannelID is the channel that started the session ("http" for the
	// session API).
	ChannelID string
	// Status is StatusCompleted or StatusFailed.
	Status string
	// Title is the session title; empty when the channel set none.
	Title string
	// UserMessage is the message that started the turn.
	UserMessage string
	// Result is the final assistant text of a completed turn, or the
	// failure message of a failed one.
	Result string
	// Usage is the turn's token usage. It is written only when Status is
	// StatusCompleted, and reads back as zero for failed turns.
	Usage model.Usage
}

// TurnInfo is what the runtime knows about a finished turn. NewRecord and
// Hook.AfterTurn turn it into a Record.
type TurnInfo struct {
	SessionID   string
	ChannelID   string
	Title       string
	UserMessage string
	// Result is the final assistant text. It is ignored when Err is set.
	Result string
	// Err is nil for a completed turn. A non-nil Err marks the turn failed,
	// and its message becomes the record's result.
	Err error
	// Usage is the turn's token usage, summed over its model calls.
	Usage model.Usage
	// FinishedAt is when the turn finished; the zero value means now.
	FinishedAt time.Time
}

// NewRecord builds the record of a finished turn. userMessage and result
// are cut to maxText characters (runes); maxText <= 0 means
// DefaultMaxTextLength. The title is kept whole, as the memory contract
// says (the session API accepts titles of up to 1024 bytes). A turn with a
// non-nil Err is failed, its result is Err's message and it carries no
// usage. At is FinishedAt (or now) in UTC, truncated to the millisecond.
//
// Invalid UTF-8 in the text fields is repaired rather than kept: each byte
// that is not part of a valid sequence counts as one character and becomes
// U+FFFD, the same substitution encoding/json makes. A cut therefore never
// leaves a torn sequence, and the record holds only valid UTF-8.
func NewRecord(t TurnInfo, maxText int) Record {
	if maxText <= 0 {
		maxText = DefaultMaxTextLength
	}
	at := t.FinishedAt
	if at.IsZero() {
		at = time.Now()
	}
	r := Record{
		At:          at.UTC().Truncate(time.Millisecond),
		SessionID:   t.SessionID,
		ChannelID:   t.ChannelID,
		Status:      StatusCompleted,
		Title:       cut(t.Title, len(t.Title)), // repaired, not cut
		UserMessage: cut(t.UserMessage, maxText),
		Result:      cut(t.Result, maxText),
		Usage:       t.Usage,
	}
	if t.Err != nil {
		r.Status = StatusFailed
		r.Result = cut(t.Err.Error(), maxText)
		r.Usage = model.Usage{}
	}
	return r
}

// cut returns s cut to at most n characters (runes), with each byte of an
// invalid UTF-8 sequence counted as one character and replaced by U+FFFD.
// The result is always valid UTF-8.
func cut(s string, n int) string {
	if utf8.ValidString(s) && utf8.RuneCountInString(s) <= n {
		return s
	}
	var b []byte
	for i, chars := 0, 0; i < len(s) && chars < n; chars++ {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}

// wireRecord fixes the JSON field order and names.
type wireRecord struct {
	At          string       `json:"at"`
	SessionID   string       `json:"sessionId"`
	ChannelID   string       `json:"channelId"`
	Status      string       `json:"status"`
	Title       string       `json:"title,omitempty"`
	UserMessage string       `json:"userMessage"`
	Result      string       `json:"result"`
	Usage       *model.Usage `json:"usage,omitempty"`
}

// errStatus is returned for a record whose status is neither value.
var errStatus = errors.New(`memory: record status must be "completed" or "failed"`)

// MarshalJSON encodes r in the journal's field order. It fails when Status
// is not StatusCompleted or StatusFailed, or At's year is outside 0-9999.
// It does not escape <, > and & (the journal is read by a model, not
// embedded in HTML); json.Marshal(r) re-escapes them, while Line does not.
func (r Record) MarshalJSON() ([]byte, error) {
	b, err := r.Line()
	if err != nil {
		return nil, err
	}
	return b[:len(b)-1], nil
}

// Line returns the exact bytes the journal writes for r: its JSON object
// and a newline. The JSON never contains a raw newline, so one record is
// always one line.
func (r Record) Line() ([]byte, error) {
	if r.Status != StatusCompleted && r.Status != StatusFailed {
		return nil, fmt.Errorf("%w, got %q", errStatus, r.Status)
	}
	at := r.At.UTC()
	if y := at.Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("memory: record time %v is outside years 0-9999", r.At)
	}
	w := wireRecord{
		At:          at.Format(timeLayout),
		SessionID:   r.SessionID,
		ChannelID:   r.ChannelID,
		Status:      r.Status,
		Title:       r.Title,
		UserMessage: r.UserMessage,
		Result:      r.Result,
	}
	if r.Status == StatusCompleted {
		u := r.Usage
		w.Usage = &u
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, fmt.Errorf("memory: encoding record: %w", err)
	}
	return buf.Bytes(), nil
}

// UnmarshalJSON decodes one journal record. It accepts any RFC 3339 `at`,
// and requires the status to be one of the two values.
func (r *Record) UnmarshalJSON(b []byte) error {
	var w wireRecord
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if w.Status != StatusCompleted && w.Status != StatusFailed {
		return fmt.Errorf("%w, got %q", errStatus, w.Status)
	}
	at, err := time.Parse(time.RFC3339Nano, w.At)
	if err != nil {
		return fmt.Errorf("memory: record time: %w", err)
	}
	*r = Record{
		At:          at.UTC(),
		SessionID:   w.SessionID,
		ChannelID:   w.ChannelID,
		Status:      w.Status,
		Title:       w.Title,
		UserMessage: w.UserMessage,
		Result:      w.Result,
	}
	if w.Usage != nil {
		r.Usage = *w.Usage
	}
	return nil
}
