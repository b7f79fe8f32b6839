package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"agentkit/agent"
	"agentkit/model"
)

// Parse parses the content of an agentkit.yaml. name labels errors (the
// file name). It reads no file: Load also reads the instructions.
func Parse(data []byte, name string) (*File, error) {
	if name == "" {
		name = FileName
	}
	p := &parser{file: name}
	f, err := p.parse(data)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// parser walks the YAML node tree, collecting the first error.
type parser struct {
	file string
	err  error
}

// Error is a problem in a config file: where it is and what to change.
type Error struct {
	File  string
	Line  int
	Field string // dotted path such as "policy.restore.maxAge"
	Msg   string
}

// Error returns "file:line: field: message".
func (e *Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
	}
	if e.Field == "" {
		return fmt.Sprintf("%s: %s", loc, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", loc, e.Field, e.Msg)
}

func (p *parser) fail(n *yaml.Node, field, format string, args ...any) {
	if p.err != nil {
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.err = &Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// fields checks a mapping's keys against the allowed ones and returns the
// values by key. Unknown and repeated keys are errors.
func (p *parser) fields(n *yaml.Node, path string, allowed ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if n.Kind != yaml.MappingNode {
		what := "a mapping of " + strings.Join(allowed, ", ")
		p.fail(n, path, "expected %s, found %s", what, describe(n))
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.fail(k, path, "a key is not a plain name")
			return out
		}
		known := false
		for _, a := range allowed {
			if k.Value == a {
				known = true
				break
			}
		}
		if !known {
			where := "at the top level"
			if path != "" {
				where = "in " + path
			}
			hint := ""
			for _, a := range allowed {
				if strings.EqualFold(a, k.Value) {
					hint = fmt.Sprintf(" (did you mean %q? names are case-sensitive)", a)
				}
			}
			p.fail(k, "", "unknown field %q %s%s; allowed fields: %s", k.Value, where, hint, strings.Join(allowed, ", "))
			return out
		}
		if _, dup := out[k.Value]; dup {
			p.fail(k, join(path, k.Value), "given twice; keep one")
			return out
		}
		out[k.Value] = v
	}
	return out
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// anyMapping decodes a mapping of names to values of any kind into dst.
// A key that is not a name (a list or a mapping used as a key) is refused
// here, in YAML's terms, rather than by the decoder in Go's.
func (p *parser) anyMapping(n *yaml.Node, path string, dst *map[string]any) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind != yaml.ScalarNode {
			p.fail(k, path, "a key must be a name, found %s", describe(k))
			return
		}
	}
	if err := n.Decode(dst); err != nil {
		p.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
}

func (p *parser) str(n *yaml.Node, path string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.fail(n, path, "expected a string, found %s", describe(n))
		return ""
	}
	return n.Value
}

func (p *parser) boolean(n *yaml.Node, path string) bool {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "true", "on", "yes":
			return true
		case "false", "off", "no":
			return false
		}
	}
	p.fail(n, path, "expected true or false, found %s", describe(n))
	return false
}

func (p *parser) integer(n *yaml.Node, path string, min int) int {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		v, err := strconv.Atoi(n.Value)
		if err == nil && v >= min {
			return v
		}
	}
	p.fail(n, path, "expected a whole number of at least %d, found %s", min, describe(n))
	return 0
}

func (p *parser) duration(n *yaml.Node, path string, zeroOK bool) string {
	s := p.str(n, path)
	if p.err != nil {
		return ""
	}
	d, err := parseDuration(s)
	if err != nil || d < 0 || (!zeroOK && d == 0) {
		p.fail(n, path, "%q is not a duration; use a Go duration such as 30s, 5m or 12h, or days such as 30d", s)
	}
	return s
}

