module agentkit

go 1.26
