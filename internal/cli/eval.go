package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"agentkit/agent"
	"agentkit/evals"
)

func init() {
	register(command{name: "eval", summary: "run an eval batch (a JSONL cases file) and print a summary", run: runEval})
}

const evalUsage = `eval [--dir DIR] [--state-root DIR] [--storage URL] [--concurrency N] [--json] CASES.jsonl

Runs every case of CASES.jsonl (one JSON object per line: {"name", "input",
"expect": {"exact" | "contains" | "regexp"}}) as the first turn of a fresh
session on channel "eval", at most --concurrency at a time, and grades the
answers. The agent is DIR/agentkit.yaml; without --dir, the current folder's
agentkit.yaml, or when there is none the built-in agent. Without
--state-root the run uses a fresh temporary state root and its embedded
store (memory starts empty, no session is restored, nothing is kept); the
project's storage: setting is not used unless --storage names a store.
Shows a progress bar on a terminal (one line per case otherwise), then a
summary table; exit status 1 when a case failed or errored.`

// evalExit is a run where some case did not pass: exit status 1.
type evalExit struct{ msg string }

func (e *evalExit) Error() string { return e.msg }
func (e *evalExit) ExitCode() int { return 1 }

func runEval(e *env, args []string) error {
	var dir, stateRoot, storage, logLevel string
	var concurrency int
	var asJSON bool
	fs := newFlags(e, "eval", evalUsage)
	fs.StringVar(&dir, "dir", "", "the project folder, holding agentkit.yaml (default: the current folder if it has one, else the built-in agent)")
	fs.StringVar(&stateRoot, "state-root", "", "the state root to use and keep, so that agentkit serve or dev on it shows the run (default: a temporary one, removed afterwards)")
	fs.StringVar(&storage, "storage", "", "store URL for sessions and the run (default: the state root's embedded store, not the project's storage:)")
	fs.IntVar(&concurrency, "concurrency", evals.DefaultConcurrency, fmt.Sprintf("how many cases run at once, 1 to %d", evals.MaxConcurrency))
	fs.BoolVar(&asJSON, "json", false, "print the run's snapshot as JSON (the answer of GET /v1/evals/{runId}) instead of the table")
	fs.StringVar(&logLevel, "log-level", "warn", "log level on standard error: debug, info, warn or error")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usagef("eval needs a cases file; usage: agentkit eval [flags] CASES.jsonl (agentkit init writes one, cases.jsonl)")
	case len(pos) > 1:
		return usagef("eval takes one cases file, got %d arguments: %q", len(pos), pos)
	case concurrency < 1 || concurrency > evals.MaxConcurrency:
		return usagef("--concurrency %d: use 1 to %d", concurrency, evals.MaxConcurrency)
	}
	casesPath := pos[0]
	f, err := os.Open(casesPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return usagef("the cases file %s does not exist", casesPath)
		}
		return usagef("reading the cases file: %v", err)
	}
	cases, err := evals.ParseCases(f, casesPath)
	f.Close()
	if err != nil {
		return usagef("%v", strings.TrimPrefix(err.Error(), "evals: "))
	}
	log, err := newLogger(e.stderr, "text", logLevel)
	if err != nil {
		return err
	}
	p, err := findProject(dir)
	if err != nil {
		return err
	}
	if p.file != nil {
		// A fresh embedded store unless --storage names one: never the
		// project's production store by default.
		pf := *p.file
		pf.Storage = ""
		p = &project{file: &pf, dir: p.dir}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rc, closeStore, err := p.runtimeConfig(ctx, "", storage)
	if err != nil {
		return err
	}
	defer closeStore()
	ephemeral := stateRoot == ""
	if ephemeral {
		if stateRoot, err = os.MkdirTemp("", "agentkit-eval-"); err != nil {
			return err
		}
		defer os.RemoveAll(stateRoot)
	}
	rc.StateRoot = stateRoot
	rc.Logger = log
	rc.Policy.Restore.Off = true
	rt, err := agent.Open(ctx, rc)
	if err != nil {
		return err
	}
	defer rt.Close()
	var opts evals.Options
	if p.file != nil {
		opts.HistoryWindow = p.file.Evals.HistoryWindow
		opts.Heartbeat = p.file.Evals.Heartbeat
	}
	opts.Logger = log
	m, err := evals.ForRuntime(rt, opts)
	if err != nil {
		return err
	}
	if _, err := m.Recover(ctx); err != nil {
		log.Warn("listing the stored eval runs failed", "error", err)
	}

	out := e.stdout
	progressTo := out
	if asJSON {
		progressTo = nil
		if isTerminal(e.stderr) {
			progressTo = e.stderr
		}
	}
	pr := newProgress(progressTo, len(cases))
	run, err := m.Run(ctx, cases, evals.StartOptions{
		Name: filepath.Base(casesPath), Source: "cli", Concurrency: concurrency,
		OnProgress: pr.update,
	})
	if err != nil {
		return err
	}
	pr.done()
	if progressTo != nil && !asJSON {
		fmt.Fprintln(out)
	}
	if asJSON {
		b, _ := json.MarshalIndent(run, "", "  ")
		fmt.Fprintf(out, "%s\n", b)
	} else {
		printSummary(out, run)
	}
	if ephemeral && rc.Store == nil {
		fmt.Fprintln(e.stderr, "(the state root was temporary and is removed with the run; pass --state-root .agentkit to keep the run and see it in agentkit dev)")
	}
	if run.Failed() {
		c := run.Counts
		if run.Status != evals.StatusFinished {
			return &evalExit{fmt.Sprintf("the run ended %s after %d of %d cases: %s", run.Status, c.Done, c.Total, run.Error)}
		}
		return &evalExit{fmt.Sprintf("%d of %d cases did not pass (%d failed, %d errored)", c.Failed+c.Errored, c.Total, c.Failed, c.Errored)}
	}
	return nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress shows a run's progress: a bar redrawn in place on a terminal,
// one line per finished case otherwise, nothing when w is nil.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	shown map[string]bool // cases already printed (plain lines)
	drawn bool
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, tty: w != nil && isTerminal(w), total: total, shown: map[string]bool{}}
}

