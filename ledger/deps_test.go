package ledger

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoServerDriver: the ledger is built on the kv contract alone; a
// program chooses its drivers with blank imports.
func TestLinksNoServerDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "agentkit/ledger").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, heavy := range []string{"github.com/jackc/pgx", "github.com/redis/go-redis", "github.com/nats-io/", "github.com/aws/", "modernc.org/sqlite", "agentkit/kv/"} {
			if strings.HasPrefix(p, heavy) {
				t.Errorf("ledger links %s; it must stay on the kv contract", p)
			}
		}
	}
}
