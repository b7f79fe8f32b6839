package agent

// SetServingForTest sets the serving mode of an open runtime, for the tests
// of what ledger mode refuses until a runtime can open in it. Call it
// before the runtime is used.
func SetServingForTest(r *Runtime, mode string) { r.cfg.Serving = mode }