// barWidth is the bar's width in cells.
const barWidth = 30

func (p *progress) update(r evals.Run) {
	if p.w == nil {
		return
	}
	c := r.Counts
	if p.tty {
		filled := 0
		if c.Total > 0 {
			filled = c.Done * barWidth / c.Total
		}
		running := ""
		for _, k := range r.Cases {
			if k.Status == evals.CaseRunning {
				running = k.Name
				break
			}
		}
		fmt.Fprintf(p.w, "\r\x1b[2K[%s%s] %d/%d  passed %d  failed %d  errored %d  %s",
			strings.Repeat("#", filled), strings.Repeat("-", barWidth-filled), c.Done, c.Total, c.Passed, c.Failed, c.Errored, clipText(running, 40))
		p.drawn = true
		return
	}
	for _, k := range r.Cases {
		if p.shown[k.Name] || (k.Status != evals.CasePassed && k.Status != evals.CaseFailed && k.Status != evals.CaseErrored) {
			continue
		}
		p.shown[k.Name] = true
		line := fmt.Sprintf("[%d/%d] %-7s %s (%d ms)", len(p.shown), p.total, k.Status, k.Name, k.LatencyMs)
		if why := caseWhy(k); why != "" && k.Status != evals.CasePassed {
			line += ": " + clipText(why, 200)
		}
		fmt.Fprintln(p.w, line)
	}
}

// done ends the bar's line.
func (p *progress) done() {
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
	}
}

func caseWhy(k evals.CaseResult) string {
	if k.Error != "" {
		return k.Error
	}
	if k.Grade != nil {
		return k.Grade.Reason
	}
	return ""
}

func clipText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// printSummary writes the summary table of a run.
func printSummary(w io.Writer, r evals.Run) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tSTATUS\tLATENCY\tTOKENS\tDETAIL")
	for _, k := range r.Cases {
		lat, tok := "", ""
		if k.Status != evals.CasePending {
			lat = fmt.Sprintf("%d ms", k.LatencyMs)
			tok = fmt.Sprintf("%d+%d", k.Usage.InputTokens, k.Usage.OutputTokens)
		}
		detail := caseWhy(k)
		if k.Status == evals.CasePassed {
			detail = ""
		}
		if k.Attempts > 1 {
			detail = strings.TrimSpace(fmt.Sprintf("%d attempts. %s", k.Attempts, detail))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", clipText(k.Name, 40), k.Status, lat, tok, clipText(detail, 100))
	}
	tw.Flush()
	c := r.Counts
	took := ""
	if !r.FinishedAt.IsZero() {
		took = " in " + r.FinishedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "\n%d cases: %d passed, %d failed, %d errored (pass rate %.1f%%)%s\nrun %s (%s) · model %s\n",
		c.Total, c.Passed, c.Failed, c.Errored, 100*c.PassRate(), took, r.ID, r.Status, r.Model)
}