func (p *parser) parse(data []byte) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: p.file, Msg: "the file is empty; it needs at least name: and usually model:"}
		}
		return nil, &Error{File: p.file, Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &Error{File: p.file, Line: extra.Line, Msg: "the file holds more than one YAML document; keep one"}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if hasAlias(root) {
		return nil, &Error{File: p.file, Msg: "YAML anchors and aliases are not supported; write the values out"}
	}
	f := &File{Instructions: DefaultInstructions, Memory: true, Serving: agent.ServingLocal}
	top := p.fields(root, "", "name", "instructions", "maxSteps", "model", "memory", "storage", "serving", "ledger", "policy", "timeouts", "experiments", "evals", "cors", "allowedHosts")
	if v, ok := top["name"]; ok {
		f.Name = p.str(v, "name")
	}
	if p.err == nil && strings.TrimSpace(f.Name) == "" {
		p.fail(root, "name", "missing; name the agent (it scopes every key the runtime stores), e.g. name: support")
	}
	if v, ok := top["instructions"]; ok {
		f.Instructions = p.str(v, "instructions")
		if p.err == nil && f.Instructions == "" {
			p.fail(v, "instructions", "empty; name the instructions file, e.g. instructions.md")
		}
	}
	if v, ok := top["maxSteps"]; ok {
		f.MaxSteps = p.integer(v, "maxSteps", 1)
	}
	if v, ok := top["model"]; ok {
		f.Model = p.model(v, "model")
	}
	if v, ok := top["memory"]; ok {
		p.memory(v, f)
	}
	if v, ok := top["storage"]; ok {
		if !(v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
			f.Storage = p.str(v, "storage")
		}
	}
	if v, ok := top["serving"]; ok {
		f.Serving = p.str(v, "serving")
		if p.err == nil && f.Serving != agent.ServingLocal && f.Serving != agent.ServingLedger {
			p.fail(v, "serving", "%q is not a serving mode; use local or ledger", f.Serving)
		}
	}
	if v, ok := top["ledger"]; ok {
		p.ledger(v, "ledger", f)
	}
	if v, ok := top["policy"]; ok {
		f.Policy = p.policy(v, "policy")
	}
	if v, ok := top["timeouts"]; ok {
		f.Timeouts = p.timeouts(v, "timeouts")
	}
	if v, ok := top["experiments"]; ok {
		f.Experiments = p.experiments(v, "experiments")
	}
	if v, ok := top["evals"]; ok {
		f.Evals = p.evalsSection(v, "evals")
	}
	if v, ok := top["cors"]; ok {
		f.CORSOrigins = p.corsSection(v, "cors")
	}
	if v, ok := top["allowedHosts"]; ok {
		f.AllowedHosts = p.allowedHosts(v, "allowedHosts")
	}
	if p.err != nil {
		return nil, p.err
	}
	return f, nil
}

func hasAlias(n *yaml.Node) bool {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return true
	}
	for _, c := range n.Content {
		if hasAlias(c) {
			return true
		}
	}
	return false
}

