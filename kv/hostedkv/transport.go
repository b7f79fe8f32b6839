package hostedkv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"agentkit/kv"
	"agentkit/kv/hostedkv/wire"
)

// call is one protocol request, sent again on retryable failures.
type call struct {
	method   string
	resource string // info, kv, list, evals, …
	query    url.Values
	headers  map[string]string
	body     []byte
	// write marks a request that changes state. It gets a request id,
	// and an exhausted retry whose copy may have reached the service
	// reports ErrOutcomeUnknown.
	write bool
	// reqID overrides the fresh request id of a write.
	reqID string
	// stream leaves the answer's body to the caller. Otherwise do reads
	// the whole body within the attempt, so a body cut short is retried
	// like any other transport failure.
	stream bool
}

// ServiceError is an error answer of the service: its status and the
// protocol's error code and message. errors.Is matches the kv sentinel the
// code stands for (kv.ErrNotFound, kv.ErrConflict, kv.ErrTooLarge, …).
type ServiceError struct {
	Status  int
	Code    string
	Message string
	// Limit is the limit that was passed, when the code names one.
	Limit    int64
	sentinel []error
}

// Error formats the answer as "storage service: 412 exists: the key exists".
func (e *ServiceError) Error() string {
	return fmt.Sprintf("storage service: %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap returns the sentinels the code stands for.
func (e *ServiceError) Unwrap() []error { return e.sentinel }

// errorFrom turns an error answer into a *ServiceError.
func (s *Store) errorFrom(resp *http.Response) error {
	var body wire.ErrorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err := json.Unmarshal(data, &body); err != nil || body.Error.Code == "" {
		body.Error = wire.ErrorDetail{Code: "http_" + fmt.Sprint(resp.StatusCode), Message: http.StatusText(resp.StatusCode) + " (not an answer of the storage protocol; is the address a storaged?)"}
	}
	e := &ServiceError{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message, Limit: body.Error.Limit}
	switch e.Code {
	case wire.CodeNotFound:
		e.sentinel = []error{kv.ErrNotFound}
	case wire.CodeExists:
		e.sentinel = []error{kv.ErrConflict, kv.ErrExists}
	case wire.CodeVersionMismatch:
		e.sentinel = []error{kv.ErrConflict}
	case wire.CodeTooLarge:
		e.sentinel = []error{kv.ErrTooLarge}
	case wire.CodeInvalidKey, wire.CodeKeyTooLong:
		e.sentinel = []error{kv.ErrInvalidKey}
	case wire.CodeUnauthorized:
		e.sentinel = []error{ErrUnauthorized}
	case wire.CodeForbidden:
		e.sentinel = []error{ErrForbidden}
	}
	return e
}

// retryable reports whether an answer's status means "try again": the
// request was not served, or not completely.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// do sends c, retrying transport errors and retryable statuses with
// backoff until s.retryFor has passed or ctx ends. It returns the first
// answer that is not retryable; the caller closes its body. A write keeps
// one request id across its copies, so the service applies it once.
func (s *Store) do(ctx context.Context, c call) (*http.Response, error) {
	if c.write && c.reqID == "" {
		c.reqID = newRequestID()
	}
	deadline := time.Now().Add(s.retryFor)
	// uncertain is set once a copy of a write may have reached the
	// service without its answer reaching us.
	uncertain := false
	var last error
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, s.giveUp(err, last, c.write && uncertain)
		}
		req, err := s.newRequest(ctx, c)
		if err != nil {
			return nil, err
		}
		resp, err := s.hc.Do(req)
		if err == nil && !c.stream {
			err = bufferBody(resp)
		}
		switch {
		case err != nil:
			if cerr := ctx.Err(); cerr != nil {
				return nil, s.giveUp(cerr, err, c.write && (uncertain || !notSent(err)))
			}
			last = err
			if !notSent(err) {
				uncertain = true
			}
		case retryable(resp.StatusCode):
			last = s.errorFrom(resp)
			drain(resp)
			// A 503 of the backend may follow a write the database
			// committed without telling the service; a 429 or a
			// proxy's 502/504 may follow a request the service got.
			if resp.StatusCode != http.StatusTooManyRequests {
				uncertain = true
			}
			if ra := resp.Header.Get("Retry-After"); ra != "" && backoff < time.Second {
				backoff = time.Second
			}
		default:
			return resp, nil
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if time.Now().Add(wait).After(deadline) {
			return nil, s.giveUp(nil, fmt.Errorf("gave up after %d attempts in %v: %w", attempt, s.retryFor, last), c.write && uncertain)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, s.giveUp(ctx.Err(), last, c.write && uncertain)
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}

// giveUp builds the error of a request that got no usable answer: ctx's
// error when it ended, the last failure, and ErrOutcomeUnknown when a copy
// of a write may have been applied.
func (s *Store) giveUp(ctxErr, last error, unknown bool) error {
	var errs []error
	if unknown {
		errs = append(errs, ErrOutcomeUnknown)
	}
	if ctxErr != nil {
		errs = append(errs, ctxErr)
	}
	if last != nil {
		errs = append(errs, last)
	}
	switch len(errs) {
	case 1:
		return errs[0]
	case 2:
		return fmt.Errorf("%w: %w", errs[0], errs[1])
	default:
		return fmt.Errorf("%w: %w: %w", errs[0], errs[1], errs[2])
	}
}

// notSent reports whether a transport error proves the request never left:
// the connection could not be made.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

func (s *Store) newRequest(ctx context.Context, c call) (*http.Request, error) {
	u := s.base + s.nsPath + c.resource
	if len(c.query) > 0 {
		u += "?" + c.query.Encode()
	}
	var body io.Reader
	if c.body != nil {
		body = bytes.NewReader(c.body)
	} else if c.method == http.MethodPut || c.method == http.MethodPost {
		body = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, c.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("hostedkv: building the request: %w", err)
	}
	req.Header.Set("Authorization", s.auth)
	if c.body != nil {
		req.Header.Set("Content-Type", wire.ContentValue)
	}
	if c.reqID != "" {
		req.Header.Set(wire.HeaderRequestID, c.reqID)
	}
	for k, v := range c.headers {
		req.Header.Set(k, v)
	}
	return req, nil
}

// bufferBody reads the whole answer into memory, so a connection that
// breaks in the middle of the body fails the attempt.
func bufferBody(resp *http.Response) error {
	b, err := readBody(resp)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	return nil
}

// drain reads what is left of a small answer and closes it, so the
// connection goes back to the pool.
func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

func decodeJSON(r io.Reader, v any) error {
	return json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(v)
}
