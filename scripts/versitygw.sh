#!/usr/bin/env bash
# versitygw.sh: a local S3-compatible server (versitygw with its posix
# backend) for the s3kv driver's tests.
#
#   scripts/versitygw.sh install   build versitygw v1.8.0 into the tool cache if missing
#   scripts/versitygw.sh start     install if needed, start on 127.0.0.1, print export lines
#   scripts/versitygw.sh env       print the export lines of the running server
#   scripts/versitygw.sh stop      stop the server and remove its data
#
# start prints, and writes to $STATE/env:
#   export AGENTKIT_TEST_S3='s3://KEY:SECRET@agentkit-test/?endpoint=http://127.0.0.1:PORT&region=us-east-1'
# so `eval "$(scripts/versitygw.sh start)"` prepares a shell for
# `go test ./kv/s3kv/`. The credentials are fixed test values, valid only
# for this throw-away server.
#
# Environment:
#   AGENTKIT_TOOLS      tool cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/agentkit-tools)
#   AGENTKIT_VGW_PORT   port to listen on (default 7070; the next free port above it if taken)
#   AGENTKIT_VGW_STATE  folder for the PID, log, env file and data (default ${TMPDIR:-/tmp}/agentkit-versitygw)
set -euo pipefail

VERSION=v1.8.0
CACHE=${AGENTKIT_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/agentkit-tools}
BIN=$CACHE/versitygw-$VERSION/versitygw
STATE=${AGENTKIT_VGW_STATE:-${TMPDIR:-/tmp}/agentkit-versitygw}
PORT=${AGENTKIT_VGW_PORT:-7070}
ACCESS=agentkit-test-access
SECRET=agentkit-test-secret-not-for-production
BUCKET=agentkit-test

die() { echo "versitygw.sh: $*" >&2; exit 1; }

install() {
	if [[ -x $BIN ]]; then
		return
	fi
	command -v go >/dev/null || die "go is not on PATH; it is needed to build versitygw $VERSION"
	echo "versitygw.sh: building versitygw $VERSION into ${BIN%/*} (a few minutes the first time)" >&2
	mkdir -p "${BIN%/*}"
	GOBIN=${BIN%/*} go install "github.com/versity/versitygw/cmd/versitygw@$VERSION" >&2 ||
		die "go install github.com/versity/versitygw/cmd/versitygw@$VERSION failed"
}

# answers PORT: true when something accepts TCP connections on the port.
answers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

running() {
	[[ -f $STATE/pid ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null
}

print_env() {
	[[ -f $STATE/env ]] || die "no server is running (no $STATE/env); run: $0 start"
	cat "$STATE/env"
}

start() {
	if running; then
		print_env
		return
	fi
	install
	local port=$PORT tries=0
	while answers "$port"; do
		port=$((port + 1))
		tries=$((tries + 1))
		((tries < 100)) || die "no free port from $PORT to $port"
	done
	rm -rf "$STATE"
	mkdir -p "$STATE/data"
	# The credentials go through the environment, not the command line,
	# so they do not show in process listings.
	ROOT_ACCESS_KEY_ID=$ACCESS ROOT_SECRET_ACCESS_KEY=$SECRET \
		nohup "$BIN" --port "127.0.0.1:$port" --keep-alive --quiet posix "$STATE/data" \
		>"$STATE/log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$STATE/pid"
	local i
	for ((i = 0; i < 100; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -20 "$STATE/log" >&2 || true
			die "versitygw exited at start-up; its log is $STATE/log"
		fi
		if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
			break
		fi
		sleep 0.1
	done
	((i < 100)) || die "versitygw did not answer on 127.0.0.1:$port within 10 seconds; its log is $STATE/log"
	cat >"$STATE/env" <<EOF
export AGENTKIT_TEST_S3='s3://$ACCESS:$SECRET@$BUCKET/?endpoint=http://127.0.0.1:$port&region=us-east-1'
export AGENTKIT_VGW_PID=$pid
EOF
	print_env
}

stop() {
	if running; then
		local pid
		pid=$(cat "$STATE/pid")
		kill "$pid"
		local i
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			kill -9 "$pid" 2>/dev/null || true
		fi
	fi
	rm -rf "$STATE"
}

case ${1:-} in
install) install ;;
start) start ;;
env) print_env ;;
stop) stop ;;
*) die "usage: $0 install|start|env|stop" ;;
esac
