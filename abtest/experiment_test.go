package abtest_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"agentkit/abtest"
)

func TestAssignIsDeterministicAndFollowsWeights(t *testing.T) {
	e := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{
		{Name: "plain", Weight: 3}, {Name: "friendly"}, // weight 0 means 1
	}}
	const n = 20000
	counts := make([]int, 2)
	for i := range n {
		id := fmt.Sprintf("session-%d", i)
		v := e.Assign(id)
		if again := e.Assign(id); again != v {
			t.Fatalf("Assign(%q) gave %d then %d: enrolment must be deterministic", id, v, again)
		}
		counts[v]++
	}
	// Weights 3:1 give 75% / 25%; 20000 draws put 4.5 standard deviations
	// within ±1.4 points.
	if share := float64(counts[0]) / n; math.Abs(share-0.75) > 0.014 {
		t.Errorf("the 3:1 variant got %.3f of sessions, want 0.75 ± 0.014 (counts %v)", share, counts)
	}
	// The same session lands in variants of two experiments independently:
	// a 1:1 split of the plain sessions of one experiment by another.
	other := abtest.Experiment{Name: "model", Variants: []abtest.Variant{{Name: "a"}, {Name: "b"}}}
	both := 0
	for i := range n {
		id := fmt.Sprintf("session-%d", i)
		if e.Assign(id) == 0 && other.Assign(id) == 0 {
			both++
		}
	}
	if share := float64(both) / float64(counts[0]); math.Abs(share-0.5) > 0.025 {
		t.Errorf("experiment %q split %q's plain sessions %.3f / %.3f; experiments must assign independently", other.Name, e.Name, share, 1-share)
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	err := abtest.Validate([]abtest.Experiment{
		{Name: "", Variants: []abtest.Variant{{Name: "a"}, {Name: "b"}}},
		{Name: "one", Variants: []abtest.Variant{{Name: "a"}}},
		{Name: "dup", Variants: []abtest.Variant{{Name: "a"}, {Name: "a"}}},
		{Name: "dup", Variants: []abtest.Variant{{Name: "a", Weight: -1}, {Name: "b", Weight: math.NaN()}}},
		{Name: "ok", Variants: []abtest.Variant{{Name: "", Weight: 1}, {Name: "b"}}},
	})
	if err == nil {
		t.Fatal("Validate accepted broken experiments")
	}
	for _, want := range []string{
		"experiment 1 has no name",
		`experiment "one" has 1 variant(s); give it at least two`,
		`experiment "dup", variant "a" is defined twice`,
		`experiment "dup" is defined twice`,
		`variant "a": weight -1 is not allowed`,
		`variant "b": weight NaN is not allowed`,
		`experiment "ok", variant 1 has no name`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate's error lacks %q:\n%v", want, err)
		}
	}
	if err := abtest.Validate([]abtest.Experiment{{Name: "x", Variants: []abtest.Variant{{Name: "a"}, {Name: "b", Weight: 0.5}}}}); err != nil {
		t.Errorf("Validate refused a valid experiment: %v", err)
	}
}

func TestOptionsTravelInTheContext(t *testing.T) {
	ctx := context.Background()
	if got := abtest.Options(ctx); got != nil {
		t.Errorf("Options outside an enrolled session = %v, want nil", got)
	}
	opts := map[string]any{"style": "terse"}
	ctx = abtest.WithOptions(ctx, opts)
	opts["style"] = "changed by the caller"
	got := abtest.Options(ctx)
	if got["style"] != "terse" {
		t.Errorf("Options = %v, want the options as given to WithOptions", got)
	}
	got["style"] = "changed by a reader"
	if abtest.Options(ctx)["style"] != "terse" {
		t.Error("a reader changing its map changed the options of the turn")
	}
}

func TestVariantChanges(t *testing.T) {
	v := abtest.Variant{Name: "b", Instructions: "be brief", Options: map[string]any{"z": 1, "a": 2}}
	if got := strings.Join(v.Changes(), " "); got != "instructions options:a,z" {
		t.Errorf("Changes = %q", got)
	}
	if got := (abtest.Variant{Name: "control"}).Changes(); len(got) != 0 {
		t.Errorf("a control changes %v", got)
	}
}
