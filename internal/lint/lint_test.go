package lint

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// moduleRoot is the folder holding go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", dir, err)
	}
	return dir
}

// packageDirs returns every folder of the main module holding Go files,
// skipping testdata and separate modules (bench/).
func packageDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bench") {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		matches, _ := filepath.Glob(filepath.Join(path, "*.go"))
		if len(matches) > 0 {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func TestEveryPackageAndExportedNameIsDocumented(t *testing.T) {
	root := moduleRoot(t)
	for _, dir := range packageDirs(t, root) {
		rel, _ := filepath.Rel(root, dir)
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		hasDoc, name := false, ""
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				t.Errorf("%s: %v", rel, err)
				continue
			}
			name = f.Name.Name
			if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
				hasDoc = true
			}
			checkExported(t, fset, f)
		}
		if name != "" && !hasDoc {
			t.Errorf("%s: package %s has no package doc comment", rel, name)
		}
	}
}

func checkExported(t *testing.T, fset *token.FileSet, f *ast.File) {
	t.Helper()
	report := func(pos token.Pos, what string) {
		t.Errorf("%s: exported %s has no doc comment", fset.Position(pos), what)
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil && !exportedReceiver(d.Recv) {
				continue
			}
			report(d.Pos(), "func "+d.Name.Name)
		case *ast.GenDecl:
			if d.Tok == token.IMPORT {
				continue
			}
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && s.Doc == nil && d.Doc == nil {
						report(s.Pos(), "type "+s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() && s.Doc == nil && d.Doc == nil && s.Comment == nil {
							report(n.Pos(), n.Name)
						}
					}
				}
			}
		}
	}
}

func exportedReceiver(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	typ := recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
		case *ast.IndexExpr:
			typ = x.X
		case *ast.IndexListExpr:
			typ = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

// heavy are import paths the portable packages must never link: server
// clients and the drivers built on them. Programs opt into drivers with
// blank imports (cmd/agentkit does).
var heavy = []string{
	"github.com/jackc/pgx",
	"github.com/redis/go-redis",
	"github.com/nats-io/",
	"github.com/aws/",
	"agentkit/kv/pgkv",
	"agentkit/kv/rediskv",
	"agentkit/kv/natskv",
	"agentkit/kv/s3kv",
}

func TestPortablePackagesLinkNoServerDriver(t *testing.T) {
	root := moduleRoot(t)
	portable := []string{"agentkit/kv", "agentkit/keys", "agentkit/storage", "agentkit/model", "agentkit/tool", "agentkit/memory", "agentkit/workspace", "agentkit/reminder", "agentkit/actor", "agentkit/agent", "agentkit/server", "agentkit/evals", "agentkit/abtest", "agentkit/ledger"}
	for _, pkg := range portable {
		cmd := exec.Command("go", "list", "-deps", "-json=ImportPath", pkg)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v %s", pkg, err, errText(err))
		}
		dec := json.NewDecoder(strings.NewReader(string(out)))
		for dec.More() {
			var p struct{ ImportPath string }
			if err := dec.Decode(&p); err != nil {
				t.Fatal(err)
			}
			for _, h := range heavy {
				if strings.HasPrefix(p.ImportPath, h) {
					t.Errorf("%s links %s; portable packages must not import server drivers or their clients", pkg, p.ImportPath)
				}
			}
		}
	}
}

func errText(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return err.Error()
}
