package lint

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestDocsIndexListsEveryPageOnce: docs/index.md has one row for each page
// of docs/ (index.md aside), and every page it links to exists.
func TestDocsIndexListsEveryPageOnce(t *testing.T) {
	docs := filepath.Join(moduleRoot(t), "docs")
	index, err := os.ReadFile(filepath.Join(docs, "index.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\| \[[^]]+\]\(([^)#]+)\)`).FindAllStringSubmatch(string(index), -1) {
		rows[m[1]]++
	}
	pages, err := filepath.Glob(filepath.Join(docs, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		name := filepath.Base(p)
		if name == "index.md" {
			continue
		}
		if n := rows[name]; n != 1 {
			t.Errorf("docs/index.md has %d rows for %s; want one", n, name)
		}
	}
	for link := range rows {
		if _, err := os.Stat(filepath.Join(docs, link)); err != nil {
			t.Errorf("docs/index.md links to %s: %v", link, err)
		}
	}
}