// model reads the model section: the provider and its settings, flat
// (provider, baseURL, model, apiKeyEnv, ... script, reply) or in echo: and
// openai: sub-sections as package model documents.
func (p *parser) model(n *yaml.Node, path string) model.Config {
	var c model.Config
	if n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
		// model: echo
		c.Provider = n.Value
		if c.Provider != model.ProviderEcho {
			p.fail(n, path, "%q alone is not a model; write model: echo, or a mapping with provider: openai, baseURL and model", c.Provider)
		}
		return c
	}
	openaiKeys := []string{"baseURL", "model", "apiKeyEnv", "timeout", "maxRetries", "temperature", "maxTokens"}
	echoKeys := []string{"script", "reply"}
	allowed := append(append([]string{"provider"}, openaiKeys...), echoKeys...)
	allowed = append(allowed, "echo", "openai")
	m := p.fields(n, path, allowed...)
	if v, ok := m["provider"]; ok {
		c.Provider = p.str(v, join(path, "provider"))
		if p.err == nil && c.Provider != model.ProviderEcho && c.Provider != model.ProviderOpenAI {
			p.fail(v, join(path, "provider"), "%q is not a model provider; use echo or openai", c.Provider)
		}
	}
	provider := c.Provider
	if provider == "" {
		provider = model.ProviderEcho
	}
	flatOpenAI, flatEcho := false, false
	for _, k := range openaiKeys {
		if _, ok := m[k]; ok {
			flatOpenAI = true
		}
	}
	for _, k := range echoKeys {
		if _, ok := m[k]; ok {
			flatEcho = true
		}
	}
	if v, ok := m["openai"]; ok {
		if flatOpenAI {
			p.fail(v, join(path, "openai"), "the openai settings are given both here and directly under %s; keep one place", path)
		}
		c.OpenAI = p.openai(v, join(path, "openai"))
	} else if flatOpenAI {
		c.OpenAI = p.openaiFields(m, path)
	}
	if v, ok := m["echo"]; ok {
		if flatEcho {
			p.fail(v, join(path, "echo"), "the echo settings are given both here and directly under %s; keep one place", path)
		}
		c.Echo = p.echo(v, join(path, "echo"))
	} else if flatEcho {
		c.Echo = p.echoFields(m, path)
	}
	if p.err != nil {
		return c
	}
	switch provider {
	case model.ProviderEcho:
		if c.OpenAI != nil {
			p.fail(n, path, "openai settings (baseURL, model, apiKeyEnv, ...) are given but the provider is echo; set provider: openai or remove them")
		}
	case model.ProviderOpenAI:
		if c.Echo != nil {
			p.fail(n, path, "echo settings (script, reply) are given but the provider is openai; remove them")
		}
		if c.OpenAI == nil || c.OpenAI.BaseURL == "" || c.OpenAI.Model == "" {
			p.fail(n, path, "the openai provider needs baseURL (the API root, e.g. http://127.0.0.1:8000/v1) and model (the model name the server serves)")
		}
	}
	return c
}

func (p *parser) openai(n *yaml.Node, path string) *model.OpenAIConfig {
	m := p.fields(n, path, "baseURL", "model", "apiKeyEnv", "timeout", "maxRetries", "temperature", "maxTokens")
	return p.openaiFields(m, path)
}

func (p *parser) openaiFields(m map[string]*yaml.Node, path string) *model.OpenAIConfig {
	o := &model.OpenAIConfig{}
	if v, ok := m["baseURL"]; ok {
		o.BaseURL = p.str(v, join(path, "baseURL"))
		if p.err == nil && !strings.HasPrefix(o.BaseURL, "http://") && !strings.HasPrefix(o.BaseURL, "https://") {
			p.fail(v, join(path, "baseURL"), "%q is not an http:// or https:// URL", o.BaseURL)
		}
	}
	if v, ok := m["model"]; ok {
		o.Model = p.str(v, join(path, "model"))
	}
	if v, ok := m["apiKeyEnv"]; ok {
		o.APIKeyEnv = p.str(v, join(path, "apiKeyEnv"))
		if p.err == nil && !isEnvName(o.APIKeyEnv) {
			p.fail(v, join(path, "apiKeyEnv"), "%q is not an environment variable name; give the NAME of the variable holding the key (such as OPENAI_API_KEY), never the key itself", clip(o.APIKeyEnv))
		}
	}
	if v, ok := m["timeout"]; ok {
		o.Timeout = p.duration(v, join(path, "timeout"), false)
	}
	if v, ok := m["maxRetries"]; ok {
		o.MaxRetries = p.integer(v, join(path, "maxRetries"), 0)
	}
	if v, ok := m["temperature"]; ok {
		t, err := strconv.ParseFloat(v.Value, 64)
		if v.Kind != yaml.ScalarNode || err != nil || t < 0 || t > 2 || math.IsNaN(t) {
			p.fail(v, join(path, "temperature"), "expected a number from 0 to 2, found %s", describe(v))
		}
		o.Temperature = &t
	}
	if v, ok := m["maxTokens"]; ok {
		o.MaxTokens = p.integer(v, join(path, "maxTokens"), 1)
	}
	return o
}

