package actorbench

import "agentkit/actor/mergepatch"

// mergepatchApply is the merge SetState runs.
func mergepatchApply(target, patch []byte) ([]byte, error) { return mergepatch.Apply(target, patch) }
