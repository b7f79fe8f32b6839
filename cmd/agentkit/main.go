// Command agentkit serves agents with durable state, runs them once, and
// looks into their stores. Run "agentkit help" for the commands.
package main

import (
	"os"

	"agentkit/internal/cli"

	// The drivers the command can open by URL.
	_ "agentkit/kv/filekv"
	_ "agentkit/kv/hostedkv"
	_ "agentkit/kv/memkv"
	_ "agentkit/kv/natskv"
	_ "agentkit/kv/pgkv"
	_ "agentkit/kv/rediskv"
	_ "agentkit/kv/s3kv"
	_ "agentkit/kv/sqlitekv"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
