#!/usr/bin/env bash
# Runs every check and test of agentkit, setting up what it needs:
# gofmt, go vet, staticcheck (pinned), the local servers the driver tests
# use (PostgreSQL, Redis, NATS; two S3-compatible servers, versitygw and
# MinIO, pinned, built once into the tool cache and started by
# scripts/s3server.sh), Chromium for the browser tests (scripts/chromium.sh),
# then go test -race ./...
#
# Environment: CI=true makes a driver test fail instead of skip when its
# server is missing. GOFLAGS and TESTFLAGS pass through (TESTFLAGS goes to
# go test, e.g. TESTFLAGS='-run Conformance').
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2

step() { printf '\n== %s\n' "$*"; }

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bench/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change these files (run gofmt -w):"
  echo "$unformatted"
  exit 1
fi

step "go vet"
go vet ./...

step "staticcheck $STATICCHECK_VERSION"
go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...

step "services"
scripts/services.sh

step "Chromium (browser tests)"
scripts/chromium.sh || echo "chromium: not installed; the browser tests will fail under CI" >&2

step "S3-compatible servers (versitygw, MinIO)"
# Each run keeps its servers in a folder of its own (unless the caller names
# one with AGENTKIT_VGW_STATE / AGENTKIT_MINIO_STATE), so two runs on one
# machine never share, and never stop, each other's servers. Each server is
# stopped on exit only if this run started it.
run_state=$(mktemp -d "${TMPDIR:-/tmp}/agentkit-test-s3.XXXXXX")
export AGENTKIT_VGW_STATE=${AGENTKIT_VGW_STATE:-$run_state/versitygw}
export AGENTKIT_MINIO_STATE=${AGENTKIT_MINIO_STATE:-$run_state/minio}
stop_s3=()
for server in versitygw minio; do
	if ! scripts/s3server.sh "$server" status; then
		stop_s3+=("$server")
	fi
	eval "$(scripts/s3server.sh "$server" start)"
done
trap 'for s in "${stop_s3[@]}"; do scripts/s3server.sh "$s" stop >/dev/null 2>&1 || true; done; rm -rf "$run_state"' EXIT

step "go test -race"
# -count=1: never reuse cached results; the driver tests exercise live servers.
# The output is kept so the slowest packages can be listed at the end.
test_log="$run_state/go-test.log"
started=$SECONDS
status=0
go test -race -count=1 -timeout 25m ${TESTFLAGS:-} ./... 2>&1 | tee "$test_log" || status=$?

step "package times (slowest first; go test -race, wall seconds per package)"
# "ok  <pkg> 12.3s" and "FAIL <pkg> 12.3s" lines; packages without tests print none.
awk '($1 == "ok" || $1 == "FAIL") && $3 ~ /s$/ { t = $3; sub(/s$/, "", t); printf "%8.1fs  %-4s %s\n", t, $1, $2 }' "$test_log" | sort -rn
printf 'go test: %ds wall; the whole run: %ds\n' "$((SECONDS - started))" "$SECONDS"
exit "$status"
