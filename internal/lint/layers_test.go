package lint

import (
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layer is one floor of the house: the packages on it (module-relative
// paths; "x/..." is every package below x, not x itself; the longest
// pattern that matches a package wins) and what they are.
type layer struct {
	name string
	what string
	pkgs []string
	// apart means the packages of the layer do not import each other.
	apart bool
}

// layers are agentkit's packages from the bottom up. A package's
// production files import only packages of its own layer or of layers
// below (test files may import anything). This list is the one place the
// layering is written down: a new package goes on a floor here, or
// TestImportsRunDownTheLayers fails.
var layers = []layer{
	{name: "leaves", pkgs: []string{"kv/hostedkv/wire", "internal/privfile"},
		what: "Packages that import nothing of agentkit, so the drivers and the runtime above them can both use them: the Go spelling of the hosted storage protocol, which its driver and its service share, and the owner-only file modes every store file is created with."},
	{name: "kv contract", pkgs: []string{"kv", "kv/internal/...", "kv/kvtest"},
		what: "The portable key-value contract the runtime and users call, its conformance harness, and the internals the drivers share."},
	{name: "drivers", pkgs: []string{"kv/..."}, apart: true,
		what: "One package a backend (memkv, filekv, sqlitekv, pgkv, rediskv, natskv, s3kv, hostedkv): a driver knows the contract and its backend's wire format, nothing of the runtime, and no other driver."},
	{name: "leaf helpers", pkgs: []string{"keys", "record", "actor/mergepatch", "internal/atomicfile", "internal/jsonerr", "agent/stateroot"},
		what: "Small helpers of the runtime: key encoding, the versioned-record codec, JSON merge patch, the atomic file write, JSON decoding errors in JSON's terms, the state root's layout. They sit above the drivers, so no driver comes to depend on them."},
	{name: "model and tools", pkgs: []string{"model", "tool", "workspace"},
		what: "The model interface and its providers, the tool contract, and the workspace tools an agent is given."},
	{name: "runtime stores", pkgs: []string{"storage", "ledger", "memory", "actor", "reminder", "abtest"},
		what: "The runtime's records: storage binds a kv backend to the runtime, and ledger, memory, actor, reminder and abtest keep their records through the kv contract or in local files."},
	{name: "hosted service", pkgs: []string{"hosted", "hosted/client"},
		what: "The hosted storage service, which serves any kv store and so sits above kv, and hosted/client, which binds its native tables and memory journal (reached through the driver) to the runtime's stores."},
	{name: "agent", pkgs: []string{"agent", "agent/..."},
		what: "The agent runtime: sessions, turns and their commit paths in both serving modes, and the local session database."},
	{name: "evals", pkgs: []string{"evals"},
		what: "Eval runs, which drive an agent through the runtime."},
	{name: "server", pkgs: []string{"server"},
		what: "The HTTP API over the runtime; it links no driver."},
	{name: "config", pkgs: []string{"config"},
		what: "agentkit.yaml: a project file made into the runtime's and the server's settings."},
	{name: "commands", pkgs: []string{"internal/cli"},
		what: "The commands of the agentkit binary (serve, dev, run, eval, storaged, kv, …)."},
	{name: "programs", pkgs: []string{"cmd/...", "bench/..."},
		what: "Mains: agentkit's, which only calls the commands and blank-imports the drivers, and the benchmark programs."},
	{name: "test support", pkgs: []string{"internal/testenv", "internal/testenv/...", "internal/storetest", "internal/proctest", "internal/lint", "internal/privfile/privfiletest"},
		what: "Packages only tests import: the test environments, shared fixtures and these checks. On top, so no production package can import them."},
}

const modulePath = "agentkit"

// layerOf returns the index of the layer pkg (module-relative) is on, and
// the pattern that put it there.
func layerOf(pkg string) (int, string, bool) {
	best, bestPat := -1, ""
	for i, l := range layers {
		for _, pat := range l.pkgs {
			ok := pat == pkg
			if base, found := strings.CutSuffix(pat, "/..."); found {
				ok = strings.HasPrefix(pkg, base+"/")
			}
			if ok && len(pat) > len(bestPat) {
				best, bestPat = i, pat
			}
		}
	}
	return best, bestPat, best >= 0
}

// layerProblems returns what breaks the layering in imports, a map from
// each package (module-relative) to the module's packages its production
// files import.
func layerProblems(imports map[string][]string) []string {
	var out []string
	for _, pkg := range slices.Sorted(maps.Keys(imports)) {
		from, _, ok := layerOf(pkg)
		if !ok {
			out = append(out, fmt.Sprintf("%s is on no layer: put it on one in internal/lint/layers_test.go", pkg))
			continue
		}
		for _, imp := range imports[pkg] {
			to, _, ok := layerOf(imp)
			switch {
			case !ok:
				// Reported as a package of its own.
			case to > from:
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s), a layer above it: move what it needs down, or the code that needs it up",
					pkg, layers[from].name, imp, layers[to].name))
			case to == from && layers[from].apart:
				out = append(out, fmt.Sprintf("%s imports %s: the packages of layer %q do not import each other", pkg, imp, layers[from].name))
			}
		}
	}
	return out
}

