package adkbench

import (
	"context"
	"fmt"
	"iter"

	adkagent "google.golang.org/adk/v2/agent"
	"google.golang.org/adk/v2/agent/llmagent"
	adkmodel "google.golang.org/adk/v2/model"
	"google.golang.org/adk/v2/runner"
	"google.golang.org/adk/v2/session"
	"google.golang.org/genai"
)

// echoLLM is ADK's counterpart of agentkit's echo model: it answers
// echoPrefix and the last message's text, with no network.
type echoLLM struct{}

// Name names the model.
func (echoLLM) Name() string { return "echo" }

// GenerateContent answers one response: the echo of the request's last
// content.
func (echoLLM) GenerateContent(ctx context.Context, req *adkmodel.LLMRequest, _ bool) iter.Seq2[*adkmodel.LLMResponse, error] {
	return func(yield func(*adkmodel.LLMResponse, error) bool) {
		if len(req.Contents) == 0 || len(req.Contents[len(req.Contents)-1].Parts) == 0 {
			yield(nil, fmt.Errorf("echo: the request has no message"))
			return
		}
		last := req.Contents[len(req.Contents)-1].Parts[0].Text
		yield(&adkmodel.LLMResponse{
			Content:      genai.NewContentFromText(echoPrefix+last, genai.RoleModel),
			TurnComplete: true,
		}, nil)
	}
}

// adkRunner is ADK's full turn: its runner (google.golang.org/adk/v2/runner)
// running an LLM agent (llmagent) on the echo model over the store's
// session service. A turn (Runner.Run) gets the session with all its
// events, appends the user's message, calls the model with the
// conversation, and appends the model's answer: one Get and two
// AppendEvents of the session service.
type adkRunner struct {
	s *adkStore
	r *runner.Runner
}

// newADKRunner builds the runner over s.
func newADKRunner(s *adkStore) (*adkRunner, error) {
	a, err := llmagent.New(llmagent.Config{Name: adkBot, Model: echoLLM{}})
	if err != nil {
		return nil, fmt.Errorf("adk: building the agent: %w", err)
	}
	r, err := runner.New(runner.Config{AppName: adkApp, Agent: a, SessionService: s.svc})
	if err != nil {
		return nil, fmt.Errorf("adk: building the runner: %w", err)
	}
	return &adkRunner{s: s, r: r}, nil
}

// turn runs one turn with msg in session id and returns the answer's text.
func (a *adkRunner) turn(ctx context.Context, id, msg string) (string, error) {
	var answer string
	for ev, err := range a.r.Run(ctx, adkUser, id, genai.NewContentFromText(msg, genai.RoleUser), adkagent.RunConfig{}) {
		if err != nil {
			return "", fmt.Errorf("adk %s: a turn in session %s: %w", a.s.dialect, id, err)
		}
		if ev.Author == adkBot && ev.Content != nil && len(ev.Content.Parts) > 0 {
			answer = ev.Content.Parts[0].Text
		}
	}
	return answer, nil
}

// adkEventsOf returns the texts of a session's events, oldest first.
func adkEventsOf(sess session.Session) []string {
	var out []string
	for ev := range sess.Events().All() {
		if ev.Content != nil && len(ev.Content.Parts) > 0 {
			out = append(out, ev.Content.Parts[0].Text)
		}
	}
	return out
}
