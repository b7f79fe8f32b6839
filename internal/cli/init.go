package cli

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"text/template"

	"agentkit/memory"
)

func init() {
	register(command{name: "init", summary: "write a new agent project: agentkit.yaml, instructions.md, cases.jsonl", run: runInit})
}

const initUsage = `init [--name NAME] [--go [--source DIR]] [--force] [DIR]

Writes a working agent project into DIR (default: the current folder):
agentkit.yaml, instructions.md (with its ## Memory section), cases.jsonl (an
eval set that passes with the echo model) and .gitignore. With --go it adds
main.go, the same agent defined with the Go API plus a Go tool, and go.mod
and go.sum, which build against an agentkit checkout (--source) with go
build, offline. Existing files are kept unless --force is given.`

//go:embed scaffold/*.tmpl
var scaffold embed.FS

// agentNameRE is what --name accepts: a name that is also a folder, a Go
// module path and a YAML scalar without quoting.
var agentNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

type scaffoldData struct {
	Name   string
	Memory string // the ## Memory section of instructions.md
	Go     bool
}

func runInit(e *env, args []string) error {
	var name, source string
	var withGo, force bool
	fs := newFlags(e, "init", initUsage)
	fs.StringVar(&name, "name", "", "the agent's name (default: the folder's name)")
	fs.BoolVar(&withGo, "go", false, "also write main.go (the agent in Go, with a Go tool), go.mod and go.sum")
	fs.StringVar(&source, "source", "", "with --go: the agentkit checkout the project builds against (default: one above DIR, the working folder or this binary, else the one this binary was built from)")
	fs.BoolVar(&force, "force", false, "overwrite files that exist")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef("init takes one folder, got %d arguments: %q", len(pos), pos)
	}
	dir := "."
	if len(pos) == 1 {
		dir = pos[0]
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if name == "" {
		name = nameFromFolder(filepath.Base(abs))
	} else if !agentNameRE.MatchString(name) {
		return usagef("--name %q: use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	data := scaffoldData{Name: name, Memory: memory.InstructionsSection(), Go: withGo}

	files := []struct{ name, tmpl string }{
		{"agentkit.yaml", "agentkit.yaml.tmpl"},
		{"instructions.md", "instructions.md.tmpl"},
		{"cases.jsonl", "cases.jsonl.tmpl"},
		{".gitignore", "gitignore.tmpl"},
	}
	if withGo {
		files = append(files, struct{ name, tmpl string }{"main.go", "main.go.tmpl"})
	}
	out := map[string][]byte{}
	var order []string
	for _, f := range files {
		b, err := render(f.tmpl, data)
		if err != nil {
			return err
		}
		out[f.name] = b
		order = append(order, f.name)
	}
	if source != "" && !withGo {
		return usagef("--source names the agentkit checkout of a --go project; add --go, or drop --source")
	}
	if withGo {
		root, err := agentkitSource(source, abs)
		if err != nil {
			return err
		}
		gomod, gosum, err := goModule(name, abs, root)
		if err != nil {
			return err
		}
		out["go.mod"] = gomod
		order = append(order, "go.mod")
		if gosum != nil {
			out["go.sum"] = gosum
			order = append(order, "go.sum")
		}
	}
	if !force {
		for _, n := range order {
			if _, err := os.Stat(filepath.Join(abs, n)); err == nil {
				return fmt.Errorf("%s already exists; init keeps existing files (pass --force to overwrite them, or pick another folder)", filepath.Join(abs, n))
			}
		}
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}
	for _, n := range order {
		if err := os.WriteFile(filepath.Join(abs, n), out[n], 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.stdout, "wrote agent %q in %s: %s\n", name, abs, strings.Join(order, ", "))
	rel := dir
	if rel == "." {
		fmt.Fprintln(e.stdout, "next: agentkit serve    (or agentkit run \"hello\")")
	} else {
		fmt.Fprintf(e.stdout, "next: agentkit serve --dir %s    (or cd %s && agentkit run \"hello\")\n", rel, rel)
	}
	if withGo {
		fmt.Fprintf(e.stdout, "with Go: cd %s && go build -o %s . && ./%s\n", rel, name, name)
	}
	return nil
}

func render(tmpl string, data scaffoldData) ([]byte, error) {
	src, err := scaffold.ReadFile("scaffold/" + tmpl)
	if err != nil {
		return nil, err
	}
	t, err := template.New(tmpl).Delims("[[", "]]").Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// nameFromFolder makes an agent name from a folder name: lower case, runs
// of other characters as one '-'.
func nameFromFolder(base string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(base) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	n := strings.Trim(b.String(), "-_")
	if len(n) > 64 {
		n = strings.TrimRight(n[:64], "-_")
	}
	if n == "" {
		return "agent"
	}
	return n
}

// agentkitSource finds the agentkit checkout a --go project in dir builds
// against. The module is named agentkit, a path no module proxy serves, so
// a program reaches it through a replace directive naming a checkout on
// disk. In order: the --source flag; a checkout above dir, the working
// folder or the agentkit binary (agentkit run from its repository, or
// built into it); the checkout this binary was built from, when it is still
// there (go install from a checkout). None found is a usage error naming
// --source, before anything is written.
func agentkitSource(flagValue, dir string) (string, error) {
	if flagValue != "" {
		abs, err := filepath.Abs(flagValue)
		if err == nil {
			if src, rerr := os.ReadFile(filepath.Join(abs, "go.mod")); rerr == nil && modulePath(src) == "agentkit" {
				return abs, nil
			}
		}
		return "", usagef("--source %s: not an agentkit checkout (its go.mod must declare module agentkit); name the folder holding agentkit's go.mod", flagValue)
	}
	starts := []string{dir}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	if built := builtFrom(); built != "" {
		starts = append(starts, built)
	}
	for _, s := range starts {
		if root := findAgentkitRoot(s); root != "" {
			return root, nil
		}
	}
	return "", usagef("init --go: no agentkit checkout found (not above %s, the working folder or this binary, and this binary was built elsewhere); pass --source DIR naming a checkout of agentkit", dir)
}

// builtFrom returns the folder this file was compiled from, when the
// binary recorded absolute source paths (a build without -trimpath), or "".
func builtFrom() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return ""
	}
	return filepath.Dir(file)
}

// goModule returns the go.mod and go.sum of a --go project in dir that
// builds against the agentkit checkout root: go.mod requires agentkit with a
// replace directive pointing at root and repeats agentkit's own
// requirements, and go.sum is agentkit's, so "go build" works at once and
// offline (from the module cache agentkit's own build filled).
func goModule(name, dir, root string) (gomod, gosum []byte, err error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "module %s\n\n", name)
	src, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, nil, err
	}
	goLine, requires := moduleRequirements(src)
	if goLine == "" {
		goLine = "go 1.26.0"
	}
	replace := root // outside the checkout: the absolute path
	if strings.HasPrefix(dir, root+string(filepath.Separator)) {
		if rel, err := filepath.Rel(dir, root); err == nil {
			replace = filepath.ToSlash(rel) // inside it: "../..", which moves with the checkout
		}
	}
	fmt.Fprintf(&b, "%s\n\nrequire agentkit v0.0.0-00010101000000-000000000000\n\n", goLine)
	if len(requires) > 0 {
		b.WriteString("// agentkit's own requirements, so that go build works offline.\nrequire (\n")
		for _, r := range requires {
			fmt.Fprintf(&b, "\t%s\n", r)
		}
		b.WriteString(")\n\n")
	}
	fmt.Fprintf(&b, "// agentkit's module path is not served by a module proxy: the program builds\n// against the agentkit checkout at %s. To use another checkout, change\n// this line (and copy its go.sum), or run init --go --source DIR again.\nreplace agentkit => %s\n", replace, replace)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	return b.Bytes(), sum, nil
}

// findAgentkitRoot returns the first folder at or above dir whose go.mod
// declares module agentkit, or "".
func findAgentkitRoot(dir string) string {
	for {
		if src, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(src) == "agentkit" {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`)
		}
	}
	return ""
}

// moduleRequirements returns the go directive and the requirement lines of
// a go.mod ("path version // comment").
func moduleRequirements(gomod []byte) (goLine string, reqs []string) {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	inBlock := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case inBlock && line == ")":
			inBlock = false
		case inBlock && line != "" && !strings.HasPrefix(line, "//"):
			reqs = append(reqs, line)
		case line == "require (":
			inBlock = true
		case strings.HasPrefix(line, "require "):
			reqs = append(reqs, strings.TrimSpace(strings.TrimPrefix(line, "require ")))
		case strings.HasPrefix(line, "go "):
			goLine = line
		}
	}
	return goLine, reqs
}
