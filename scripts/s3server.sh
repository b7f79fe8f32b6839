#!/usr/bin/env bash
# s3server.sh: local S3-compatible servers for the s3kv driver's tests,
# built from source into the tool cache and started on 127.0.0.1 with a
# throw-away data folder and fixed test credentials.
#
#   scripts/s3server.sh SERVER install   build SERVER into the tool cache if missing
#   scripts/s3server.sh SERVER start     install if needed, start it, print export lines
#   scripts/s3server.sh SERVER env       print the export lines of the running server
#   scripts/s3server.sh SERVER status    exit 0 when the server runs, 1 when not
#   scripts/s3server.sh SERVER stop      stop the server and remove its data
#
# SERVER is one of:
#   versitygw  versitygw v1.8.0 with its posix backend; sets AGENTKIT_TEST_S3
#   minio      MinIO (pinned commit) on one drive; sets AGENTKIT_TEST_S3_MINIO
#
# start prints, and writes to $STATE/env, a line such as
#   export AGENTKIT_TEST_S3='s3://KEY:SECRET@agentkit-test/?endpoint=http://127.0.0.1:PORT&region=us-east-1'
# so `eval "$(scripts/s3server.sh minio start)"` prepares a shell for
# `go test ./kv/s3kv/`. The credentials are fixed test values, valid only
# for these throw-away servers; they reach the server through its
# environment, never its command line.
#
# Environment:
#   AGENTKIT_TOOLS   tool cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/agentkit-tools)
#   AGENTKIT_VGW_PORT, AGENTKIT_MINIO_PORT
#                    port to listen on (default 7070 and 7080; the next free
#                    port above it if taken)
#   AGENTKIT_VGW_STATE, AGENTKIT_MINIO_STATE
#                    folder for the PID, log, env file and data (default
#                    ${TMPDIR:-/tmp}/agentkit-versitygw and …/agentkit-minio)
set -euo pipefail

CACHE=${AGENTKIT_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/agentkit-tools}
ACCESS=agentkit-test-access
SECRET=agentkit-test-secret-not-for-production
BUCKET=agentkit-test

die() { echo "s3server.sh: $*" >&2; exit 1; }

SERVER=${1:-}
case $SERVER in
versitygw)
	# The version is a release tag.
	VERSION=v1.8.0
	MODULE=github.com/versity/versitygw/cmd/versitygw
	BIN=$CACHE/versitygw-$VERSION/versitygw
	STATE=${AGENTKIT_VGW_STATE:-${TMPDIR:-/tmp}/agentkit-versitygw}
	PORT=${AGENTKIT_VGW_PORT:-7070}
	VAR=AGENTKIT_TEST_S3
	PIDVAR=AGENTKIT_VGW_PID
	HEALTH=/
	CURLFLAGS= # any answer will do: / wants credentials
	;;
minio)
	# MinIO publishes no module versions (its tags are RELEASE.* dates), so
	# the pin is the pseudo-version of a commit (2026-02-12).
	VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
	MODULE=github.com/minio/minio
	BIN=$CACHE/minio-$VERSION/minio
	STATE=${AGENTKIT_MINIO_STATE:-${TMPDIR:-/tmp}/agentkit-minio}
	PORT=${AGENTKIT_MINIO_PORT:-7080}
	VAR=AGENTKIT_TEST_S3_MINIO
	PIDVAR=AGENTKIT_MINIO_PID
	HEALTH=/minio/health/live
	CURLFLAGS=-f # 200 once the drive is ready
	;;
*) die "usage: $0 versitygw|minio install|start|env|status|stop" ;;
esac

install() {
	if [[ -x $BIN ]]; then
		return
	fi
	command -v go >/dev/null || die "go is not on PATH; it is needed to build $SERVER $VERSION"
	echo "s3server.sh: building $SERVER $VERSION into ${BIN%/*} (a few minutes the first time)" >&2
	mkdir -p "${BIN%/*}"
	GOBIN=${BIN%/*} go install "$MODULE@$VERSION" >&2 ||
		die "go install $MODULE@$VERSION failed"
}

# answers PORT: true when something accepts TCP connections on the port.
answers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

running() {
	[[ -f $STATE/pid ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null
}

print_env() {
	[[ -f $STATE/env ]] || die "no $SERVER server is running (no $STATE/env); run: $0 $SERVER start"
	cat "$STATE/env"
}

# free_port FROM: the first port from FROM up that nothing answers on.
free_port() {
	local port=$1 tries=0
	while answers "$port"; do
		port=$((port + 1))
		tries=$((tries + 1))
		((tries < 100)) || die "no free port from $1 to $port"
	done
	echo "$port"
}

launch() { # port
	local port=$1
	case $SERVER in
	versitygw)
		ROOT_ACCESS_KEY_ID=$ACCESS ROOT_SECRET_ACCESS_KEY=$SECRET \
			nohup "$BIN" --port "127.0.0.1:$port" --keep-alive --quiet posix "$STATE/data" \
			>"$STATE/log" 2>&1 </dev/null &
		;;
	minio)
		local console
		console=$(free_port $((port + 1000)))
		MINIO_ROOT_USER=$ACCESS MINIO_ROOT_PASSWORD=$SECRET MINIO_BROWSER=off \
			MINIO_UPDATE=off MINIO_CI_CD=1 \
			nohup "$BIN" server --quiet --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" "$STATE/data" \
			>"$STATE/log" 2>&1 </dev/null &
		;;
	esac
	echo $!
}

start() {
	if running; then
		print_env
		return
	fi
	install
	local port
	port=$(free_port "$PORT")
	rm -rf "$STATE"
	mkdir -p "$STATE/data"
	local pid
	pid=$(launch "$port")
	echo "$pid" >"$STATE/pid"
	local i
	for ((i = 0; i < 300; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -20 "$STATE/log" >&2 || true
			die "$SERVER exited at start-up; its log is $STATE/log"
		fi
		if curl -s $CURLFLAGS -o /dev/null "http://127.0.0.1:$port$HEALTH"; then
			break
		fi
		sleep 0.1
	done
	((i < 300)) || die "$SERVER did not answer on 127.0.0.1:$port within 30 seconds; its log is $STATE/log"
	cat >"$STATE/env" <<EOT
export $VAR='s3://$ACCESS:$SECRET@$BUCKET/?endpoint=http://127.0.0.1:$port&region=us-east-1'
export $PIDVAR=$pid
EOT
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

case ${2:-} in
install) install ;;
start) start ;;
env) print_env ;;
status) running ;;
stop) stop ;;
*) die "usage: $0 $SERVER install|start|env|status|stop" ;;
esac
