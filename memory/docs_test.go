package memory

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestDocsExampleLines keeps the example records in docs/memory.md exact:
// each must read back and re-encode to the same bytes.
func TestDocsExampleLines(t *testing.T) {
	b, err := os.ReadFile("../docs/memory.md")
	if err != nil {
		t.Fatalf("docs/memory.md: %v", err)
	}
	_, block, ok := strings.Cut(string(b), "```json\n")
	if !ok {
		t.Fatal("docs/memory.md has no ```json example")
	}
	block, _, _ = strings.Cut(block, "```")
	lines := strings.SplitAfter(block, "\n")
	n := 0
	for _, line := range lines {
		if line == "" {
			continue
		}
		n++
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("example %q: %v", line, err)
		}
		got, err := r.Line()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != line {
			t.Errorf("example line is not what the journal writes:\ndocs: %s\ngot:  %s", line, got)
		}
	}
	if n != 2 {
		t.Errorf("%d example lines, want a completed and a failed one", n)
	}
}