func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// clip shortens a value shown in an error, in case it is a secret.
func clip(s string) string {
	if len(s) > 8 {
		return s[:4] + "…"
	}
	return s
}

func (p *parser) echo(n *yaml.Node, path string) *model.EchoConfig {
	return p.echoFields(p.fields(n, path, "script", "reply"), path)
}

func (p *parser) echoFields(m map[string]*yaml.Node, path string) *model.EchoConfig {
	e := &model.EchoConfig{}
	if v, ok := m["reply"]; ok {
		e.Reply = p.str(v, join(path, "reply"))
	}
	if v, ok := m["script"]; ok {
		sp := join(path, "script")
		if v.Kind != yaml.SequenceNode {
			p.fail(v, sp, "expected a list of steps (each with one of tool, text or error), found %s", describe(v))
			return e
		}
		for i, sn := range v.Content {
			stp := fmt.Sprintf("%s[%d]", sp, i)
			fm := p.fields(sn, stp, "tool", "args", "text", "error", "delay")
			var st model.EchoStep
			if x, ok := fm["tool"]; ok {
				st.Tool = p.str(x, join(stp, "tool"))
			}
			if x, ok := fm["text"]; ok {
				st.Text = p.str(x, join(stp, "text"))
			}
			if x, ok := fm["error"]; ok {
				st.Error = p.str(x, join(stp, "error"))
			}
			if x, ok := fm["delay"]; ok {
				st.Delay = p.duration(x, join(stp, "delay"), true)
			}
			if x, ok := fm["args"]; ok {
				if x.Kind != yaml.MappingNode {
					p.fail(x, join(stp, "args"), "expected a mapping of argument names to values, found %s", describe(x))
				} else {
					p.anyMapping(x, join(stp, "args"), &st.Args)
				}
			}
			if p.err != nil {
				return e
			}
			set := 0
			for _, s := range []string{st.Tool, st.Text, st.Error} {
				if s != "" {
					set++
				}
			}
			if set != 1 {
				p.fail(sn, stp, "a step needs exactly one of tool, text or error")
			}
			if st.Args != nil && st.Tool == "" {
				p.fail(sn, join(stp, "args"), "args belong to a tool step; add tool: NAME or remove args")
			}
			e.Script = append(e.Script, st)
		}
	}
	if p.err == nil {
		if _, err := model.NewEcho(e); err != nil {
			p.fail(nil, path, "%v", err)
		}
	}
	return e
}

func (p *parser) memory(n *yaml.Node, f *File) {
	if n.Kind == yaml.MappingNode {
		m := p.fields(n, "memory", "enabled", "maxTextLength")
		if v, ok := m["enabled"]; ok {
			f.Memory = p.boolean(v, "memory.enabled")
		}
		if v, ok := m["maxTextLength"]; ok {
			f.MemoryMaxText = p.integer(v, "memory.maxTextLength", 1)
		}
		return
	}
	if n.Kind != yaml.ScalarNode {
		p.fail(n, "memory", "expected true, false, or a mapping with enabled and maxTextLength; found %s", describe(n))
		return
	}
	f.Memory = p.boolean(n, "memory")
}

