package evals

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode/utf8"

	"agentkit/agent"
	"agentkit/internal/jsonerr"
)

// MaxCases is the most cases one run takes.
const MaxCases = 10000

// maxLineBytes bounds one line of a cases file.
const maxLineBytes = agent.MaxMessageBytes + 64<<10

// Case is one eval case: a message sent as the first turn of a fresh
// session on channel "eval", and what its answer must satisfy.
//
// In a cases file (JSONL) a case is one line:
//
//	{"name": "greets", "input": "hello", "expect": {"contains": "hello"}}
type Case struct {
	// Name identifies the case in results. Required, unique in a run.
	Name string `json:"name"`
	// Input is the user message. Required.
	Input string `json:"input"`
	// Expect holds the file-defined graders; every one set must pass. A
	// case with neither Expect nor Grade passes when its turn completes.
	Expect Expect `json:"expect,omitzero"`
	// Grade is a grader written in Go, run after the Expect graders; the
	// case passes when all pass. It cannot come from a file.
	Grade GradeFunc `json:"-"`
}

// Expect is what a case's answer must satisfy. Each field set is one
// grader; a nil field is no grader.
type Expect struct {
	// Exact: the answer, without leading and trailing white space, is this
	// text.
	Exact *string `json:"exact,omitempty"`
	// Contains: the answer contains this text.
	Contains *string `json:"contains,omitempty"`
	// Regexp: the answer matches this regular expression (Go RE2 syntax,
	// unanchored unless the pattern anchors itself with ^ and $).
	Regexp *string `json:"regexp,omitempty"`

	re *regexp.Regexp
}

// IsZero reports whether no grader is set.
func (e Expect) IsZero() bool { return e.Exact == nil && e.Contains == nil && e.Regexp == nil }

// GradeFunc grades a case's answer in Go. It returns whether the answer
// passes and, when it does not, a reason shown with the result. An error
// means the grader itself could not decide (a failed call to a judge
// model, say): the case counts as errored, not failed.
type GradeFunc func(ctx context.Context, c Case, answer string) (pass bool, reason string, err error)

// Grade is how a case's answer was judged.
type Grade struct {
	// Pass is true when every grader passed.
	Pass bool `json:"pass"`
	// Graders names the graders that ran: exact, contains, regexp, go.
	Graders []string `json:"graders"`
	// Reason says why the answer failed, naming the grader.
	Reason string `json:"reason,omitempty"`
}

// CaseError is a problem in a cases file or case list: where it is and
// what to change.
type CaseError struct {
	// File names the cases file ("" for cases given in Go or JSON).
	File string
	// Line is the line in File, or the case's position (from 1) otherwise.
	Line int
	// Msg says what is wrong and what is allowed.
	Msg string
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *CaseError) Is(target error) bool { return target == ErrInvalid }

// Error returns "file:line: message", or "case N: message"; "file:
// message", or the message alone, for a problem of the whole file or list
// (Line 0).
func (e *CaseError) Error() string {
	switch {
	case e.File != "" && e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	case e.File != "":
		return e.File + ": " + e.Msg
	case e.Line > 0:
		return fmt.Sprintf("case %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

// ParseCases reads cases in JSONL: one JSON object per line with the
// fields name, input and expect (exact, contains, regexp). Blank lines and
// lines starting with # are skipped. Unknown fields, a missing or repeated
// name, an empty input and a regexp that does not compile are errors
// (*CaseError) naming the file (name) and line.
func ParseCases(r io.Reader, name string) ([]Case, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	var cases []Case
	lines := []int{}
	line, skipped := 0, false
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 || text[0] == '#' {
			skipped = true
			continue
		}
		if len(cases) == MaxCases {
			return nil, &CaseError{File: name, Line: line, Msg: fmt.Sprintf("more than %d cases; split the file into several runs", MaxCases)}
		}
		c, err := decodeCase(text)
		if err != nil {
			return nil, &CaseError{File: name, Line: line, Msg: err.Error()}
		}
		cases = append(cases, c)
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &CaseError{File: name, Line: line + 1, Msg: fmt.Sprintf("the line is over %d bytes; a case's input is at most %d bytes", maxLineBytes, agent.MaxMessageBytes)}
		}
		return nil, fmt.Errorf("evals: reading %s: %w", name, err)
	}
	if len(cases) == 0 {
		what := "it is empty"
		if skipped {
			what = "it holds only blank lines and comments"
		}
		return nil, &CaseError{File: name, Msg: "no cases: " + what + "; write one JSON object per line, such as " + exampleCase}
	}
	if err := check(cases, name, lines); err != nil {
		return nil, err
	}
	return cases, nil
}

// exampleCase is a case as a cases file or list holds it.
const exampleCase = `{"name": "greets", "input": "hello", "expect": {"contains": "hello"}}`

// decodeCase decodes one case strictly. Its errors speak of JSON and the
// case's fields (expect.exact), never of the Go types they decode into.
func decodeCase(data []byte) (Case, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Case
	if err := dec.Decode(&c); err != nil {
		msg := jsonerr.Describe(err, "the case")
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field == "":
			msg = fmt.Sprintf("a case is a JSON object such as %s, not a JSON %s", exampleCase, te.Value)
		case strings.HasPrefix(msg, "unknown field"):
			msg += `; a case has name, input and expect, and expect has exact, contains and regexp`
		}
		return Case{}, errors.New("not a case: " + msg)
	}
	if dec.More() {
		return Case{}, errors.New("more than one JSON value on the line; write one case per line")
	}
	return c, nil
}

