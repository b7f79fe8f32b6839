package hosted

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"agentkit/kv/hostedkv/wire"
)

// get serves GET /v1/ns/{ns}/kv?key=K: the value as the body, its version
// in Agentkit-Version.
func (c *call) get() {
	if !c.params("key") {
		return
	}
	key, ok := c.key()
	if !ok {
		return
	}
	v, ver, err := c.s.st.get(c.r.Context(), c.ns, key)
	if errors.Is(err, errNotFound) {
		c.fail(http.StatusNotFound, wire.CodeNotFound, 0, "the key does not exist")
		return
	}
	if err != nil {
		c.backendFailed(err)
		return
	}
	h := c.w.Header()
	h.Set("Content-Type", wire.ContentValue)
	h.Set("Content-Length", strconv.Itoa(len(v)))
	h.Set(wire.HeaderVersion, wire.FormatVersion(c.s.st.epoch(), ver))
	c.w.WriteHeader(http.StatusOK)
	c.w.Write(v)
}

// put serves PUT /v1/ns/{ns}/kv?key=K, plain or conditional.
func (c *call) put() {
	if !c.params("key") {
		return
	}
	key, ok := c.key()
	if !ok {
		return
	}
	id, ok := c.requestID()
	if !ok {
		return
	}
	w := writeReq{ns: c.ns, key: key, reqID: id, op: opPut}
	absent, ifVer := c.r.Header.Get(wire.HeaderIfAbsent), c.r.Header.Get(wire.HeaderIfVersion)
	switch {
	case absent != "" && ifVer != "":
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "send %s or %s, not both", wire.HeaderIfAbsent, wire.HeaderIfVersion)
		return
	case absent != "" && absent != "1":
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "%s must be 1", wire.HeaderIfAbsent)
		return
	case absent != "":
		w.op = opPutIfAbsent
	case ifVer != "":
		w.op = opPutIfVersion
	}
	value, ok := c.body()
	if !ok {
		return
	}
	w.value = value
	if w.op == opPutIfVersion {
		epoch, n, ok := wire.ParseVersion(ifVer)
		if !ok || epoch != c.s.st.epoch() {
			// A token this service never issued can match nothing: a
			// conflict, decided without the backend.
			c.fail(http.StatusPreconditionFailed, wire.CodeVersionMismatch, 0, "the version is not one this service issued for this key")
			return
		}
		w.expected = n
	}
	c.apply(w)
}

// delete serves DELETE /v1/ns/{ns}/kv?key=K.
func (c *call) delete() {
	if !c.params("key") {
		return
	}
	key, ok := c.key()
	if !ok {
		return
	}
	id, ok := c.requestID()
	if !ok {
		return
	}
	c.apply(writeReq{ns: c.ns, key: key, reqID: id, op: opDelete})
}

// apply runs a write and answers with its outcome.
func (c *call) apply(w writeReq) {
	res, err := c.s.st.write(c.r.Context(), w)
	if err != nil {
		c.backendFailed(err)
		return
	}
	c.replayed = res.replayed
	if res.replayed {
		c.w.Header().Set(wire.HeaderReplayed, "true")
	}
	switch res.status {
	case statusExists:
		c.fail(http.StatusPreconditionFailed, wire.CodeExists, 0, "the key exists")
	case statusMismatch:
		c.fail(http.StatusPreconditionFailed, wire.CodeVersionMismatch, 0, "the key is missing or its version changed")
	case statusReused:
		c.fail(http.StatusConflict, wire.CodeRequestIDReused, 0, "this %s was used before for another key or operation; make a new one for each write", wire.HeaderRequestID)
	default:
		if w.op == opDelete {
			c.w.WriteHeader(http.StatusNoContent)
			return
		}
		c.w.Header().Set(wire.HeaderVersion, wire.FormatVersion(c.s.st.epoch(), res.version))
		c.w.WriteHeader(http.StatusNoContent)
	}
}

// list serves GET /v1/ns/{ns}/list?prefix=P&after=K&limit=N&values=1: one
// page of entries as NDJSON, then the trailer.
func (c *call) list() {
	if !c.params("prefix", "after", "limit", "values") {
		return
	}
	prefix, after := c.q.Get("prefix"), c.q.Get("after")
	if !c.checkKey(prefix, "prefix", true) || !c.checkKey(after, "after cursor", true) {
		return
	}
	limit, ok := c.limit()
	if !ok {
		return
	}
	values := false
	switch c.q.Get("values") {
	case "", "0", "false":
	case "1", "true":
		values = true
		c.op = "list"
	default:
		c.fail(http.StatusBadRequest, wire.CodeBadRequest, 0, "values must be 1 or 0")
		return
	}
	if !values {
		c.op = "list_keys"
	}
	ctx := c.r.Context()
	rows, more, err := c.s.st.list(ctx, c.ns, prefix, after, limit, values)
	if err != nil {
		c.backendFailed(err)
		return
	}
	c.w.Header().Set("Content-Type", wire.ContentNDJSON)
	c.w.WriteHeader(http.StatusOK)
	out := bufio.NewWriterSize(c.w, 32<<10)
	enc := json.NewEncoder(out)
	for _, r := range rows {
		e := wire.Entry{Key: r.key}
		if values {
			e.Value = r.value
			if e.Value == nil {
				// Too large to read with the page: read it now. A key
				// deleted since is skipped, as a listing may.
				v, _, err := c.s.st.get(ctx, c.ns, r.key)
				if errors.Is(err, errNotFound) {
					continue
				}
				if err != nil {
					c.backErr = err
					// Cut the stream: without its trailer the client
					// knows the page is incomplete.
					panic(http.ErrAbortHandler)
				}
				e.Value = v
			}
		}
		if err := enc.Encode(e); err != nil {
			return
		}
	}
	t := wire.Trailer{End: !more}
	if more {
		next := rows[len(rows)-1].key
		t.Next = &next
	}
	enc.Encode(t)
	out.Flush()
}
