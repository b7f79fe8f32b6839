package server

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyTheRuntimesFacade: the server speaks to the runtime
// through package agent (its errors, its dead-letter and ledger calls) and
// never reaches past it into the packages agent is built on.
func TestImportsOnlyTheRuntimesFacade(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, "agentkit/server").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, below := range []string{"agentkit/actor", "agentkit/ledger", "agentkit/kv", "agentkit/storage", "agentkit/memory", "agentkit/reminder"} {
			if p == below || strings.HasPrefix(p, below+"/") {
				t.Errorf("server imports %s; reach it through package agent", p)
			}
		}
	}
}
