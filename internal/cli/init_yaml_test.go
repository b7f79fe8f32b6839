package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"agentkit/agent"
	"agentkit/agent/stateroot"
	"agentkit/config"
	"agentkit/storage"
)

// stateRootPathRE finds the state-root paths a file names, such as
// .agentkit/memory/ or (.agentkit/sessions/sessions.db).
var stateRootPathRE = regexp.MustCompile(`\.agentkit/[A-Za-z0-9_./-]*[A-Za-z0-9_/]`)

// commentedBlocks returns the YAML blocks a file shows commented out: a
// comment line "#<indent>key:" with nothing after the colon but a
// comment, then the comment lines indented deeper, with the "#" and the
// first line's indentation taken off. Keyed by the block's key.
func commentedBlocks(yaml string) map[string]string {
	head := regexp.MustCompile(`^#(\s+)([A-Za-z]+):\s*(#.*)?$`)
	lines := strings.Split(yaml, "\n")
	out := map[string]string{}
	for i := 0; i < len(lines); i++ {
		m := head.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent := len(m[1])
		block := []string{lines[i][1+indent:]}
		for i+1 < len(lines) {
			next := strings.TrimPrefix(lines[i+1], "#")
			if next == lines[i+1] || len(next)-len(strings.TrimLeft(next, " ")) <= indent {
				break
			}
			block = append(block, next[indent:])
			i++
		}
		if len(block) > 1 {
			out[m[2]] = strings.Join(block, "\n") + "\n"
		}
	}
	return out
}

