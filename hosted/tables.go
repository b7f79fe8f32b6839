package hosted

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"unicode/utf8"

	"agentkit/kv/hostedkv/wire"
)

// The native tables: eval runs, A/B samples and snapshots, and the memory
// journal, each a real table of the backend keyed by namespace and agent.

// putEval serves PUT /v1/ns/{ns}/evals?agent=A&run=R with the snapshot as
// the body: create or replace.
func (c *call) putEval() {
	if !c.params("agent", "run") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	run, ok := c.name("run")
	if !ok {
		return
	}
	doc, ok := c.jsonBody()
	if !ok {
		return
	}
	if err := c.s.st.putEval(c.r.Context(), c.ns, agent, run, doc); err != nil {
		c.backendFailed(err)
		return
	}
	c.w.WriteHeader(http.StatusNoContent)
}

// deleteEval serves DELETE /v1/ns/{ns}/evals?agent=A&run=R.
func (c *call) deleteEval() {
	if !c.params("agent", "run") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	run, ok := c.name("run")
	if !ok {
		return
	}
	if err := c.s.st.deleteEval(c.r.Context(), c.ns, agent, run); err != nil {
		c.backendFailed(err)
		return
	}
	c.w.WriteHeader(http.StatusNoContent)
}

// listEvals serves GET /v1/ns/{ns}/evals?agent=A&after=R&limit=N: the
// agent's runs in run id order, as NDJSON lines and a trailer.
func (c *call) listEvals() {
	if !c.params("agent", "after", "limit") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	after := c.q.Get("after")
	if len(after) > maxNameBytes || !utf8.ValidString(after) {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the after cursor is not a run id")
		return
	}
	limit, ok := c.limit()
	if !ok {
		return
	}
	runs, more, err := c.s.st.listEvals(c.r.Context(), c.ns, agent, after, limit)
	if err != nil {
		c.backendFailed(err)
		return
	}
	lines := make([]any, len(runs))
	for i, r := range runs {
		lines[i] = wire.EvalRun{RunID: r.runID, Snapshot: r.snapshot}
	}
	var next string
	if more {
		next = runs[len(runs)-1].runID
	}
	c.stream(lines, more, next)
}

// putSample serves POST /v1/ns/{ns}/ab-samples with one sample as the body.
// Samples are keyed by agent, experiment, session and time, so a resent
// sample is stored once.
func (c *call) putSample() {
	if !c.params() {
		return
	}
	b, ok := c.jsonBody()
	if !ok {
		return
	}
	var in wire.ABSample
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the sample does not decode: %v", err)
		return
	}
	for _, f := range []struct{ name, v string }{{"agent", in.Agent}, {"experiment", in.Experiment}, {"sessionId", in.SessionID}} {
		if f.v == "" || len(f.v) > maxNameBytes {
			c.fail(http.StatusBadRequest, wire.CodeBadRequest, maxNameBytes, "the sample's %s is empty or over %d bytes", f.name, maxNameBytes)
			return
		}
	}
	if len(in.Variant) > maxNameBytes || in.At.IsZero() || len(in.Metrics) == 0 || !json.Valid(in.Metrics) {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "the sample needs a variant of at most %d bytes, an at time and a metrics document", maxNameBytes)
		return
	}
	err := c.s.st.putSample(c.r.Context(), c.ns, sample{agent: in.Agent, experiment: in.Experiment, variant: in.Variant,
		sessionID: in.SessionID, at: in.At, metrics: in.Metrics})
	if err != nil {
		c.backendFailed(err)
		return
	}
	c.w.WriteHeader(http.StatusNoContent)
}

// putSnapshot serves PUT /v1/ns/{ns}/ab-snapshot?agent=A: last write wins.
func (c *call) putSnapshot() {
	if !c.params("agent") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	doc, ok := c.jsonBody()
	if !ok {
		return
	}
	if err := c.s.st.putSnapshot(c.r.Context(), c.ns, agent, doc); err != nil {
		c.backendFailed(err)
		return
	}
	c.w.WriteHeader(http.StatusNoContent)
}

// getSnapshot serves GET /v1/ns/{ns}/ab-snapshot?agent=A.
func (c *call) getSnapshot() {
	if !c.params("agent") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	doc, err := c.s.st.getSnapshot(c.r.Context(), c.ns, agent)
	if errors.Is(err, errNotFound) {
		c.fail(http.StatusNotFound, wire.CodeNotFound, 0, "the agent has no A/B snapshot")
		return
	}
	if err != nil {
		c.backendFailed(err)
		return
	}
	c.w.Header().Set("Content-Type", wire.ContentJSON)
	c.w.WriteHeader(http.StatusOK)
	c.w.Write(doc)
}

// appendMemory serves POST /v1/ns/{ns}/memory?agent=A with one record (a
// JSON object) as the body and a request id, and answers {"seq": N}.
func (c *call) appendMemory() {
	if !c.params("agent") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	id, ok := c.requestID()
	if !ok {
		return
	}
	doc, ok := c.jsonBody()
	if !ok {
		return
	}
	if t := bytes.TrimSpace(doc); len(t) == 0 || t[0] != '{' {
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "a memory record is a JSON object")
		return
	}
	seq, replayed, err := c.s.st.appendMemory(c.r.Context(), c.ns, agent, id, doc)
	if err != nil {
		c.backendFailed(err)
		return
	}
	c.replayed = replayed
	if replayed {
		c.w.Header().Set(wire.HeaderReplayed, "true")
	}
	c.writeJSON(http.StatusOK, wire.MemoryAppended{Seq: seq})
}

// listMemory serves GET /v1/ns/{ns}/memory?agent=A&after=N&limit=M: the
// agent's records after sequence number N, in order.
func (c *call) listMemory() {
	if !c.params("agent", "after", "limit") {
		return
	}
	agent, ok := c.name("agent")
	if !ok {
		return
	}
	var after int64
	if a := c.q.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "after must be a sequence number")
			return
		}
		after = n
	}
	limit, ok := c.limit()
	if !ok {
		return
	}
	recs, more, err := c.s.st.listMemory(c.r.Context(), c.ns, agent, after, limit)
	if err != nil {
		c.backendFailed(err)
		return
	}
	lines := make([]any, len(recs))
	for i, r := range recs {
		lines[i] = wire.MemoryLine{Seq: r.seq, Record: r.record}
	}
	var next string
	if more {
		next = strconv.FormatInt(recs[len(recs)-1].seq, 10)
	}
	c.stream(lines, more, next)
}

// stream writes NDJSON lines and the trailer.
func (c *call) stream(lines []any, more bool, next string) {
	c.w.Header().Set("Content-Type", wire.ContentNDJSON)
	c.w.WriteHeader(http.StatusOK)
	out := bufio.NewWriterSize(c.w, 32<<10)
	enc := json.NewEncoder(out)
	for _, l := range lines {
		if err := enc.Encode(l); err != nil {
			return
		}
	}
	t := wire.Trailer{End: !more}
	if more {
		t.Next = &next
	}
	enc.Encode(t)
	out.Flush()
}
