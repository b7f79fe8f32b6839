// Package agent is agentkit's runtime: agents defined in Go, the turn loop
// that runs them, and the sessions, continuation tokens, reminders, session
// actors, host KV and host files that outlive a process.
//
// Define an agent and open a runtime on a state root:
//
//	echo, _ := model.NewEcho(nil) // or model.NewOpenAI(...)
//	rt, err := agent.Open(ctx, agent.Config{
//		Agent: agent.Agent{
//			Name:         "support",
//			Instructions: "You answer questions about orders.",
//			Model:        echo,
//			Tools:        []tool.Tool{lookupOrder},
//		},
//		StateRoot: ".agentkit",
//	})
//	defer rt.Close()
//	res, err := rt.StartSession(ctx, agent.StartRequest{Message: "hello"})
//	// later, in the same or another process on the same store:
//	res, err = rt.Continue(ctx, agent.ContinueRequest{
//		Token: res.ContinuationToken, Message: "and then?"})
//
// Sessions are served from local disk (the state root's sessions/ folder)
// and committed to the configured store after every turn, through the
// session head of package storage: before a turn the runtime takes the
// turns other hosts committed, a turn that loses the head to another host
// is kept locally as a fork, and writes the store refused are retried until
// they land (mirror.go). At start-up the runtime restores recent sessions
// from the store within the policy's caps (restore.go). docs/runtime.md
// describes how a turn runs, how sessions persist, and the policy knobs.
//
// Every session is an actor (package actor) of class SessionClass: a JSON
// object state that tools change through tool.Env.Actor and programs
// through SessionActor, scheduled tasks, and messages and events that are
// views of the session's events. Runtime.Actors is the host of those
// actors and of classes of the agent's own (Agent.DefineActors); their
// databases are created by a first write and stay on this host
// (actors.go).
//
// The HTTP server (package server) and the agentkit command run agents
// through this package only: a config-defined agent (package config) and a
// Go-defined one take the same path.
package agent
