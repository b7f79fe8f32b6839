package evals

import (
	"encoding/json"
	"fmt"
	"time"

	"agentkit/internal/jsonerr"
	"agentkit/model"
)

// FormatVersion is the format version ("v") of a run snapshot. A build
// refuses to rewrite a snapshot with a higher version.
const FormatVersion = 1

// Status is a run's state.
type Status string

// The states of a run.
const (
	// StatusRunning: cases are running; the owning host's heartbeat says it
	// is alive.
	StatusRunning Status = "running"
	// StatusFinished: every case ran and was graded (passed, failed or
	// errored).
	StatusFinished Status = "finished"
	// StatusFailed: the run stopped on an error before every case ran,
	// such as the runtime refusing new sessions; Error says why.
	StatusFailed Status = "failed"
	// StatusInterrupted: the run was stopped (its server shut down, its
	// context ended) or its host died while it ran; cases not run are
	// left pending.
	StatusInterrupted Status = "interrupted"
)

// CaseStatus is one case's state in a run.
type CaseStatus string

// The states of a case.
const (
	CasePending CaseStatus = "pending" // not started
	CaseRunning CaseStatus = "running" // its turn runs
	CasePassed  CaseStatus = "passed"  // the turn completed and every grader passed
	CaseFailed  CaseStatus = "failed"  // the turn completed and a grader failed
	// CaseErrored: the case could not be graded: its turn failed (a model
	// error, the step limit, rate limits that outlasted every retry) or a
	// Go grader returned an error. Counted apart from failed answers.
	CaseErrored CaseStatus = "errored"
)

// MaxAnswerBytes is how much of each answer a run snapshot keeps.
const MaxAnswerBytes = 16 << 10

// Run is an eval run's snapshot: what is stored through the eval-run table
// when the run starts, after each case, on every heartbeat and when it
// ends, and what GET /v1/evals/{runId} answers.
type Run struct {
	// V is the snapshot format version, FormatVersion.
	V int `json:"v"`
	// ID is the run id: its start time and a random suffix.
	ID     string `json:"runId"`
	Status Status `json:"status"`
	// Name labels the run, such as the cases file's name.
	Name string `json:"name,omitempty"`
	// Source says who started it: "cli", "api" or "go".
	Source string `json:"source"`
	// Agent and Model name the agent and the model that answered.
	Agent string `json:"agent"`
	Model string `json:"model"`
	// Host is the host running the cases; HeartbeatAt is refreshed while
	// they run, so other hosts on a shared store can tell a live run from
	// one whose host died.
	Host        Host      `json:"host"`
	HeartbeatAt time.Time `json:"heartbeatAt"`
	StartedAt   time.Time `json:"startedAt"`
	FinishedAt  time.Time `json:"finishedAt,omitzero"`
	// Concurrency is how many cases ran at once, at most.
	Concurrency int    `json:"concurrency"`
	Counts      Counts `json:"counts"`
	// Cases are the per-case results, in the order the cases were given.
	Cases []CaseResult `json:"cases"`
	// Error says why the run failed or was interrupted.
	Error string `json:"error,omitempty"`
}

// Host names the host that owns a run.
type Host struct {
	// ID is the runtime's host id (agent.Runtime.HostID): stable for a
	// state root across its processes. A process that holds the same state
	// root on the same machine knows the owner is gone (the state root is
	// locked by one process at a time). The state root's path is not
	// stored: API clients read runs, and host paths are not theirs to see.
	ID string `json:"id"`
	// Name is the machine's host name.
	Name string `json:"name"`
	// PID is the owner's process id.
	PID int `json:"pid"`
}

// Counts are a run's case counts. Done = Passed + Failed + Errored.
type Counts struct {
	Total   int `json:"total"`
	Done    int `json:"done"`
	Passed  int `json:"passed"`
	Failed  int `json:"failed"`
	Errored int `json:"errored"`
}

// PassRate is Passed / Done, or 0 before any case is done.
func (c Counts) PassRate() float64 {
	if c.Done == 0 {
		return 0
	}
	return float64(c.Passed) / float64(c.Done)
}

// CaseResult is one case's result.
type CaseResult struct {
	Name   string     `json:"name"`
	Input  string     `json:"input"`
	Expect *Expect    `json:"expect,omitempty"`
	Status CaseStatus `json:"status"`
	// SessionID is the session of the case's last attempt, on channel
	// "eval"; its events show what happened.
	SessionID string `json:"sessionId,omitempty"`
	// Answer is the turn's result (the final text, or the failure
	// message), cut to MaxAnswerBytes (AnswerTruncated).
	Answer          string `json:"answer"`
	AnswerTruncated bool   `json:"answerTruncated,omitempty"`
	Grade           *Grade `json:"grade,omitempty"`
	// Error says why the case errored.
	Error string `json:"error,omitempty"`
	// LatencyMs is the last attempt's turn latency; Usage its tokens.
	LatencyMs int64       `json:"latencyMs"`
	Usage     model.Usage `json:"usage"`
	// Attempts counts the tries: more than one when rate limits (429) or
	// server errors made the runner back off and retry.
	Attempts   int       `json:"attempts"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

// Summary is a run without its cases, as GET /v1/evals lists it.
type Summary struct {
	ID          string    `json:"runId"`
	Status      Status    `json:"status"`
	Name        string    `json:"name,omitempty"`
	Source      string    `json:"source"`
	Model       string    `json:"model"`
	Host        Host      `json:"host"`
	HeartbeatAt time.Time `json:"heartbeatAt"`
	StartedAt   time.Time `json:"startedAt"`
	FinishedAt  time.Time `json:"finishedAt,omitzero"`
	Counts      Counts    `json:"counts"`
	// PassRate is Counts.PassRate.
	PassRate float64 `json:"passRate"`
	Error    string  `json:"error,omitempty"`
}

// Summary returns the run without its cases.
func (r Run) Summary() Summary {
	return Summary{
		ID: r.ID, Status: r.Status, Name: r.Name, Source: r.Source, Model: r.Model,
		Host: r.Host, HeartbeatAt: r.HeartbeatAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		Counts: r.Counts, PassRate: r.Counts.PassRate(), Error: r.Error,
	}
}

// Failed reports whether a case failed or errored, or the run did not
// finish: what makes agentkit eval exit with status 1.
func (r Run) Failed() bool {
	return r.Status != StatusFinished || r.Counts.Failed > 0 || r.Counts.Errored > 0 || r.Counts.Done < r.Counts.Total
}

// clone returns a copy of r sharing nothing mutable.
func (r Run) clone() Run {
	r.Cases = append([]CaseResult(nil), r.Cases...)
	return r
}

// decodeRun reads a stored snapshot.
func decodeRun(id string, data []byte) (Run, error) {
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return Run{}, fmt.Errorf("evals: the stored run %q is not a run snapshot: %s", id, jsonerr.Describe(err, "the record"))
	}
	if r.V > FormatVersion {
		return Run{}, fmt.Errorf("evals: the stored run %q has format version %d and this build reads up to %d; upgrade agentkit on this host", id, r.V, FormatVersion)
	}
	if r.ID == "" {
		r.ID = id
	}
	return r, nil
}