// DecodeCases reads cases given as a JSON array, with the same fields and
// checks as ParseCases; errors name the case's position.
func DecodeCases(data []byte) ([]Case, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		msg := jsonerr.Describe(err, "the cases")
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			msg = fmt.Sprintf("expected a JSON array of cases, such as [%s], found a JSON %s", exampleCase, te.Value)
		}
		return nil, &CaseError{Msg: msg}
	}
	cases := make([]Case, 0, len(raw))
	for i, r := range raw {
		c, err := decodeCase(r)
		if err != nil {
			return nil, &CaseError{Line: i + 1, Msg: err.Error()}
		}
		cases = append(cases, c)
	}
	return cases, Check(cases)
}

// Check validates cases given in Go: at least one and at most MaxCases,
// names present and unique, inputs non-empty valid UTF-8 within
// agent.MaxMessageBytes, regexps that compile. It compiles the regexps.
func Check(cases []Case) error {
	if len(cases) == 0 {
		return fmt.Errorf("%w: no cases; give at least one", ErrInvalid)
	}
	if len(cases) > MaxCases {
		return fmt.Errorf("%w: %d cases; a run takes at most %d", ErrInvalid, len(cases), MaxCases)
	}
	return check(cases, "", nil)
}

func check(cases []Case, file string, lines []int) error {
	names := map[string]int{}
	for i := range cases {
		c := &cases[i]
		pos := i + 1
		if lines != nil {
			pos = lines[i]
		}
		fail := func(format string, args ...any) error {
			return &CaseError{File: file, Line: pos, Msg: fmt.Sprintf(format, args...)}
		}
		switch {
		case strings.TrimSpace(c.Name) == "":
			return fail(`the case has no "name"; name every case, uniquely`)
		case len(c.Name) > 256:
			return fail("the name is %d bytes; use at most 256", len(c.Name))
		case strings.TrimSpace(c.Input) == "":
			return fail(`case %q has no "input"; give the message to send`, c.Name)
		case len(c.Input) > agent.MaxMessageBytes:
			return fail("case %q: the input is %d bytes, over the %d-byte message limit", c.Name, len(c.Input), agent.MaxMessageBytes)
		case !utf8.ValidString(c.Input) || strings.IndexByte(c.Input, 0) >= 0:
			return fail("case %q: the input is not valid UTF-8 text", c.Name)
		}
		if first, dup := names[c.Name]; dup {
			return fail("the name %q is used twice (first at %d); names must be unique", c.Name, first)
		}
		names[c.Name] = pos
		if c.Expect.Regexp != nil {
			re, err := regexp.Compile(*c.Expect.Regexp)
			if err != nil {
				return fail("case %q: expect.regexp %q does not compile: %v", c.Name, *c.Expect.Regexp, err)
			}
			c.Expect.re = re
		}
	}
	return nil
}

// grade runs the case's graders on answer.
func grade(ctx context.Context, c Case, answer string) (g Grade, err error) {
	g = Grade{Pass: true, Graders: []string{}}
	fail := func(reason string) {
		if g.Pass {
			g.Pass, g.Reason = false, reason
		}
	}
	e := c.Expect
	if e.Exact != nil {
		g.Graders = append(g.Graders, "exact")
		if got := strings.TrimSpace(answer); got != *e.Exact {
			fail(fmt.Sprintf("exact: the answer is %s, expected %s", quote(got), quote(*e.Exact)))
		}
	}
	if e.Contains != nil {
		g.Graders = append(g.Graders, "contains")
		if !strings.Contains(answer, *e.Contains) {
			fail(fmt.Sprintf("contains: the answer %s does not contain %s", quote(answer), quote(*e.Contains)))
		}
	}
	if e.Regexp != nil {
		g.Graders = append(g.Graders, "regexp")
		re := e.re
		if re == nil {
			if re, err = regexp.Compile(*e.Regexp); err != nil {
				return g, fmt.Errorf("expect.regexp does not compile: %w", err)
			}
		}
		if !re.MatchString(answer) {
			fail(fmt.Sprintf("regexp: the answer %s does not match %s", quote(answer), quote(*e.Regexp)))
		}
	}
	if c.Grade != nil {
		g.Graders = append(g.Graders, "go")
		pass, reason, err := callGrader(ctx, c, answer)
		if err != nil {
			return g, fmt.Errorf("the Go grader failed: %w", err)
		}
		if !pass {
			if reason == "" {
				reason = "the answer did not pass"
			}
			fail("go: " + reason)
		}
	}
	return g, nil
}

// callGrader runs a Go grader, turning a panic into an error.
func callGrader(ctx context.Context, c Case, answer string) (pass bool, reason string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("it panicked: %v", p)
		}
	}()
	return c.Grade(ctx, c, answer)
}

// quote shows a text in a reason, cut to 200 bytes.
func quote(s string) string {
	const max = 200
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return fmt.Sprintf("%q…", s[:cut])
	}
	return fmt.Sprintf("%q", s)
}
