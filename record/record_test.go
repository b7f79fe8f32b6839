package record_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"agentkit/record"
)

var kind = record.NewKind("test record", 2)

type plain struct {
	Name string `json:"name"`
}

type parted struct {
	Name  string `json:"name"`
	Parts int    `json:"parts,omitempty"`
}

func (p parted) RecordVersion() int {
	if p.Parts > 0 {
		return 2
	}
	return 1
}

type own struct {
	V    int    `json:"v"`
	Name string `json:"name"`
}

func TestMarshalPutsTheVersionFirst(t *testing.T) {
	for _, tc := range []struct {
		rec  any
		want string
	}{
		{plain{Name: "a"}, `{"v":1,"name":"a"}`},
		{struct{}{}, `{"v":1}`},
		{parted{Name: "b"}, `{"v":1,"name":"b"}`},
		{parted{Name: "b", Parts: 3}, `{"v":2,"name":"b","parts":3}`},
		{own{V: 2, Name: "c"}, `{"v":2,"name":"c"}`},
	} {
		got, err := record.Marshal(kind, tc.rec)
		if err != nil || string(got) != tc.want {
			t.Errorf("Marshal(%+v) = %s, %v; want %s", tc.rec, got, err, tc.want)
		}
	}
	for _, bad := range []any{own{V: 0}, own{V: 3}, "a string", []int{1}} {
		if got, err := record.Marshal(kind, bad); err == nil {
			t.Errorf("Marshal(%#v) = %s; want an error", bad, got)
		}
	}
}

func TestUnmarshalAppliesTheVersionRule(t *testing.T) {
	for _, tc := range []struct {
		data        string
		v           int
		newer, bad  bool
		name, words string
	}{
		{data: `{"v":1,"name":"a"}`, v: 1, name: "a"},
		{data: `{"v":2,"name":"a"}`, v: 2, name: "a"},
		{data: `{"name":"a","v":2}`, v: 2, name: "a"}, // the version need not come first
		{data: `{"v":3,"name":"a"}`, newer: true, words: "format version 3, and this build reads versions up to 2; upgrade agentkit"},
		{data: `{"name":"a"}`, bad: true, words: `has no format version ("v")`},
		{data: `{"v":0}`, bad: true, words: "versions start at 1"},
		{data: `not json`, bad: true, words: "is not a JSON object"},
		{data: `{"v":1,"name":5}`, bad: true, words: "does not decode"},
	} {
		var p plain
		v, err := record.Unmarshal(kind, "agentkit/v1/a/x", []byte(tc.data), &p)
		switch {
		case tc.newer || tc.bad:
			if !errors.Is(err, record.ErrUnreadable) || errors.Is(err, record.ErrNewerFormat) != tc.newer ||
				errors.Is(err, record.ErrBadRecord) != tc.bad || !strings.Contains(err.Error(), tc.words) ||
				!strings.Contains(err.Error(), "test record") || !strings.Contains(err.Error(), "agentkit/v1/a/x") {
				t.Errorf("Unmarshal(%s) = %v; want newer %v, bad %v, saying %q and naming the kind and where", tc.data, err, tc.newer, tc.bad, tc.words)
			}
		case err != nil || v != tc.v || p.Name != tc.name:
			t.Errorf("Unmarshal(%s) = %d, %+v, %v; want %d, %q", tc.data, v, p, err, tc.v, tc.name)
		}
	}
}

func TestCheckIsTheSameRule(t *testing.T) {
	if err := record.Check(kind, "f", 2); err != nil {
		t.Errorf("Check(2) = %v", err)
	}
	if err := record.Check(kind, "f", 3); !errors.Is(err, record.ErrNewerFormat) {
		t.Errorf("Check(3) = %v; want ErrNewerFormat", err)
	}
	if err := record.Check(kind, "f", 0); !errors.Is(err, record.ErrBadRecord) {
		t.Errorf("Check(0) = %v; want ErrBadRecord", err)
	}
}

// A token in a key never reaches an error.
func TestErrorsRedactTokens(t *testing.T) {
	const token = "c2VjcmV0LXRva2VuLXRoYXQtbXVzdC1ub3QtbGVhaw"
	_, err := record.Unmarshal(kind, "agentkit/v1/a/continuations/"+token, []byte(`{}`), &plain{})
	if err == nil || strings.Contains(err.Error(), token) {
		t.Errorf("error %v shows the token", err)
	}
}

func ExampleUnmarshal() {
	k := record.NewKind("greeting", 1)
	data, _ := record.Marshal(k, struct {
		Text string `json:"text"`
	}{"hello"})
	fmt.Println(string(data))
	var g struct {
		Text string `json:"text"`
	}
	v, err := record.Unmarshal(k, "greetings/1", data, &g)
	fmt.Println(v, g.Text, err)
	_, err = record.Unmarshal(k, "greetings/2", []byte(`{"v":2,"text":"hi"}`), &g)
	fmt.Println(errors.Is(err, record.ErrNewerFormat))
	// Output:
	// {"v":1,"text":"hello"}
	// 1 hello <nil>
	// true
}
