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
		{`["a"]`, `cases.jsonl:1: not a case: a case is a JSON object such as {"name": "greets", "input": "hello", "expect": {"contains": "hello"}}, not a JSON array`},
		{`"a"`, `cases.jsonl:1: not a case: a case is a JSON object such as {"name": "greets", "input": "hello", "expect": {"contains": "hello"}}, not a JSON string`},
		{"", `cases.jsonl: no cases: it is empty; write one JSON object per line, such as {"name": "greets"`},
		{"# only a comment\n\n", `cases.jsonl: no cases: it holds only blank lines and comments; write one JSON object per line`},
		{`{"name": "a", "input": "x", "expect": {"exact": 3}}`, `cases.jsonl:1: not a case: expect.exact: expected a string, found a JSON number`},
		{`{"name": "a", "input": "x", "expect": "y"}`, `cases.jsonl:1: not a case: expect: expected an object, found a JSON string`},
		{`{"name": 7, "input": "x"}`, `cases.jsonl:1: not a case: name: expected a string, found a JSON number`},
		{`{"name": "a", "input": ["x"]}`, `cases.jsonl:1: not a case: input: expected a string, found a JSON array`},
		{`{"name": "a",`, `cases.jsonl:1: not a case: the case is cut short: it is not a complete JSON value`},
		{`{"name" "a"}`, `cases.jsonl:1: not a case: the case is not valid JSON (at byte 9): invalid character`},
	} {
		_, err := evals.ParseCases(strings.NewReader(c.src), "cases.jsonl")
		var ce *evals.CaseError
		if !errors.As(err, &ce) || !errors.Is(err, evals.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseCases(%q) = %v, want a *CaseError containing %q", c.src, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), ":0:") || strings.Contains(err.Error(), "Go ") || strings.Contains(err.Error(), "evals.")) {
			t.Errorf("ParseCases(%q) = %v: a line 0 or a Go type name", c.src, err)
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

// Cases given as a JSON array (POST /v1/evals) are worded in JSON's terms
// too, naming the case's position; a value that is not an array says what
// to send.
func TestDecodeCasesSpeaksJSON(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{`5`, `expected a JSON array of cases, such as [{"name": "greets", "input": "hello", "expect": {"contains": "hello"}}], found a JSON number`},
		{`{"name": "a"}`, `expected a JSON array of cases, such as [{"name": "greets"`},
		{`[5]`, `case 1: not a case: a case is a JSON object such as {"name": "greets", "input": "hello", "expect": {"contains": "hello"}}, not a JSON number`},
		{`[{"name": "a", "input": "x"}, {"name": 5}]`, `case 2: not a case: name: expected a string, found a JSON number`},
		{`[{"name": "a", "input": "x", "expect": "y"}]`, `case 1: not a case: expect: expected an object, found a JSON string`},
	} {
		_, err := evals.DecodeCases([]byte(c.src))
		if !errors.Is(err, evals.ErrInvalid) || err.Error() != c.want && !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("DecodeCases(%s) = %v; want %q", c.src, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), "Go ") || strings.Contains(err.Error(), "json.") || strings.Contains(err.Error(), "evals.")) {
			t.Errorf("DecodeCases(%s) = %v names a Go type", c.src, err)
		}
	}
}
