package agent

// SetServingForTest makes an open runtime answer actor state calls as in
// serving mode mode, for the tests of what ledger mode refuses. Call it
// before the runtime is used.
func SetServingForTest(r *Runtime, mode string) {
	r.cfg.Serving = mode
	r.actorsRefused = nil
	if mode == ServingLedger {
		r.actorsRefused = errActorStateLocal
	}
}
