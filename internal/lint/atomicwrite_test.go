package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// ownRename are the production files that may call os.Rename or
// os.CreateTemp themselves, and why; every other file that replaces a
// file does it with internal/atomicfile, so each replacement is synced,
// renamed and its folder synced the same way.
var ownRename = map[string]string{
	"internal/atomicfile/atomicfile.go": "the atomic file write itself",
	"memory/journal.go":                 "rotation renames the live journal to its rotated name; no contents are replaced",
	"kv/filekv/sysfile.go":              "filekv's write path: the temporary file sits in the store's root and the key's folder is made and synced under the key's lock, an order its own test pins",
	"kv/kvtest/linearizability.go":      "a drawing of a failed history, written once for a person to open",
}

// TestFilesAreReplacedThroughAtomicfile fails on a call of os.Rename or
// os.CreateTemp in production code outside ownRename: a new copy of the
// write-to-temp-and-rename dance, which has been written without the
// file's fsync before.
func TestFilesAreReplacedThroughAtomicfile(t *testing.T) {
	root := moduleRoot(t)
	seen := map[string]bool{}
	for _, dir := range packageDirs(t, root) {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			osName := ""
			for _, is := range f.Imports {
				if p, _ := strconv.Unquote(is.Path.Value); p == "os" {
					osName = "os"
					if is.Name != nil {
						osName = is.Name.Name
					}
				}
			}
			if osName == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "Rename" && sel.Sel.Name != "CreateTemp") {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != osName {
					return true
				}
				if _, ok := ownRename[rel]; ok {
					seen[rel] = true
					return true
				}
				t.Errorf("%s: os.%s: replace a file with atomicfile.Write (internal/atomicfile), or add the file to ownRename with the reason it cannot", fset.Position(sel.Pos()), sel.Sel.Name)
				return true
			})
		}
	}
	for rel := range ownRename {
		if !seen[rel] {
			t.Errorf("ownRename lists %s, which no longer calls os.Rename or os.CreateTemp: remove it", rel)
		}
	}
}
