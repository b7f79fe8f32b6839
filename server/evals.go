package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"agentkit/evals"
)

// Error codes of the eval routes.
const (
	CodeRunNotFound = "run_not_found" // 404: no eval run has the id
	CodeEvalsBusy   = "evals_busy"    // 409: too many eval runs running
)

// EvalOptions tunes the eval runs of POST /v1/evals (package evals). Zero
// fields take the package's defaults.
type EvalOptions struct {
	// HistoryWindow is how many runs are kept, the newest; default 50.
	HistoryWindow int
	// Heartbeat is how often a running run's snapshot is refreshed;
	// default 10s. Another host marks the run interrupted after three
	// missed heartbeats.
	Heartbeat time.Duration
	// MaxAttempts is how many times a case is tried when its turn fails on
	// a rate limit or a server error; default 5.
	MaxAttempts int
	// Backoff returns the pause after a failed attempt; nil means 1s, 2s,
	// 4s… up to 30s, with jitter.
	Backoff func(attempt int) time.Duration
}

// openEvals creates the eval manager and runs its start-up pass over the
// stored runs (listing them back, marking interrupted the runs whose
// process died), and checks the CORS origins.
func (s *Server) openEvals() error {
	cors, err := newCORS(s.opts.CORSOrigins)
	if err != nil {
		return err
	}
	s.cors = cors
	e := s.opts.Evals
	m, err := evals.ForRuntime(s.rt, evals.Options{
		HistoryWindow: e.HistoryWindow,
		Heartbeat:     e.Heartbeat,
		MaxAttempts:   e.MaxAttempts,
		Backoff:       e.Backoff,
		TurnContext:   s.turns,
		Logger:        s.log,
	})
	if err != nil {
		return errors.New("server: Options.Evals: " + err.Error())
	}
	s.evals = m
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runs, err := m.Recover(ctx)
	if err != nil {
		s.log.Warn("server: listing the stored eval runs failed; GET /v1/evals retries", "error", err)
		return nil
	}
	interrupted := 0
	for _, r := range runs {
		if r.Status == evals.StatusInterrupted {
			interrupted++
		}
	}
	s.log.Info("eval history loaded", "runs", len(runs), "interrupted", interrupted, "historyWindow", m.HistoryWindow())
	return nil
}

// Shutdown stops the server's eval runs (no new case starts; running cases
// finish and are graded; the runs are stored as interrupted) and waits for
// them until ctx ends, then cancels their running turns and waits again.
// Call it once the HTTP server has shut down and before closing the
// runtime; Serve does.
func (s *Server) Shutdown(ctx context.Context) error {
	s.evals.Stop()
	if err := s.evals.Wait(ctx); err != nil {
		s.cancelTurns(errShuttingDown)
		return s.evals.Wait(context.Background())
	}
	return nil
}

// startEvalBody is the JSON body of POST /v1/evals.
type startEvalBody struct {
	Name        string          `json:"name"`
	Cases       json.RawMessage `json:"cases"`
	Concurrency int             `json:"concurrency"`
}

const startEvalFields = "name, cases and concurrency"

// startEval answers POST /v1/evals: a JSON object with cases (an array of
// {name, input, expect}), or a cases file as the body with a JSONL media
// type. The run starts in the background: 202 with its first snapshot.
func (s *Server) startEval(w http.ResponseWriter, r *http.Request) {
	var cases []evals.Case
	so := evals.StartOptions{Source: "api"}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch mt {
	case "application/x-ndjson", "application/jsonl", "application/x-jsonlines", "text/plain":
		data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
		if err != nil {
			s.failEvals(w, r, readErr(err))
			return
		}
		if cases, err = evals.ParseCases(bytes.NewReader(data), "the request body"); err != nil {
			s.failEvals(w, r, err)
			return
		}
		so.Name = r.URL.Query().Get("name")
	default:
		var b startEvalBody
		if err := s.decodeBody(w, r, &b, startEvalFields); err != nil {
			s.fail(w, r, err)
			return
		}
		if len(bytes.TrimSpace(b.Cases)) == 0 {
			s.fail(w, r, badBody(`cases: missing; send {"cases": [{"name": "greets", "input": "hello", "expect": {"contains": "hello"}}]}, or a cases file with Content-Type: application/x-ndjson`))
			return
		}
		var err error
		if cases, err = evals.DecodeCases(b.Cases); err != nil {
			s.failEvals(w, r, err)
			return
		}
		so.Name, so.Concurrency = b.Name, b.Concurrency
	}
	run, err := s.evals.Start(r.Context(), cases, so)
	if err != nil {
		s.failEvals(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/evals/"+run.ID)
	writeJSON(w, http.StatusAccepted, run)
}

func readErr(err error) error {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return mb
	}
	return badBody("reading the request body failed: %v", err)
}

// evalList is GET /v1/evals.
type evalList struct {
	Runs []evals.Summary `json:"runs"`
	// HistoryWindow is how many runs are kept.
	HistoryWindow int `json:"historyWindow"`
}

func (s *Server) listEvals(w http.ResponseWriter, r *http.Request) {
	runs, err := s.evals.List(r.Context())
	if err != nil {
		s.failEvals(w, r, err)
		return
	}
	out := evalList{Runs: make([]evals.Summary, 0, len(runs)), HistoryWindow: s.evals.HistoryWindow()}
	for _, run := range runs {
		out.Runs = append(out.Runs, run.Summary())
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getEval(w http.ResponseWriter, r *http.Request) {
	run, err := s.evals.Get(r.Context(), r.PathValue("runId"))
	if err != nil {
		s.failEvals(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

// failEvals answers an error of the eval routes.
func (s *Server) failEvals(w http.ResponseWriter, r *http.Request, err error) {
	var ce *evals.CaseError
	var mb *http.MaxBytesError
	var be *bodyError
	switch {
	case errors.As(err, &mb), errors.As(err, &be):
		s.fail(w, r, err)
	case errors.As(err, &ce):
		writeError(w, http.StatusBadRequest, CodeInvalid, "cases: "+ce.Error())
	case errors.Is(err, evals.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeRunNotFound, "no eval run has this id; GET /v1/evals lists the runs kept")
	case errors.Is(err, evals.ErrBusy):
		writeError(w, http.StatusConflict, CodeEvalsBusy, err.Error())
	case errors.Is(err, evals.ErrClosed):
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, CodeShuttingDown, "the server is shutting down; start the run on another host or after the restart")
	case errors.Is(err, evals.ErrInvalid):
		writeError(w, http.StatusBadRequest, CodeInvalid, strings.TrimPrefix(err.Error(), "evals: "))
	default:
		s.log.Warn("server: the eval-run table failed", "requestId", requestID(r.Context()), "error", err)
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the store is unavailable; retry later (the server log has the details)")
	}
}

// abs answers GET /v1/abs: the A/B figures of every experiment, merged
// from every host's snapshot and this host's latest state.
func (s *Server) abs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.rt.ABReport(r.Context()))
}
