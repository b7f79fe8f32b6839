package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"agentkit/abtest"
	"agentkit/model"
	"agentkit/server"
)

// Evals is the evals: section of agentkit.yaml: the eval history window and
// the heartbeat of running runs (package evals). Zero fields take the
// defaults (50 runs, 10s).
type Evals struct {
	HistoryWindow int
	Heartbeat     time.Duration
}

// evalsSection reads evals: {historyWindow, heartbeat}.
func (p *parser) evalsSection(n *yaml.Node, path string) Evals {
	var e Evals
	m := p.fields(n, path, "historyWindow", "heartbeat")
	if v, ok := m["historyWindow"]; ok {
		e.HistoryWindow = p.integer(v, join(path, "historyWindow"), 1)
	}
	if v, ok := m["heartbeat"]; ok {
		s := p.duration(v, join(path, "heartbeat"), false)
		e.Heartbeat, _ = parseDuration(s)
	}
	return e
}

// corsSection reads cors: {origins: [...]}: the origins of browser pages
// allowed to call the API (server.CheckOrigins).
func (p *parser) corsSection(n *yaml.Node, path string) []string {
	m := p.fields(n, path, "origins")
	v, ok := m["origins"]
	if !ok || p.err != nil {
		return nil
	}
	op := join(path, "origins")
	if v.Kind != yaml.SequenceNode {
		p.fail(v, op, "expected a list of origins such as [https://chat.example.com], found %s", describe(v))
		return nil
	}
	var out []string
	for i, o := range v.Content {
		s := p.str(o, fmt.Sprintf("%s[%d]", op, i))
		if p.err != nil {
			return nil
		}
		if err := server.CheckOrigins([]string{s}); err != nil {
			p.fail(o, fmt.Sprintf("%s[%d]", op, i), "%s", strings.TrimPrefix(err.Error(), "server: "))
			return nil
		}
		out = append(out, s)
	}
	return out
}

// allowedHosts reads allowedHosts: [...]: the names clients reach the
// server by, beyond the loopback names (server.CheckHostNames).
func (p *parser) allowedHosts(n *yaml.Node, path string) []string {
	if n.Kind != yaml.SequenceNode {
		p.fail(n, path, "expected a list of host names such as [agent.example.com], found %s", describe(n))
		return nil
	}
	var out []string
	for i, h := range n.Content {
		where := fmt.Sprintf("%s[%d]", path, i)
		s := p.str(h, where)
		if p.err != nil {
			return nil
		}
		if err := server.CheckHostNames([]string{s}); err != nil {
			p.fail(h, where, "%s", strings.TrimPrefix(err.Error(), "server: "))
			return nil
		}
		out = append(out, s)
	}
	return out
}

// loadVariantInstructions reads the instructions file of each variant that
// names one, relative to the project folder.
func (f *File) loadVariantInstructions() error {
	for i := range f.Experiments {
		e := &f.Experiments[i]
		for j := range e.Variants {
			v := &e.Variants[j]
			if v.Instructions == "" {
				continue
			}
			p := v.Instructions
			if !filepath.IsAbs(p) {
				p = filepath.Join(f.Dir, p)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("config: %s: experiments: %s, variant %s: the instructions file %s does not exist; create it or fix the path (relative to the project folder)", f.Path, e.Name, v.Name, p)
				}
				return fmt.Errorf("config: %s: experiments: %s, variant %s: %w", f.Path, e.Name, v.Name, err)
			}
			v.InstructionsText = string(b)
		}
	}
	return nil
}

// abExperiments returns the file's experiments for the runtime, with the
// variants' models built.
func (f *File) abExperiments() ([]abtest.Experiment, error) {
	var out []abtest.Experiment
	for _, e := range f.Experiments {
		x := abtest.Experiment{Name: e.Name}
		for _, v := range e.Variants {
			av := abtest.Variant{Name: v.Name, Weight: v.Weight, Instructions: v.InstructionsText, Options: v.Options}
			if v.Instructions != "" && v.InstructionsText == "" {
				// Parse without Load: the file was not read. An empty
				// file changes nothing either way.
				av.Instructions = ""
			}
			if v.Model != nil {
				m, err := model.FromConfig(v.Model)
				if err != nil {
					return nil, fmt.Errorf("config: %s: experiments: %s, variant %s: %w", f.where(), e.Name, v.Name, err)
				}
				av.Model = m
			}
			x.Variants = append(x.Variants, av)
		}
		out = append(out, x)
	}
	if err := abtest.Validate(out); err != nil {
		return nil, fmt.Errorf("config: %s: %w", f.where(), err)
	}
	return out, nil
}
