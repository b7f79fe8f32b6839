package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"agentkit/abtest"
	"agentkit/model"
)

// EvalChannel is the channel of eval sessions (package evals). They are
// never enrolled in an A/B experiment.
const EvalChannel = "eval"

// abFlushTimeout bounds the last A/B snapshot flush of Close.
const abFlushTimeout = 10 * time.Second

// openExperiments validates the agent's experiments and starts the A/B
// recorder and its flush loop.
func (r *Runtime) openExperiments() error {
	as, err := r.binding.Agent(r.agent.Name)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	r.ab, err = abtest.NewRecorder(as.ABs(), abtest.RecorderOptions{
		HostID:      r.HostID(),
		Experiments: r.agent.Experiments,
		Logger:      r.log,
		Now:         r.now,
	})
	if err != nil {
		return fmt.Errorf("agent: Agent.Experiments: %w", err)
	}
	if len(r.agent.Experiments) == 0 {
		return nil
	}
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		r.ab.Run(r.bg, r.cfg.ABFlushInterval)
	}()
	return nil
}

// closeExperiments writes this host's last A/B state into the snapshot,
// once no turn runs any more.
func (r *Runtime) closeExperiments() {
	if r.ab == nil || len(r.agent.Experiments) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), abFlushTimeout)
	defer cancel()
	if err := r.ab.Flush(ctx); err != nil {
		r.log.Warn("agent: the last A/B snapshot flush failed; the samples are stored and other hosts' flushes keep their figures", "error", err)
	}
}

// HostID names this host: in reminder claims, eval runs and the A/B
// snapshot's host marks. It is Config.Reminders.HostID, or the host name
// and a random suffix chosen at Open.
func (r *Runtime) HostID() string { return r.reminders.s.HostID() }

// Experiments returns the agent's A/B experiments.
func (r *Runtime) Experiments() []abtest.Experiment { return r.ab.Experiments() }

// ABReport returns the A/B figures: the stored snapshot (every host's
// flushed state) merged with this host's latest state.
func (r *Runtime) ABReport(ctx context.Context) abtest.Report { return r.ab.Report(ctx) }

// FlushABs writes this host's A/B state into the stored snapshot now,
// instead of at the next flush interval.
func (r *Runtime) FlushABs(ctx context.Context) error { return r.ab.Flush(ctx) }

// enroll picks a session's variant in every experiment; eval sessions get
// none.
func (r *Runtime) enroll(sessionID, channelID string) map[string]string {
	if channelID == EvalChannel || len(r.agent.Experiments) == 0 {
		return nil
	}
	out := make(map[string]string, len(r.agent.Experiments))
	for _, e := range r.agent.Experiments {
		out[e.Name] = e.Variants[e.Assign(sessionID)].Name
	}
	return out
}

// variantSetup is how a session's turns run given its enrolment.
type variantSetup struct {
	enrolled     map[string]string // experiment → variant, from the first event
	instructions string
	model        model.Model
	options      map[string]any
}

// setupFor returns the agent as the session's variants change it. The
// enrolment is enrolled for a session's first turn, and otherwise read from
// the session's first event, the source of truth.
func (r *Runtime) setupFor(ctx context.Context, sessionID string, firstTurn bool, enrolled map[string]string) (variantSetup, error) {
	vs := variantSetup{instructions: r.agent.Instructions, model: r.agent.Model}
	if len(r.agent.Experiments) == 0 {
		return vs, nil
	}
	if !firstTurn {
		recs, err := r.db.After(ctx, sessionID, 0, 1)
		if err != nil {
			return vs, err
		}
		if len(recs) == 1 {
			ev, err := decodeEvent(recs[0])
			if err != nil {
				return vs, err
			}
			enrolled = ev.Experiments
		}
	}
	vs.enrolled = enrolled
	for _, e := range r.agent.Experiments {
		v, ok := e.Variant(enrolled[e.Name])
		if !ok {
			continue // not enrolled, or the variant is no longer defined
		}
		if v.Instructions != "" {
			vs.instructions = v.Instructions
		}
		if v.Model != nil {
			vs.model = v.Model
		}
		if len(v.Options) > 0 {
			if vs.options == nil {
				vs.options = map[string]any{}
			}
			maps.Copy(vs.options, v.Options)
		}
	}
	return vs, nil
}

// recordABs stores one sample per experiment the session is enrolled in
// after a completed or failed turn: the session's metrics so far, extended
// from this host's copy, or rebuilt from the session's events when the host
// has none (after a restart, or a session that ran on another host).
func (r *Runtime) recordABs(ctx context.Context, vs variantSetup, sessionID string, number int64, t abtest.Turn) {
	for _, e := range r.agent.Experiments {
		variant, ok := vs.enrolled[e.Name]
		if !ok {
			continue
		}
		m, ok := r.ab.Metrics(e.Name, sessionID)
		switch {
		case number == 1:
			m = abtest.SessionMetrics{Variant: variant}.AddTurn(t)
		case ok && m.Turns == number-1 && m.Variant == variant:
			m = m.AddTurn(t)
		default:
			var err error
			if m, err = r.sessionMetrics(ctx, sessionID, variant); err != nil {
				r.logger(sessionID).Warn("agent: reading the session's turns for its A/B sample failed; the sample is skipped", "experiment", e.Name, "error", err)
				continue
			}
		}
		r.ab.Record(ctx, e.Name, sessionID, m)
	}
}

// sessionMetrics rebuilds a session's A/B metrics from its turn.finished
// events.
func (r *Runtime) sessionMetrics(ctx context.Context, sessionID, variant string) (abtest.SessionMetrics, error) {
	m := abtest.SessionMetrics{Variant: variant}
	var after int64
	for {
		recs, err := r.db.After(ctx, sessionID, after, MaxPageSize)
		if err != nil {
			return m, err
		}
		for _, rec := range recs {
			after = rec.Seq
			if rec.Type != EventTurnFinished {
				continue
			}
			ev, err := decodeEvent(rec)
			if err != nil {
				return m, err
			}
			m = m.AddTurn(turnOf(ev.Status, ev.Usage, time.Duration(ev.DurationMS)*time.Millisecond, ev.At))
		}
		if len(recs) < MaxPageSize {
			return m, nil
		}
	}
}

// turnOf describes a finished turn to the A/B recorder.
func turnOf(status TurnStatus, usage *model.Usage, d time.Duration, at time.Time) abtest.Turn {
	t := abtest.Turn{Failed: status == StatusFailed, Latency: d, At: at}
	if usage != nil {
		t.InputTokens, t.OutputTokens = usage.InputTokens, usage.OutputTokens
	}
	return t
}

// temporary reports whether a model error may pass by itself: a rate
// limit or a server error (model.APIError.Temporary).
func temporary(err error) bool {
	var t interface{ Temporary() bool }
	return err != nil && errors.As(err, &t) && t.Temporary()
}