// productionImports lists every package of the module and the module's
// packages that its production files import, for every build
// configuration (files excluded by build constraints included; test files
// not).
func productionImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,GoFiles,CgoFiles,IgnoredGoFiles", "./...")
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v %s", err, errText(err))
	}
	imports := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath, Dir                   string
			GoFiles, CgoFiles, IgnoredGoFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel, ok := strings.CutPrefix(p.ImportPath, modulePath+"/")
		if !ok {
			t.Fatalf("package %s is outside module %s", p.ImportPath, modulePath)
		}
		seen := map[string]bool{}
		imports[rel] = []string{}
		fset := token.NewFileSet()
		for _, name := range slices.Concat(p.GoFiles, p.CgoFiles, p.IgnoredGoFiles) {
			if strings.HasSuffix(name, "_test.go") {
				continue // a test file left out by a build constraint
			}
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, is := range f.Imports {
				path, _ := strconv.Unquote(is.Path.Value)
				if imp, ok := strings.CutPrefix(path, modulePath+"/"); ok && !seen[imp] {
					seen[imp] = true
					imports[rel] = append(imports[rel], imp)
				}
			}
		}
	}
	return imports
}

// TestImportsRunDownTheLayers fails on any production import that runs up
// the house, on a package that is on no layer, and on a layer pattern that
// names no package (a list gone stale).
func TestImportsRunDownTheLayers(t *testing.T) {
	imports := productionImports(t)
	for _, p := range layerProblems(imports) {
		t.Error(p)
	}
	used := map[string]bool{}
	for pkg := range imports {
		if _, pat, ok := layerOf(pkg); ok {
			used[pat] = true
		}
	}
	for _, l := range layers {
		if strings.TrimSpace(l.what) == "" {
			t.Errorf("layer %q has no sentence saying what it holds", l.name)
		}
		for _, pat := range l.pkgs {
			if !used[pat] {
				t.Errorf("layer %q lists %s, which is no package of the module: remove it", l.name, pat)
			}
		}
	}
}

// The check itself: an upward import, an import between two drivers and
// a package on no layer are each reported; imports down the house are not.
func TestLayerCheckReportsWhatRunsUp(t *testing.T) {
	got := layerProblems(map[string][]string{
		"kv":                  {"kv/memkv"},
		"kv/hostedkv/wire":    {},
		"kv/memkv":            {"kv", "storage"},
		"kv/hostedkv":         {"kv", "kv/hostedkv/wire", "kv/memkv"},
		"storage":             {"kv", "keys"},
		"hosted":              {"kv", "kv/hostedkv/wire", "internal/atomicfile"},
		"agent":               {"storage", "kv/sqlitekv", "internal/testenv"},
		"somewhere/unplaced":  {"kv"},
		"internal/cli":        {"hosted/client", "agent"},
		"internal/atomicfile": {},
	})
	want := []string{
		"agent (agent) imports internal/testenv (test support), a layer above it",
		"kv (kv contract) imports kv/memkv (drivers), a layer above it",
		"kv/hostedkv imports kv/memkv: the packages of layer \"drivers\" do not import each other",
		"kv/memkv (drivers) imports storage (runtime stores), a layer above it",
		"somewhere/unplaced is on no layer",
	}
	if len(got) != len(want) {
		t.Fatalf("problems:\n%s\nwant %d:\n%s", strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d: %q, want it to start %q", i, got[i], want[i])
		}
	}
}
