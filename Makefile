# make test runs every check and test (scripts/test.sh); make run runs one
# turn of the example agent on the embedded default store.
.PHONY: test check build run

test check:
	bash scripts/test.sh

build:
	go build -o bin/agentkit ./cmd/agentkit
