package hostedkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"agentkit/kv"
)

// line is one line of a streamed listing: an entry or run or record, or
// the trailer.
type line struct {
	Key      *string         `json:"key"`
	Value    []byte          `json:"value"`
	RunID    *string         `json:"runId"`
	Snapshot json.RawMessage `json:"snapshot"`
	Seq      *int64          `json:"seq"`
	Record   json.RawMessage `json:"record"`
	Next     *string         `json:"next"`
	End      bool            `json:"end"`
}

func (l *line) trailer() bool { return l.Key == nil && l.RunID == nil && l.Seq == nil }

// errCut is a page whose stream ended before its trailer.
var errCut = errors.New("hostedkv: the listing stream ended before its trailer")

// pages walks a paged, streamed listing: resource with the query from
// after= (empty: from the start), then after=CURSOR for each next page, yielding every line that is not a
// trailer. A page cut short (the connection dropped, the service
// restarted) is asked for again from the last line yielded, with the
// request's retry budget, so the caller sees each line once. cursor
// returns the after= value that resumes after a line.
func (s *Store) pages(ctx context.Context, resource string, query url.Values, after string, cursor func(*line) string) iter.Seq2[*line, error] {
	return func(yield func(*line, error) bool) {
		deadline := time.Time{}
		for {
			q := url.Values{}
			for k, v := range query {
				q[k] = v
			}
			if after != "" {
				q.Set("after", after)
			}
			q.Set("limit", strconv.Itoa(s.page))
			resp, err := s.do(ctx, call{method: http.MethodGet, resource: resource, query: q, stream: true})
			if err != nil {
				yield(nil, err)
				return
			}
			if resp.StatusCode != http.StatusOK {
				err := s.errorFrom(resp)
				drain(resp)
				yield(nil, err)
				return
			}
			dec := json.NewDecoder(resp.Body)
			var next *string
			done, stop := false, false
			var streamErr error
			for {
				var l line
				if err := dec.Decode(&l); err != nil {
					if err == io.EOF {
						err = errCut
					}
					streamErr = err
					break
				}
				if l.trailer() {
					done, next = l.End, l.Next
					break
				}
				if !yield(&l, nil) {
					stop = true
					break
				}
				after = cursor(&l)
				deadline = time.Time{}
			}
			resp.Body.Close()
			switch {
			case stop:
				return
			case streamErr != nil:
				if err := ctx.Err(); err != nil {
					yield(nil, err)
					return
				}
				if deadline.IsZero() {
					deadline = time.Now().Add(s.retryFor)
				}
				if time.Now().After(deadline) {
					yield(nil, fmt.Errorf("hostedkv: listing %s: %w", resource, streamErr))
					return
				}
				continue // ask again from the last line yielded
			case done:
				return
			case next == nil:
				yield(nil, errors.New("hostedkv: the listing's trailer has neither next nor end"))
				return
			}
			after = *next
		}
	}
}

// List yields the entries under prefix in ascending bytewise key order,
// page by page.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[kv.Entry, error] {
	return s.ListAfter(ctx, prefix, "")
}

// ListAfter yields the entries under prefix that sort after after, in
// ascending bytewise key order: the service starts the first page there.
func (s *Store) ListAfter(ctx context.Context, prefix, after string) iter.Seq2[kv.Entry, error] {
	return func(yield func(kv.Entry, error) bool) {
		q := url.Values{"prefix": {prefix}, "values": {"1"}}
		for l, err := range s.pages(ctx, "list", q, after, func(l *line) string { return *l.Key }) {
			if err != nil {
				yield(kv.Entry{}, err)
				return
			}
			v := l.Value
			if v == nil {
				v = []byte{}
			}
			if !yield(kv.Entry{Key: *l.Key, Value: v}, nil) {
				return
			}
		}
	}
}

// ListKeys yields the keys under prefix in ascending bytewise order.
func (s *Store) ListKeys(ctx context.Context, prefix string) iter.Seq2[string, error] {
	return s.ListKeysAfter(ctx, prefix, "")
}

// ListKeysAfter yields the keys under prefix that sort after after, in
// ascending bytewise order.
func (s *Store) ListKeysAfter(ctx context.Context, prefix, after string) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		q := url.Values{"prefix": {prefix}}
		for l, err := range s.pages(ctx, "list", q, after, func(l *line) string { return *l.Key }) {
			if err != nil {
				yield("", err)
				return
			}
			if !yield(*l.Key, nil) {
				return
			}
		}
	}
}