// TestInitYAMLIsTrue: the agentkit.yaml that init writes says only what is
// so. It parses with the config package (its instructions file included);
// every state-root path it names is there after agentkit serve ran a turn
// with it, and the default store's file it names is the one serve keeps the
// session in; every serving mode it names starts and answers a turn; and
// every block it shows commented out parses once uncommented, with the
// defaults it claims to show.
func TestInitYAMLIsTrue(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	if r := run(t, parent, nil, "", "init", "truthful"); r.code != 0 {
		t.Fatalf("init: exit %d, stderr %q", r.code, r.stderr)
	}
	dir := filepath.Join(parent, "truthful")
	raw, err := os.ReadFile(filepath.Join(dir, config.FileName))
	if err != nil {
		t.Fatal(err)
	}
	yaml := string(raw)
	f, err := config.Load(dir)
	if err != nil {
		t.Fatalf("the generated agentkit.yaml does not load: %v", err)
	}
	if f.Serving != "local" || f.Storage != "" || !f.Memory || f.InstructionsText == "" {
		t.Errorf("loaded: serving %q, storage %q, memory %v, %d bytes of instructions; want local, the embedded store, memory on, the instructions file", f.Serving, f.Storage, f.Memory, len(f.InstructionsText))
	}

	// The paths it names, after one turn served with the file as written
	// (the default state root, DIR/.agentkit).
	paths := stateRootPathRE.FindAllString(yaml, -1)
	if len(paths) == 0 {
		t.Fatal("the generated agentkit.yaml names no state-root path; the test finds none to check")
	}
	p := startServe(t, dir, nil, "serve", "--addr", "127.0.0.1:0")
	if st := call(t, "POST", p.url+"/v1/sessions", "", `{"message":"hello"}`, nil); st/100 != 2 {
		t.Fatalf("a turn on the generated project: status %d", st)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited with %d", code)
	}
	root := filepath.Join(dir, ".agentkit")
	var stores []string
	for _, rel := range paths {
		if _, err := os.Stat(filepath.Join(dir, rel)); err != nil {
			t.Errorf("agentkit.yaml names %s, which serve did not make: %v", rel, err)
		}
		if strings.HasSuffix(rel, ".db") {
			stores = append(stores, rel)
		}
	}
	want, _ := filepath.Rel(dir, stateroot.KVPath(root))
	if len(stores) != 1 || stores[0] != filepath.ToSlash(want) {
		t.Errorf("agentkit.yaml names the database files %v; the default store serve uses is %s", stores, want)
	}
	for _, s := range stores {
		r := run(t, dir, nil, "", "kv", "ls", "--storage", "sqlite:"+filepath.Join(dir, s), "agentkit/v1/")
		if r.code != 0 || !strings.Contains(r.stdout, "/sessions/") {
			t.Errorf("the store agentkit.yaml names (%s) does not hold the session: exit %d, %q, %q", s, r.code, tail(r.stdout, 300), r.stderr)
		}
	}

	// Every serving mode it names, in the paragraph above serving:.
	para := yaml[:strings.Index(yaml, "\nserving:")]
	para = para[strings.LastIndex(para, "\n\n")+2:]
	if strings.Contains(para, "not available") {
		t.Errorf("the serving paragraph says something is not available:\n%s", para)
	}
	for _, mode := range []string{"local", "ledger"} {
		if !strings.Contains(para, mode+":") {
			t.Errorf("the serving paragraph does not describe %s:\n%s", mode, para)
			continue
		}
		if mode == "local" {
			continue // served above
		}
		// ledger, on the store the paragraph names for one machine.
		if !strings.Contains(para, "sqlite:PATH") {
			t.Fatalf("the serving paragraph names no store for ledger on one machine:\n%s", para)
		}
		ldir := t.TempDir()
		ly := strings.Replace(strings.Replace(yaml, "\nserving: local\n", "\nserving: ledger\n", 1),
			"\nstorage: \"\"\n", "\nstorage: \"sqlite:"+filepath.Join(ldir, "shared.db")+"\"\n", 1)
		for _, name := range []string{config.FileName, "instructions.md"} {
			data := []byte(ly)
			if name != config.FileName {
				data, _ = os.ReadFile(filepath.Join(dir, name))
			}
			if err := os.WriteFile(filepath.Join(ldir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if lf, err := config.Load(ldir); err != nil || lf.Serving != "ledger" {
			t.Fatalf("serving: ledger does not load: %v", err)
		}
		lp := startServe(t, ldir, nil, "serve", "--addr", "127.0.0.1:0", "--state-root", filepath.Join(ldir, "root"))
		if st := call(t, "POST", lp.url+"/v1/sessions", "", `{"message":"hello"}`, nil); st/100 != 2 {
			t.Errorf("a turn in serving mode ledger: status %d", st)
		}
	}

	// The blocks shown commented out.
	blocks := commentedBlocks(yaml)
	var names []string
	for k := range blocks {
		names = append(names, k)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"model", "policy", "timeouts"}) {
		t.Errorf("commented-out blocks %v; the test expects model, policy and timeouts (update it with the template)", names)
	}
	for key, block := range blocks {
		// The block replaces the key's line, when the file sets it.
		doc := regexp.MustCompile(`(?m)^`+key+`:.*\n`).ReplaceAllString(yaml, "") + block
		pf, err := config.Parse([]byte(doc), "agentkit.yaml")
		if err != nil {
			t.Errorf("the commented-out %s block does not parse once uncommented: %v\n%s", key, err, block)
			continue
		}
		switch key {
		case "policy":
			r := pf.Policy.Restore
			if pf.Policy.Debounce != 0 || r.MaxSessions != storage.DefaultRestoreMaxSessions || r.MaxAge != storage.DefaultRestoreMaxAge || r.MaxTotalBytes != storage.DefaultRestoreMaxTotalBytes {
				t.Errorf("the policy shown as the defaults is %+v; the defaults are debounce 0 and restore %d sessions, %v, %d bytes",
					pf.Policy, storage.DefaultRestoreMaxSessions, storage.DefaultRestoreMaxAge, storage.DefaultRestoreMaxTotalBytes)
			}
		case "timeouts":
			if pf.Timeouts.Turn != agent.DefaultTurnTimeout || pf.Timeouts.Tool != agent.DefaultToolTimeout {
				t.Errorf("the timeouts shown as the defaults are %+v; the defaults are turn %v, tool %v", pf.Timeouts, agent.DefaultTurnTimeout, agent.DefaultToolTimeout)
			}
		case "model":
			if pf.Model.Provider != "openai" {
				t.Errorf("the model example parses to provider %q", pf.Model.Provider)
			}
		}
	}
}
