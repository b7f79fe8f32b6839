package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentkit/model"
)

const full = `
name: support
instructions: prompt.md
maxSteps: 8
model:
  provider: openai
  baseURL: http://127.0.0.1:8000/v1
  model: llama3.1
  apiKeyEnv: OPENAI_API_KEY
  timeout: 60s
memory: false
storage: postgres://root@127.0.0.1:5432/test?table=kv
serving: ledger
ledger:
  store: redis://127.0.0.1:6379/3
  lease: 15s
  margin: 3s
  maxAttempts: 3
  maxPending: 10
  maxPendingBytes: 1MiB
  maxEventBytes: 64KiB
  retryAfter: 5s
  idempotencyWindow: 2d
  clockSkew: 1m
  maxKeys: 500
policy:
  debounce: 30s
  restore:
    maxSessions: 500
    maxAge: 14d
    maxTotalBytes: 512MiB
timeouts:
  turn: 5m
  tool: 45s
experiments:
  - name: tone
    variants:
      - {name: plain, weight: 2}
      - name: friendly
        instructions: friendly.md
        model: {provider: echo, reply: "hi {{.UserMessage}}"}
        options: {greeting: true}
allowedHosts: [agent.lan, .corp.example, 192.0.2.10, "::1"]
`

func TestParseFull(t *testing.T) {
	f, err := Parse([]byte(full), "agentkit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.Name != "support" || f.Instructions != "prompt.md" || f.MaxSteps != 8 {
		t.Errorf("name/instructions/maxSteps = %q %q %d", f.Name, f.Instructions, f.MaxSteps)
	}
	if f.Model.Provider != "openai" || f.Model.OpenAI == nil || f.Model.OpenAI.BaseURL != "http://127.0.0.1:8000/v1" ||
		f.Model.OpenAI.Model != "llama3.1" || f.Model.OpenAI.APIKeyEnv != "OPENAI_API_KEY" || f.Model.OpenAI.Timeout != "60s" {
		t.Errorf("model = %+v %+v", f.Model, f.Model.OpenAI)
	}
	if f.Memory || f.Storage != "postgres://root@127.0.0.1:5432/test?table=kv" || f.Serving != "ledger" {
		t.Errorf("memory/storage/serving = %v %q %q", f.Memory, f.Storage, f.Serving)
	}
	if l := f.Ledger; f.LedgerStore != "redis://127.0.0.1:6379/3" || l.Lease != 15*time.Second || l.Margin != 3*time.Second || l.MaxAttempts != 3 ||
		l.MaxPending != 10 || l.MaxPendingBytes != 1<<20 || l.MaxEventBytes != 64<<10 || l.RetryAfter != 5*time.Second ||
		l.IdempotencyWindow != 48*time.Hour || l.ClockSkew != time.Minute || l.MaxKeys != 500 {
		t.Errorf("ledger = %q %+v", f.LedgerStore, l)
	}
	if rc, err := f.RuntimeConfig(); err == nil && rc.Ledger.Lease != 15*time.Second {
		t.Errorf("RuntimeConfig().Ledger = %+v", rc.Ledger)
	}
	r := f.Policy.Restore
	if f.Policy.Debounce != 30*time.Second || r.Off || r.MaxSessions != 500 || r.MaxAge != 14*24*time.Hour || r.MaxTotalBytes != 512<<20 {
		t.Errorf("policy = %+v", f.Policy)
	}
	if f.Timeouts.Turn != 5*time.Minute || f.Timeouts.Tool != 45*time.Second {
		t.Errorf("timeouts = %+v", f.Timeouts)
	}
	if len(f.Experiments) != 1 || f.Experiments[0].Name != "tone" || len(f.Experiments[0].Variants) != 2 {
		t.Fatalf("experiments = %+v", f.Experiments)
	}
	if strings.Join(f.AllowedHosts, " ") != "agent.lan .corp.example 192.0.2.10 ::1" {
		t.Errorf("allowedHosts = %q", f.AllowedHosts)
	}
	v0, v1 := f.Experiments[0].Variants[0], f.Experiments[0].Variants[1]
	if v0.Name != "plain" || v0.Weight != 2 || v1.Weight != 1 || v1.Instructions != "friendly.md" ||
		v1.Model == nil || v1.Model.Echo == nil || v1.Model.Echo.Reply != "hi {{.UserMessage}}" || v1.Options["greeting"] != true {
		t.Errorf("variants = %+v %+v", v0, v1)
	}
}

