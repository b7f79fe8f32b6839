// Package actorbench compares the actor package's SetState with
// github.com/evanphx/json-patch/v5's MergePatch followed by the same
// durable SQLite write. It is a module of its own so the agentkit module
// never depends on json-patch. Run it with go test -bench . in this folder;
// figures are recorded in docs/benchmarks.md.
package actorbench
