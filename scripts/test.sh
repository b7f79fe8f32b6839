#!/usr/bin/env bash
# Runs every check and test of agentkit, setting up what it needs:
# gofmt, go vet, staticcheck (pinned), the local servers the driver tests
# use (PostgreSQL, Redis, NATS; an S3-compatible server, versitygw, pinned and
# installed by scripts/versitygw.sh), Chromium for the browser tests
# (scripts/chromium.sh), then go test -race ./...
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

step "S3-compatible server (versitygw)"
eval "$(scripts/versitygw.sh start)"
trap 'scripts/versitygw.sh stop >/dev/null 2>&1 || true' EXIT

step "go test -race"
# -count=1: never reuse cached results; the driver tests exercise live servers.
go test -race -count=1 -timeout 25m ${TESTFLAGS:-} ./...