func TestDefaults(t *testing.T) {
	f, err := Parse([]byte("name: a\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	if !f.Memory || f.Serving != "local" || f.Instructions != DefaultInstructions || f.Storage != "" || f.Model.Provider != "" || f.AllowedHosts != nil {
		t.Errorf("defaults = %+v", f)
	}
	a, err := f.Agent()
	if err != nil {
		t.Fatal(err)
	}
	if a.Model.Name() != model.EchoName {
		t.Errorf("default model = %s, want echo", a.Model.Name())
	}
}

func TestRestoreOff(t *testing.T) {
	for _, doc := range []string{"restore: off", "restore: {off: true}"} {
		f, err := Parse([]byte("name: a\npolicy:\n  "+doc+"\n"), "")
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if !f.Policy.Restore.Off {
			t.Errorf("%s: Off = false", doc)
		}
	}
}

func TestEchoScript(t *testing.T) {
	for _, doc := range []string{
		"model:\n  provider: echo\n  script:\n    - tool: read_file\n      args: {path: memory/journal.jsonl}\n    - text: done\n",
		"model:\n  echo:\n    script:\n      - tool: read_file\n        args: {path: memory/journal.jsonl}\n      - text: done\n",
	} {
		f, err := Parse([]byte("name: a\n"+doc), "")
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		e := f.Model.Echo
		if e == nil || len(e.Script) != 2 || e.Script[0].Tool != "read_file" || e.Script[0].Args["path"] != "memory/journal.jsonl" || e.Script[1].Text != "done" {
			t.Errorf("echo = %+v", e)
		}
		a, err := f.Agent()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := a.Model.Generate(context.Background(), model.Request{Messages: []model.Message{{Role: "user", Content: "x"}}})
		if err != nil || len(resp.Message.ToolCalls) != 1 || resp.Message.ToolCalls[0].Name != "read_file" {
			t.Errorf("scripted model answered %+v, %v", resp, err)
		}
	}
}

// TestErrors checks that each mistake is refused with an error naming the
// line, the field and what is allowed.
func TestErrors(t *testing.T) {
	cases := []struct {
		doc  string
		want []string
	}{
		{"name: a\nmodle: echo\n", []string{"agentkit.yaml:2", `unknown field "modle"`, "allowed fields: name, instructions, maxSteps, model, memory"}},
		{"name: a\nmodel:\n  provider: echo\n  bseURL: x\n", []string{":4", `unknown field "bseURL" in model`, "baseURL"}},
		{"name: a\nModel: echo\n", []string{`did you mean "model"`}},
		{"model: echo\n", []string{"name: missing"}},
		{"name: a\nmodel:\n  provider: claude\n", []string{"model.provider", `"claude" is not a model provider; use echo or openai`}},
		{"name: a\nmodel:\n  provider: openai\n", []string{"needs baseURL"}},
		{"name: a\nmodel:\n  provider: openai\n  baseURL: ftp://x\n  model: m\n", []string{"model.baseURL", "http://"}},
		{"name: a\nmodel:\n  provider: openai\n  baseURL: http://x\n  model: m\n  apiKeyEnv: sk-abcdef123456\n", []string{"model.apiKeyEnv", "NAME of the variable", `"sk-a…"`}},
		{"name: a\nmodel:\n  baseURL: http://x\n  model: m\n", []string{"provider is echo"}},
		{"name: a\nserving: cluster\n", []string{"serving", `"cluster" is not a serving mode; use local or ledger`}},
		{"name: a\nledger:\n  leese: 10s\n", []string{`unknown field "leese" in ledger`, "lease"}},
		{"name: a\nledger:\n  lease: soon\n", []string{"ledger.lease"}},
		{"name: a\nledger:\n  lease: 10ms\n", []string{"ledger.lease", "too short"}},
		{"name: a\nledger:\n  maxPending: 0\n", []string{"ledger.maxPending", "at least 1"}},
		{"name: a\nledger:\n  maxKeys: 0\n", []string{"ledger.maxKeys", "at least 1"}},
		{"name: a\nledger:\n  idempotencyWindow: forever\n", []string{"ledger.idempotencyWindow", "is not a duration"}},
		{"name: a\nledger:\n  clockSkew: -1m\n", []string{"ledger.clockSkew", "is not a duration"}},
		{"name: a\nledger:\n  maxPendingBytes: lots\n", []string{"ledger.maxPendingBytes", "is not a size"}},
		{"name: a\nledger:\n  store: somewhere\n", []string{"ledger.store", "not a store URL"}},
		{"name: a\nmemory: maybe\n", []string{"memory", "expected true or false"}},
		{"name: a\nmaxSteps: 0\n", []string{"maxSteps", "at least 1"}},
		{"name: a\npolicy:\n  debounce: soon\n", []string{"policy.debounce", "30s"}},
		{"name: a\npolicy:\n  restore: sometimes\n", []string{"policy.restore", "use off, or a mapping with maxSessions, maxAge and maxTotalBytes"}},
		{"name: a\npolicy:\n  restore:\n    maxSessions: -1\n", []string{"policy.restore.maxSessions", "at least 1"}},
		{"name: a\npolicy:\n  restore:\n    maxTotalBytes: 1 ZB\n", []string{"policy.restore.maxTotalBytes", "MiB"}},
		{"name: a\npolicy:\n  restore:\n    maxAge: 0s\n", []string{"policy.restore.maxAge"}},
		{"name: a\npolicy:\n  restore:\n    maxSession: 5\n", []string{`unknown field "maxSession" in policy.restore`, "maxSessions"}},
		{"name: a\nexperiments:\n  - name: x\n    variants: [{name: a}]\n", []string{"experiments[0].variants", "at least two"}},
		{"name: a\nexperiments:\n  - name: x\n    variants: [{name: a}, {name: a}]\n", []string{"experiments[0].variants[1].name", "unique"}},
		{"name: a\nexperiments:\n  - name: x\n    variants: [{name: a, weight: 0}, {name: b}]\n", []string{"weight", "positive"}},
		{"name: a\nmodel:\n  script:\n    - {tool: x, text: y}\n", []string{"model.script[0]", "exactly one of tool, text or error"}},
		{"name: a\nname: b\n", []string{"name: given twice"}},
		{"name: a\ntimeouts:\n  turn: 0s\n", []string{"timeouts.turn", "duration"}},
		{"name: a\ntimeouts:\n  tool: forever\n", []string{"timeouts.tool", "30s"}},
		{"name: a\ntimeouts:\n  tools: 1m\n", []string{`unknown field "tools" in timeouts`, "turn, tool"}},
		{"name: a\nallowedHosts: agent.lan\n", []string{"agentkit.yaml:2", "allowedHosts", "expected a list of host names"}},
		{"name: a\nallowedHosts: [agent.lan, \"*\"]\n", []string{"allowedHosts[1]", "wildcards"}},
		{"name: a\nallowedHosts:\n  - agent.lan:8080\n", []string{"agentkit.yaml:3", "allowedHosts[0]", "port"}},
		{"name: a\nallowedHosts: [http://agent.lan]\n", []string{"allowedHosts[0]", "URL"}},
		{"name: a\nallowedHosts: [[x]]\n", []string{"allowedHosts[0]", "expected a string"}},
		{"name: [a\n", []string{"not valid YAML"}},
		{"", []string{"empty"}},
		{"name: a\n---\nname: b\n", []string{"more than one YAML document"}},
		{"name: &x a\ninstructions: *x\n", []string{"aliases"}},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.doc), "agentkit.yaml")
		if err == nil {
			t.Errorf("Parse(%q) succeeded", c.doc)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%q) = %q; want it to contain %q", c.doc, err, w)
			}
		}
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("Parse(%q) error is %T, not *config.Error", c.doc, err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, FileName), []byte("name: a\nmemory: {enabled: true, maxTextLength: 50}\ntimeouts: {tool: 90s}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, DefaultInstructions), []byte("Be brief."), 0o644)
	f, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if f.InstructionsText != "Be brief." || f.MemoryMaxText != 50 || !f.Memory {
		t.Errorf("loaded %+v", f)
	}
	cfg, err := f.RuntimeConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Agent.Name != "a" || cfg.Agent.Instructions != "Be brief." || cfg.Memory.Off || cfg.Memory.MaxTextLength != 50 || cfg.Serving != "local" || cfg.Timeouts.Tool != 90*time.Second || cfg.Timeouts.Turn != 0 {
		t.Errorf("runtime config %+v", cfg)
	}

	// A missing default instructions file means no instructions.
	os.Remove(filepath.Join(dir, DefaultInstructions))
	if f, err = Load(filepath.Join(dir, FileName)); err != nil || f.InstructionsText != "" {
		t.Errorf("without instructions.md: %v %q", err, f.InstructionsText)
	}
	// A named one that is missing is an error.
	os.WriteFile(filepath.Join(dir, FileName), []byte("name: a\ninstructions: nope.md\n"), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "nope.md does not exist") {
		t.Errorf("missing named instructions: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "agentkit init") {
		t.Errorf("missing file: %v", err)
	}
}

func TestParseBytesAndDurations(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "10": 10, "10B": 10, "2KB": 2000, "3KiB": 3072, "1GiB": 1 << 30, "5 MB": 5e6} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1.5GiB", "1ZB", "99999999999TiB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) succeeded", in)
		}
	}
	for in, want := range map[string]time.Duration{"30d": 30 * 24 * time.Hour, "90s": 90 * time.Second, "1h30m": 90 * time.Minute} {
		if got, err := parseDuration(in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"d", "1.5d", "-2d", "x"} {
		if _, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q) succeeded", in)
		}
	}
}

