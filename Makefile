# make test runs every check and test (scripts/test.sh); make build builds
# bin/agentkit.
.PHONY: test check build

test check:
	bash scripts/test.sh

build:
	go build -o bin/agentkit ./cmd/agentkit
