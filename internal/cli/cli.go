// Package cli implements the agentkit command: argument parsing, the
// commands, and their exit codes. cmd/agentkit is a thin main around Main so
// the commands can be tested in process and as a built binary.
//
// Exit status: 0 on success, 1 when the command ran and failed (a store
// error, a failed eval case), 2 for bad flags, arguments or configuration,
// with one line naming what is wrong and what is allowed.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
)

// Version is the agentkit version, set at build time with
// -ldflags "-X agentkit/internal/cli.Version=v1.2.3".
var Version = "dev"

// env is what a command runs with.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(e *env, args []string) error
}

// commands lists the subcommands in help order. Files of this package
// append to it from init functions.
var commands []command

func register(c command) {
	commands = append(commands, c)
	slices.SortStableFunc(commands, func(a, b command) int { return strings.Compare(a.name, b.name) })
}

// usageError is a mistake in how the command was called: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// Main runs the agentkit command with args (without the program name) and
// returns the exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printHelp(stdout)
		return 0
	}
	name := args[0]
	for _, c := range commands {
		if c.name == name {
			return exitCode(stderr, c.run(e, args[1:]))
		}
	}
	fmt.Fprintf(stderr, "agentkit: unknown command %q; the commands are %s\n", name, commandNames())
	return 2
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "agentkit: %v\n", err)
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}

func printHelp(w io.Writer) {
	fmt.Fprintf(w, "agentkit %s: durable state for AI agents\n\nUsage: agentkit COMMAND [flags] [args]\n\nCommands:\n", Version)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun \"agentkit COMMAND -h\" for a command's flags. Every flag can also be set\nwith an AGENTKIT_* environment variable: --state-root is AGENTKIT_STATE_ROOT.")
}

// newFlags returns a flag set that reports errors as usage errors instead of
// printing and exiting.
func newFlags(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "Usage: agentkit %s\n", usage)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n == 0 {
			return
		}
		fmt.Fprintf(e.stdout, "\nFlags (each also read from AGENTKIT_<NAME>):\n")
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args, flags and positional arguments in any order (a
// "--" ends the flags), then fills every flag not given on the command line
// from its AGENTKIT_* environment variable (--state-root reads
// AGENTKIT_STATE_ROOT). Mistakes become usage errors naming the flag. It
// returns the positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err // the flag package has printed the usage
			}
			return nil, usagef("%s: %v (run \"agentkit %s -h\" for the flags)", fs.Name(), err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return pos, fillFromEnv(fs)
}

// fillFromEnv sets every flag not given on the command line from its
// AGENTKIT_* variable.
func fillFromEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		envName := EnvName(f.Name)
		if v, ok := os.LookupEnv(envName); ok && v != "" {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = usagef("%s=%q: %v", envName, v, serr)
			}
		}
	})
	return err
}

// EnvName returns the environment variable that backs a flag:
// "state-root" is AGENTKIT_STATE_ROOT.
func EnvName(flagName string) string {
	return "AGENTKIT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// buildInfo describes the binary for "agentkit version".
func buildInfo() string {
	var b strings.Builder
	fmt.Fprintf(&b, "agentkit %s", Version)
	if info, ok := debug.ReadBuildInfo(); ok {
		fmt.Fprintf(&b, " (%s", info.GoVersion)
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				fmt.Fprintf(&b, ", commit %s", s.Value[:12])
			}
			if s.Key == "vcs.modified" && s.Value == "true" {
				b.WriteString(", modified")
			}
		}
		b.WriteString(")")
	}
	return b.String()
}

func init() {
	register(command{name: "version", summary: "print the version and build information", run: func(e *env, args []string) error {
		fs := newFlags(e, "version", "version")
		pos, err := parseFlags(fs, args)
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return usagef("version takes no arguments; got %q", pos[0])
		}
		fmt.Fprintln(e.stdout, buildInfo())
		return nil
	}})
}
