package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"agentkit/abtest"
	"agentkit/agent"
	"agentkit/kv/memkv"
	"agentkit/model"
	"agentkit/tool"
)

// probe is a model that reports what a turn ran with: on a turn's first
// call it asks for the read_option tool, then it answers with the system
// prompt, the handler options in its context and the tool's result. A user
// message containing "fail" fails the call.
type probe struct{ name string }

func (p probe) Name() string { return p.name }

func (p probe) Generate(ctx context.Context, req model.Request) (model.Response, error) {
	last := req.Messages[len(req.Messages)-1]
	if strings.Contains(last.Content, "fail") && last.Role == model.RoleUser {
		return model.Response{}, fmt.Errorf("probe: asked to fail")
	}
	if last.Role == model.RoleUser {
		return model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "read_option", Arguments: json.RawMessage(`{}`)}}},
			Usage: model.Usage{InputTokens: 3, OutputTokens: 1}}, nil
	}
	sys := ""
	if req.Messages[0].Role == model.RoleSystem {
		sys = req.Messages[0].Content
	}
	return model.Response{Message: model.Message{Role: model.RoleAssistant,
		Content: fmt.Sprintf("model=%s sys=%q ctxopts=%v tool=%s", p.name, sys, abtest.Options(ctx), last.Content)},
		Usage: model.Usage{InputTokens: 5, OutputTokens: 2}}, nil
}

// readOption is a handler tool reading the variant's "style" option.
var readOption = tool.Tool{
	Spec: model.ToolSpec{Name: "read_option", Description: "reads the style option", Parameters: json.RawMessage(`{"type":"object"}`)},
	Run: func(ctx context.Context, env *tool.Env, args json.RawMessage) (string, error) {
		return fmt.Sprint(abtest.Options(ctx)["style"]), nil
	},
}

// dominant is an experiment whose second variant gets every session (the
// first one's weight is negligible).
func dominant(name string, v abtest.Variant) abtest.Experiment {
	v.Weight = 1
	return abtest.Experiment{Name: name, Variants: []abtest.Variant{{Name: "control", Weight: 1e-12}, v}}
}

func firstEvent(t *testing.T, rt *agent.Runtime, id string) agent.Event {
	t.Helper()
	page, err := rt.Events(context.Background(), id, 0, 1)
	if err != nil || len(page.Events) != 1 {
		t.Fatalf("events of %s: %v %v", id, page, err)
	}
	return page.Events[0]
}

func TestVariantsChangeInstructionsModelAndHandlerOptions(t *testing.T) {
	rt := open(t, agent.Config{Agent: agent.Agent{
		Name: "ab", Instructions: "Base instructions.", Model: probe{"base"}, Tools: []tool.Tool{readOption}, NoWorkspaceTools: true,
		Experiments: []abtest.Experiment{
			dominant("prompt", abtest.Variant{Name: "brief", Instructions: "Answer briefly."}),
			dominant("engine", abtest.Variant{Name: "other", Model: probe{"other"}}),
			dominant("handler", abtest.Variant{Name: "terse", Options: map[string]any{"style": "terse"}}),
		},
	}, Memory: agent.Memory{Off: true}})
	res := start(t, rt, "hello")
	want := `model=other sys="Answer briefly." ctxopts=map[style:terse] tool=terse`
	if res.Turn.Result != want {
		t.Errorf("the enrolled session's turn ran with %q, want %q", res.Turn.Result, want)
	}
	ev := firstEvent(t, rt, res.SessionID)
	if ev.Type != agent.EventTurnStarted || ev.Experiments["prompt"] != "brief" || ev.Experiments["engine"] != "other" || ev.Experiments["handler"] != "terse" {
		t.Errorf("first event %+v: it must record the enrolment", ev)
	}
	// The follow-up reads the enrolment back from the event log.
	res2, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: res.ContinuationToken, Message: "again"})
	if err != nil || res2.Turn.Result != want {
		t.Errorf("follow-up: %q %v, want %q", res2.Turn.Result, err, want)
	}
}