// ledger reads the ledger section: the coordination store's URL and the
// lease and queue settings of serving mode ledger.
func (p *parser) ledger(n *yaml.Node, path string, f *File) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	m := p.fields(n, path, "store", "lease", "margin", "maxAttempts", "maxPending", "maxPendingBytes", "maxEventBytes", "retryAfter",
		"idempotencyWindow", "clockSkew", "maxKeys")
	o := &f.Ledger
	if v, ok := m["store"]; ok {
		f.LedgerStore = p.str(v, join(path, "store"))
		if p.err == nil && !strings.Contains(f.LedgerStore, ":") {
			p.fail(v, join(path, "store"), "it is not a store URL: it has no scheme (the value is not repeated, as it may hold a password); use a URL such as postgres://host/db, redis://host:6379/0 or nats://host:4222, or leave it out to coordinate through storage")
		}
	}
	dur := func(key string, dst *time.Duration) {
		if v, ok := m[key]; ok {
			*dst, _ = parseDuration(p.duration(v, join(path, key), false))
		}
	}
	dur("lease", &o.Lease)
	dur("margin", &o.Margin)
	dur("retryAfter", &o.RetryAfter)
	dur("idempotencyWindow", &o.IdempotencyWindow)
	dur("clockSkew", &o.ClockSkew)
	if v, ok := m["maxKeys"]; ok {
		o.MaxKeys = p.integer(v, join(path, "maxKeys"), 1)
	}
	if v, ok := m["maxAttempts"]; ok {
		o.MaxAttempts = p.integer(v, join(path, "maxAttempts"), 1)
	}
	if v, ok := m["maxPending"]; ok {
		o.MaxPending = p.integer(v, join(path, "maxPending"), 1)
	}
	size := func(key string) int64 {
		v, ok := m[key]
		if !ok {
			return 0
		}
		b, err := parseBytes(v.Value)
		if v.Kind != yaml.ScalarNode || err != nil || b <= 0 {
			p.fail(v, join(path, key), "%q is not a size; use a positive number of bytes with an optional unit: B, KB, MB, KiB, MiB (e.g. 8MiB)", v.Value)
			return 0
		}
		return b
	}
	o.MaxPendingBytes = size("maxPendingBytes")
	if b := size("maxEventBytes"); b > 0 {
		if b > 1<<30 {
			p.fail(m["maxEventBytes"], join(path, "maxEventBytes"), "%s is over 1GiB; a queued message is far smaller (the default is 256KiB)", m["maxEventBytes"].Value)
		}
		o.MaxEventBytes = int(b)
	}
	if p.err == nil && o.Lease > 0 && o.Lease < 100*time.Millisecond {
		p.fail(m["lease"], join(path, "lease"), "%v is too short; a lease shorter than 100ms cannot be renewed across a network (the default is 10s)", o.Lease)
	}
}

// timeouts reads the timeouts section: turn and tool, positive durations.
func (p *parser) timeouts(n *yaml.Node, path string) agent.Timeouts {
	var t agent.Timeouts
	m := p.fields(n, path, "turn", "tool")
	if v, ok := m["turn"]; ok {
		t.Turn, _ = parseDuration(p.duration(v, join(path, "turn"), false))
	}
	if v, ok := m["tool"]; ok {
		t.Tool, _ = parseDuration(p.duration(v, join(path, "tool"), false))
	}
	return t
}