func TestWorkspaceSeedFolder(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte("name: seeded\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, SeedDir, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SeedDir, "notes", "todo.md"), []byte("buy milk"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Agent()
	if err != nil {
		t.Fatal(err)
	}
	if a.WorkspaceSeed["notes/todo.md"] != "buy milk" || len(a.WorkspaceSeed) != 1 {
		t.Fatalf("seed %v; want notes/todo.md from the project's workspace/ folder", a.WorkspaceSeed)
	}

	if err := os.MkdirAll(filepath.Join(dir, SeedDir, "memory"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SeedDir, "memory", "journal.jsonl"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), "memory") || !strings.Contains(err.Error(), filepath.Join(dir, SeedDir)) {
		t.Fatalf("Load with workspace/memory/: %v; want a refusal naming the folder and memory", err)
	}
}

// A ledger.store without a scheme may be a credential written without its
// URL (a token as user@host): the error does not repeat it.
func TestLedgerStoreErrorDoesNotQuoteTheValue(t *testing.T) {
	_, err := Parse([]byte("name: a\nledger:\n  store: akst_s3cr3t@host\n"), "agentkit.yaml")
	if err == nil || !strings.Contains(err.Error(), "not a store URL") || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("Parse = %v; want a refusal that does not quote the value", err)
	}
}

// A mapping of free-form values (script args, variant options) with a key
// that is not a name is refused in YAML's terms, without the decoder's Go
// type names.
func TestFreeFormMappingKeyMustBeAName(t *testing.T) {
	for _, doc := range []string{
		"name: a\nmodel:\n  provider: echo\n  script:\n    - tool: x\n      args: {[1]: 2}\n",
		"name: a\nexperiments:\n  - name: x\n    variants:\n      - name: a\n        options: {? {k: v}: 2}\n      - name: b\n",
	} {
		_, err := Parse([]byte(doc), "agentkit.yaml")
		if err == nil || !strings.Contains(err.Error(), "a key must be a name, found a") || strings.Contains(err.Error(), "unmarshal") || strings.Contains(err.Error(), "!!") {
			t.Errorf("Parse(%q) = %v; want the key refused in YAML's terms", doc, err)
		}
	}
}
