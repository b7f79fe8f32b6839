package adkbench

import (
	"fmt"
	"strings"
)

// textSize is the size of the text every benchmark event carries on both
// sides: a user message, a model answer or a turn's result.
const textSize = 200

// filler pads texts to textSize.
const filler = "The quick brown fox jumps over the lazy dog while the agent keeps its session durable. "

// text returns the deterministic textSize-byte text of event i.
func text(i int) string {
	s := fmt.Sprintf("event %09d: ", i)
	for len(s) < textSize {
		s += filler
	}
	return s[:textSize]
}

// texts returns text(from) through text(to), inclusive.
func texts(from, to int) []string {
	out := make([]string, 0, to-from+1)
	for i := from; i <= to; i++ {
		out = append(out, text(i))
	}
	return out
}

// echoPrefix is what agentkit's echo model puts before the user message in
// its answer; the ADK side's turn answers the same text.
const echoPrefix = "echo: "

// shorten abbreviates a text for error messages.
func shorten(s string) string {
	if len(s) > 24 {
		return strings.TrimSpace(s[:24]) + "..."
	}
	return s
}

// turnsPerSession is how many turns BenchmarkTurn runs in one session
// before starting the next, on both sides, so that the session each turn
// loads stays that of a short chat however many iterations run.
const turnsPerSession = 16
