package abtest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"sort"
	"strings"

	"agentkit/model"
)

// MaxNameBytes bounds experiment and variant names.
const MaxNameBytes = 128

// Experiment is an A/B experiment: a name and two or more variants. Each
// new session (except eval sessions) is enrolled in every experiment when
// it starts.
type Experiment struct {
	// Name identifies the experiment in the event log, the samples and the
	// figures. Required, unique among an agent's experiments.
	Name string
	// Variants are the arms, at least two. The first is the control the
	// others are compared with.
	Variants []Variant
}

// Variant is one arm of an experiment. Instructions, Model and Options
// change the agent for the sessions enrolled in it; a variant that changes
// nothing is the agent as defined (a control).
type Variant struct {
	// Name identifies the variant within its experiment. Required.
	Name string
	// Weight is the variant's share of sessions, relative to the other
	// variants' weights. Zero means 1; negative, NaN or infinite is an
	// error.
	Weight float64
	// Instructions, when not empty, replaces the agent's instructions (the
	// system prompt) in the variant's sessions.
	Instructions string
	// Model, when not nil, answers the variant's sessions instead of the
	// agent's model.
	Model model.Model
	// Options are handler options the agent's tools and hooks read with
	// Options(ctx), such as {"style": "terse"}. Nil means none.
	Options map[string]any
}

// weight returns the variant's effective weight.
func (v Variant) weight() float64 {
	if v.Weight == 0 {
		return 1
	}
	return v.Weight
}

// Changes lists what the variant changes, for the figures: "instructions",
// "model:NAME", "options:K1,K2"; empty for a control.
func (v Variant) Changes() []string {
	var out []string
	if v.Instructions != "" {
		out = append(out, "instructions")
	}
	if v.Model != nil {
		out = append(out, "model:"+v.Model.Name())
	}
	if len(v.Options) > 0 {
		keys := make([]string, 0, len(v.Options))
		for k := range v.Options {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out = append(out, "options:"+strings.Join(keys, ","))
	}
	return out
}

// Validate checks a set of experiments: names present, unique and at most
// MaxNameBytes long, at least two variants each with unique names, and
// weights that are positive numbers (zero meaning 1). Every problem is
// reported, each naming the experiment and variant.
func Validate(exps []Experiment) error {
	var errs []error
	seen := map[string]bool{}
	for i, e := range exps {
		where := fmt.Sprintf("experiment %d", i+1)
		if e.Name != "" {
			where = fmt.Sprintf("experiment %q", e.Name)
		}
		switch {
		case strings.TrimSpace(e.Name) == "":
			errs = append(errs, fmt.Errorf("abtest: %s has no name; name it (the name labels its samples and figures)", where))
		case len(e.Name) > MaxNameBytes:
			errs = append(errs, fmt.Errorf("abtest: %s: the name is %d bytes; use at most %d", where, len(e.Name), MaxNameBytes))
		case seen[e.Name]:
			errs = append(errs, fmt.Errorf("abtest: %s is defined twice; experiment names must be unique", where))
		}
		seen[e.Name] = true
		if len(e.Variants) < 2 {
			errs = append(errs, fmt.Errorf("abtest: %s has %d variant(s); give it at least two (the first is the control)", where, len(e.Variants)))
		}
		vseen := map[string]bool{}
		for j, v := range e.Variants {
			vwhere := fmt.Sprintf("%s, variant %d", where, j+1)
			if v.Name != "" {
				vwhere = fmt.Sprintf("%s, variant %q", where, v.Name)
			}
			switch {
			case strings.TrimSpace(v.Name) == "":
				errs = append(errs, fmt.Errorf("abtest: %s has no name; name it", vwhere))
			case len(v.Name) > MaxNameBytes:
				errs = append(errs, fmt.Errorf("abtest: %s: the name is %d bytes; use at most %d", vwhere, len(v.Name), MaxNameBytes))
			case vseen[v.Name]:
				errs = append(errs, fmt.Errorf("abtest: %s is defined twice; variant names must be unique in an experiment", vwhere))
			}
			vseen[v.Name] = true
			if v.Weight < 0 || math.IsNaN(v.Weight) || math.IsInf(v.Weight, 0) {
				errs = append(errs, fmt.Errorf("abtest: %s: weight %v is not allowed; use a positive number (0 means 1)", vwhere, v.Weight))
			}
		}
	}
	return errors.Join(errs...)
}

// Assign returns the index of the variant a session is enrolled in. It
// depends only on the experiment's name, the variants' weights in order
// and the session id: the same session gets the same variant on every
// host, and each variant gets sessions in proportion to its weight. A
// SHA-256 of the experiment name and the session id picks a point in
// [0, total weight); experiments with different names split sessions
// independently.
func (e Experiment) Assign(sessionID string) int {
	total := 0.0
	for _, v := range e.Variants {
		total += v.weight()
	}
	h := sha256.Sum256([]byte(e.Name + "\x00" + sessionID))
	u := float64(binary.BigEndian.Uint64(h[:8])>>11) / (1 << 53) // uniform in [0, 1)
	x := u * total
	for i, v := range e.Variants {
		if x < v.weight() {
			return i
		}
		x -= v.weight()
	}
	return len(e.Variants) - 1 // rounding at the top end
}

// Variant returns the variant named name, or false.
func (e Experiment) Variant(name string) (Variant, bool) {
	for _, v := range e.Variants {
		if v.Name == name {
			return v, true
		}
	}
	return Variant{}, false
}

// Assignment is a session's variant in one experiment.
type Assignment struct {
	Experiment string `json:"experiment"`
	Variant    string `json:"variant"`
}

type optionsKey struct{}

// WithOptions returns ctx carrying the handler options of the variants a
// session is enrolled in. The runtime calls it for every turn of an
// enrolled session; tools and hooks read the options with Options.
func WithOptions(ctx context.Context, opts map[string]any) context.Context {
	if len(opts) == 0 {
		return ctx
	}
	return context.WithValue(ctx, optionsKey{}, maps.Clone(opts))
}

// Options returns the handler options of the variants the turn's session
// is enrolled in, merged over experiments (an experiment listed later wins
// a key both set), or nil outside an enrolled session. The map is the
// caller's to keep; changing it changes nothing else.
func Options(ctx context.Context) map[string]any {
	m, _ := ctx.Value(optionsKey{}).(map[string]any)
	return maps.Clone(m)
}