func (p *parser) policy(n *yaml.Node, path string) agent.Policy {
	var pol agent.Policy
	m := p.fields(n, path, "debounce", "restore")
	if v, ok := m["debounce"]; ok {
		s := p.duration(v, join(path, "debounce"), true)
		pol.Debounce, _ = parseDuration(s)
	}
	if v, ok := m["restore"]; ok {
		rp := join(path, "restore")
		switch v.Kind {
		case yaml.ScalarNode:
			if v.Value == "off" || v.Value == "false" {
				pol.Restore.Off = true
			} else {
				p.fail(v, rp, "%s is not allowed; use off, or a mapping with maxSessions, maxAge and maxTotalBytes", describe(v))
			}
		case yaml.MappingNode:
			r := p.fields(v, rp, "off", "maxSessions", "maxAge", "maxTotalBytes")
			if x, ok := r["off"]; ok {
				pol.Restore.Off = p.boolean(x, join(rp, "off"))
			}
			if x, ok := r["maxSessions"]; ok {
				pol.Restore.MaxSessions = p.integer(x, join(rp, "maxSessions"), 1)
			}
			if x, ok := r["maxAge"]; ok {
				s := p.duration(x, join(rp, "maxAge"), false)
				pol.Restore.MaxAge, _ = parseDuration(s)
			}
			if x, ok := r["maxTotalBytes"]; ok {
				if x.Kind != yaml.ScalarNode {
					p.fail(x, join(rp, "maxTotalBytes"), "expected a size such as 512MiB or 1GiB, found %s", describe(x))
				} else if b, err := parseBytes(x.Value); err != nil || b == 0 {
					p.fail(x, join(rp, "maxTotalBytes"), "%q is not a size; use a positive number of bytes with an optional unit: B, KB, MB, GB, KiB, MiB, GiB (e.g. 512MiB)", x.Value)
				} else {
					pol.Restore.MaxTotalBytes = b
				}
			}
		default:
			p.fail(v, rp, "expected off, or a mapping with maxSessions, maxAge and maxTotalBytes; found %s", describe(v))
		}
	}
	return pol
}

func (p *parser) experiments(n *yaml.Node, path string) []Experiment {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, path, "expected a list of experiments (each with name and variants), found %s", describe(n))
		return nil
	}
	var out []Experiment
	names := map[string]bool{}
	for i, en := range n.Content {
		ep := fmt.Sprintf("%s[%d]", path, i)
		m := p.fields(en, ep, "name", "variants")
		var e Experiment
		if v, ok := m["name"]; ok {
			e.Name = p.str(v, join(ep, "name"))
		}
		if p.err != nil {
			return nil
		}
		if e.Name == "" {
			p.fail(en, join(ep, "name"), "missing; name the experiment")
			return nil
		}
		if names[e.Name] {
			p.fail(en, join(ep, "name"), "%q names two experiments; names must be unique", e.Name)
			return nil
		}
		names[e.Name] = true
		vn, ok := m["variants"]
		if !ok || vn.Kind != yaml.SequenceNode || len(vn.Content) < 2 {
			p.fail(en, join(ep, "variants"), "an experiment needs a list of at least two variants")
			return nil
		}
		vnames := map[string]bool{}
		for j, vv := range vn.Content {
			vp := fmt.Sprintf("%s.variants[%d]", ep, j)
			fm := p.fields(vv, vp, "name", "weight", "instructions", "model", "options")
			va := Variant{Weight: 1}
			if x, ok := fm["name"]; ok {
				va.Name = p.str(x, join(vp, "name"))
			}
			if p.err == nil && va.Name == "" {
				p.fail(vv, join(vp, "name"), "missing; name the variant")
			}
			if p.err == nil && vnames[va.Name] {
				p.fail(vv, join(vp, "name"), "%q names two variants; names must be unique in an experiment", va.Name)
			}
			vnames[va.Name] = true
			if x, ok := fm["weight"]; ok {
				w, err := strconv.ParseFloat(x.Value, 64)
				if x.Kind != yaml.ScalarNode || err != nil || !(w > 0) || math.IsInf(w, 0) {
					p.fail(x, join(vp, "weight"), "expected a positive number, found %s", describe(x))
				}
				va.Weight = w
			}
			if x, ok := fm["instructions"]; ok {
				va.Instructions = p.str(x, join(vp, "instructions"))
			}
			if x, ok := fm["model"]; ok {
				mc := p.model(x, join(vp, "model"))
				va.Model = &mc
			}
			if x, ok := fm["options"]; ok {
				if x.Kind != yaml.MappingNode {
					p.fail(x, join(vp, "options"), "expected a mapping, found %s", describe(x))
				} else {
					p.anyMapping(x, join(vp, "options"), &va.Options)
				}
			}
			if p.err != nil {
				return nil
			}
			e.Variants = append(e.Variants, va)
		}
		out = append(out, e)
	}
	return out
}
