// Package abtest runs live A/B experiments on an agent and aggregates their
// figures across hosts (spec 08-evals-ab.md).
//
// An Experiment has two or more weighted variants; a variant may replace
// the agent's instructions or model, or set handler options that tools and
// hooks read with Options(ctx). The runtime (package agent) enrolls every
// new session, except eval sessions, in every experiment when it starts:
// Experiment.Assign picks the variant from a hash of the experiment name
// and the session id, so the choice is the same on every host, and the
// runtime writes it into the session's first event, which stays the source
// of truth for later turns, restores and other hosts.
//
// After every completed or failed turn of an enrolled session the runtime
// hands the session's cumulative SessionMetrics to a Recorder, which
// stores it as one sample (a blind append to the A/B table, never a
// rewrite of a growing record) and keeps it in memory. Samples carry every
// turn's latency in a LatencySketch, whose size does not grow with the
// turns and which merges by adding counts, so percentiles merged from any
// number of hosts are those of one sketch of every turn (exact under
// SketchExactBelow, within SketchRelativeError above), and a lost sample
// never merges two turns.
//
// Recorder.Flush merges the host's sessions into the stored snapshot with
// State.Join, which keeps each session's most recent metrics: joining is
// commutative and idempotent, so hosts never count a session twice and
// never erase each other's sessions, and a replacement host with no
// sessions of its own reports everyone's figures from the snapshot. Over
// a derived table on a store with compare-and-set the merge is a CAS loop;
// otherwise Flush reads the snapshot back and writes again until it holds
// the host's state.
//
// Old samples are compacted into the snapshot: a session's latest sample
// holds all of its earlier ones, so once the snapshot has it, the earlier
// samples of a derived table are deleted (RecorderOptions.KeepSamples keeps them).
// The snapshot itself keeps one entry per enrolled session.
//
// Figures are per variant: sessions, turns, the turn failure rate, mean
// tokens per turn, and p50 and p95 turn latency (nearest rank). Each
// variant is compared with the control (the first variant) on the share of
// sessions with a failed turn, with Newcombe's hybrid score interval at the
// 95% level, so a reader can tell noise from an effect.
package abtest
