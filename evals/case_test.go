package evals_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"agentkit/evals"
)

func TestParseCasesReadsTheInitFormat(t *testing.T) {
	src := `{"name": "echoes-the-message", "input": "hello", "expect": {"exact": "echo: hello"}}

# a comment line
{"name": "keeps-non-ascii-text", "input": "grüß dich, 世界", "expect": {"contains": "grüß dich, 世界"}}
{"name": "answers-with-the-echo-prefix", "input": "what is 2 + 2?", "expect": {"regexp": "^echo: what is 2 \\+ 2\\?$"}}
{"name": "no-expectation", "input": "anything"}
{"name": "two-graders", "input": "x", "expect": {"contains": "echo", "regexp": "x$"}}
`
	cases, err := evals.ParseCases(strings.NewReader(src), "cases.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 5 || cases[0].Name != "echoes-the-message" || *cases[0].Expect.Exact != "echo: hello" ||
		*cases[1].Expect.Contains != "grüß dich, 世界" || *cases[2].Expect.Regexp != `^echo: what is 2 \+ 2\?$` ||
		!cases[3].Expect.IsZero() || cases[4].Expect.Contains == nil || cases[4].Expect.Regexp == nil {
		t.Errorf("cases = %+v", cases)
	}
}

func TestParseCasesNamesTheLineAndWhatToChange(t *testing.T) {
	for _, c := range []struct {
		src, want string
	}{
		{`{"name": "a", "input": "x", "expected": {"exact": "y"}}`, `cases.jsonl:1: not a case: unknown field "expected"; a case has name, input and expect`},
		{"\n" + `{"name": "a", "input": "x", "expect": {"equals": "y"}}`, `cases.jsonl:2: not a case: unknown field "equals"`},
		{`{"input": "x"}`, `cases.jsonl:1: the case has no "name"`},
		{`{"name": "a", "input": " "}`, `cases.jsonl:1: case "a" has no "input"`},
		{`{"name": "a", "input": "x"}` + "\n\n" + `{"name": "a", "input": "y"}`, `cases.jsonl:3: the name "a" is used twice (first at 1)`},
		{`{"name": "a", "input": "x", "expect": {"regexp": "("}}`, `cases.jsonl:1: case "a": expect.regexp "(" does not compile`},
		{`{"name": "a", "input": "x"} {"name": "b"}`, `cases.jsonl:1: more than one JSON value on the line`},
		{`["a"]`, `cases.jsonl:1: not a case: cannot unmarshal array`},
		{"# only a comment\n", `cases.jsonl:1: no cases`},
		{`{"name": "a", "input": "x", "expect": {"exact": 3}}`, `cases.jsonl:1: not a case: cannot unmarshal number`},
	} {
		_, err := evals.ParseCases(strings.NewReader(c.src), "cases.jsonl")
		var ce *evals.CaseError
		if !errors.As(err, &ce) || !errors.Is(err, evals.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseCases(%q) = %v, want a *CaseError containing %q", c.src, err, c.want)
		}
	}
}

func TestGraders(t *testing.T) {
	s := func(v string) *string { return &v }
	for _, c := range []struct {
		name   string
		expect evals.Expect
		grade  evals.GradeFunc
		answer string
		status evals.CaseStatus
		reason string
	}{
		{"exact ignores surrounding space", evals.Expect{Exact: s("echo: hi")}, nil, "  echo: hi\n", evals.CasePassed, ""},
		{"exact differs", evals.Expect{Exact: s("echo: hi")}, nil, "echo: hi!", evals.CaseFailed, `exact: the answer is "echo: hi!", expected "echo: hi"`},
		{"contains", evals.Expect{Contains: s("hi")}, nil, "oh hi there", evals.CasePassed, ""},
		{"contains misses", evals.Expect{Contains: s("bye")}, nil, "oh hi", evals.CaseFailed, `contains: the answer "oh hi" does not contain "bye"`},
		{"regexp", evals.Expect{Regexp: s(`^\d+$`)}, nil, "42", evals.CasePassed, ""},
		{"regexp misses", evals.Expect{Regexp: s(`^\d+$`)}, nil, "42 apples", evals.CaseFailed, `regexp: the answer "42 apples" does not match`},
		{"every grader must pass", evals.Expect{Contains: s("4"), Regexp: s(`^x`)}, nil, "42", evals.CaseFailed, "regexp:"},
		{"no grader: a completed turn passes", evals.Expect{}, nil, "anything", evals.CasePassed, ""},
		{"go grader passes", evals.Expect{Contains: s("4")}, func(ctx context.Context, c evals.Case, a string) (bool, string, error) { return a == "42", "", nil }, "42", evals.CasePassed, ""},
		{"go grader fails", evals.Expect{}, func(ctx context.Context, c evals.Case, a string) (bool, string, error) {
			return false, "not polite", nil
		}, "no", evals.CaseFailed, "go: not polite"},
		{"go grader errors", evals.Expect{}, func(ctx context.Context, c evals.Case, a string) (bool, string, error) {
			return false, "", errors.New("judge down")
		}, "no", evals.CaseErrored, "the Go grader failed: judge down"},
		{"go grader panics", evals.Expect{}, func(ctx context.Context, c evals.Case, a string) (bool, string, error) { panic("oops") }, "no", evals.CaseErrored, "it panicked: oops"},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := runCases(t, []evals.Case{{Name: "c", Input: "q", Expect: c.expect, Grade: c.grade}}, fixedAnswer(c.answer))
			got := run.Cases[0]
			why := got.Error
			if got.Grade != nil && why == "" {
				why = got.Grade.Reason
			}
			if got.Status != c.status || !strings.Contains(why, c.reason) {
				t.Errorf("status %s (%q), want %s (%q)", got.Status, why, c.status, c.reason)
			}
		})
	}
}