func TestEnrolmentIsDeterministicAndEvalSessionsAreNeverEnrolled(t *testing.T) {
	exp := abtest.Experiment{Name: "tone", Variants: []abtest.Variant{{Name: "plain"}, {Name: "friendly", Instructions: "Be warm."}}}
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "ab", Experiments: []abtest.Experiment{exp}}})
	ctx := context.Background()
	seen := map[string]int{}
	for range 12 {
		res := start(t, rt, "hi")
		got := firstEvent(t, rt, res.SessionID).Experiments["tone"]
		if want := exp.Variants[exp.Assign(res.SessionID)].Name; got != want {
			t.Errorf("session %s enrolled in %q, Assign says %q", res.SessionID, got, want)
		}
		seen[got]++
	}
	ev, err := rt.StartSession(ctx, agent.StartRequest{Message: "an eval case", ChannelID: agent.EvalChannel})
	if err != nil {
		t.Fatal(err)
	}
	if e := firstEvent(t, rt, ev.SessionID); e.Experiments != nil {
		t.Errorf("an eval session was enrolled: %v", e.Experiments)
	}
	total := 0
	for _, e := range rt.ABReport(ctx).Experiments {
		for _, v := range e.Variants {
			total += int(v.Sessions)
			if int(v.Sessions) != seen[v.Name] {
				t.Errorf("variant %s: %d sessions in the figures, %d enrolled", v.Name, v.Sessions, seen[v.Name])
			}
		}
	}
	if total != 12 {
		t.Errorf("the figures count %d sessions, want the 12 enrolled (the eval session is not one)", total)
	}
}

func TestAFollowUpAfterARestartKeepsTheRecordedVariant(t *testing.T) {
	root, store := t.TempDir(), memkv.New()
	exp := func(wb float64) []abtest.Experiment {
		return []abtest.Experiment{{Name: "tone", Variants: []abtest.Variant{{Name: "a", Instructions: "A."}, {Name: "b", Instructions: "B.", Weight: wb}}}}
	}
	cfg := agent.Config{Agent: agent.Agent{Name: "ab", Model: probe{"m"}, Tools: []tool.Tool{readOption}, NoWorkspaceTools: true, Experiments: exp(1)},
		StateRoot: root, Store: store, Memory: agent.Memory{Off: true}}
	rt, err := agent.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var inB agent.TurnResult
	for range 64 {
		res := start(t, rt, "hi")
		if strings.Contains(res.Turn.Result, `sys="B."`) {
			inB = res
			break
		}
	}
	rt.Close()
	if inB.SessionID == "" {
		t.Fatal("no session of 64 landed in variant b of a 1:1 experiment")
	}
	// The new weights would put nearly every session in a; the session's
	// event log says b.
	cfg.Agent.Experiments = exp(1e-12)
	rt = open(t, cfg)
	res, err := rt.Continue(context.Background(), agent.ContinueRequest{Token: inB.ContinuationToken, Message: "fail this turn"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = rt.Continue(context.Background(), agent.ContinueRequest{Token: inB.ContinuationToken, Message: "and again"})
	if err != nil || !strings.Contains(res.Turn.Result, `sys="B."`) {
		t.Fatalf("after the restart the session ran %q (%v), want variant b's instructions", res.Turn.Result, err)
	}
	var b abtest.VariantFigures
	for _, v := range rt.ABReport(context.Background()).Experiments[0].Variants {
		if v.Name == "b" {
			b = v
		}
	}
	// The restarted host had no metrics of the session: it rebuilt them
	// from the event log (turn 1 on the first runtime, turns 2-3 here).
	if b.Turns != 3 || b.FailedTurns != 1 || b.FailedSessions != 1 {
		t.Errorf("variant b: %+v; want the moved session's 3 turns, one failed", b)
	}
}

func TestATurnFailedByARateLimitIsRetryable(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":{"message":"Rate limit reached"}}`))
	}))
	defer srv.Close()
	m, err := model.NewOpenAI(model.OpenAIOptions{BaseURL: srv.URL + "/v1", Model: "x", MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	rt := open(t, agent.Config{Agent: agent.Agent{Name: "rl", Model: m}})
	res := start(t, rt, "hi")
	if res.Turn.Status != agent.StatusFailed || !res.Turn.Retryable {
		t.Errorf("a turn failed by HTTP 429: %+v, want failed and retryable", res.Turn)
	}
	scripted := open(t, agent.Config{Agent: agent.Agent{Name: "s", Model: echoModel(t, model.EchoStep{Error: "broken"})}})
	if res := start(t, scripted, "hi"); res.Turn.Status != agent.StatusFailed || res.Turn.Retryable {
		t.Errorf("a turn failed by a model error that does not pass by itself: %+v, want failed, not retryable", res.Turn)
	}
}
