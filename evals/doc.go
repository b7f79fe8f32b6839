// Package evals runs eval batches through an agent and keeps their history
// (spec 08-evals-ab.md).
//
// A Case is a message and what its answer must satisfy: exact, contains
// and regexp graders from a JSONL cases file (ParseCases), or a GradeFunc
// written in Go. A Manager runs a batch of cases as one run: each case is
// the first turn of a fresh session on channel "eval" (never enrolled in an
// A/B experiment), at most Concurrency cases at a time (4 by default). A
// turn that fails on a rate limit or a server error (agent.Turn.Retryable)
// is retried in a new session after a backoff that holds every run's new
// turns; a case whose turn failed for good is counted as errored, apart
// from one whose answer failed a grader.
//
// The run's snapshot (Run: status, times, counts, per-case results with
// session id, answer, grade, latency and tokens) is stored through the
// agent's eval-run table (storage.EvalRuns: the backend's native table or
// the one derived over the kv core) when the run starts, after each case,
// on every heartbeat and when it ends. Runs past the history window (50 by
// default) are deleted. A run names its host and carries a heartbeat:
// Recover, called when a server starts, lists every stored run back, marks
// interrupted a run left running by an earlier process on the same state
// root, and marks interrupted another host's run only once its heartbeat is
// older than StaleAfter, with a conditional write that leaves the run alone
// if its host wrote in between. docs/evals.md walks through a first run.
package evals
