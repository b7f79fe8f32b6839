#!/usr/bin/env bash
# Runs agentkit's benchmarks and keeps their raw output and summaries in a
# folder, so a figure in docs/benchmarks.md can be reproduced and compared.
#
#   scripts/bench.sh turn              # every turn-path figure (below), ~25 min
#   scripts/bench.sh floor length      # some of them
#   scripts/bench.sh drivers           # every kv driver against its raw client
#
# Targets of the turn path (docs/benchmarks.md, "The turn path"):
#   floor    bench/turn BenchmarkFloor: single event append vs the fsync floor
#   length   bench/turn BenchmarkSessionLength: a turn on 100,002 vs 1,002 events
#   restore  bench/turn BenchmarkRestore: restore of 1,000 sessions vs raw reads
#   turnalone bench/turn BenchmarkTurn and BenchmarkConcurrentTurns: agentkit's
#            turn alone (store writes per turn), and 16 at once in process
#   adk      bench/adk: append, turn and load against ADK, paired, and the
#            least a turn of each can cost on PostgreSQL (BenchmarkTurnFloor)
#   fsyncs   fsyncs per append and per turn, by file, counted with strace
#   load     bench/load: agentkit serve at 1 and 16 clients
#   profile  CPU profiles of the turn (go test -cpuprofile, go tool pprof -top)
#            and where 16 concurrent turns wait (-blockprofile)
#   turn     all of the above
#   drivers  every kv driver paired with its raw client inside one loop
#            (kvtest.RunPaired: driver-ns/op, raw-ns/op, driver/raw), with the
#            NATS listing floor and the Redis listing's CPU; starts the local
#            servers as the tests do (scripts/services.sh, s3server.sh)
#
# Environment:
#   OUT    the folder for the results (default /tmp/agentkit-bench-DATE-TIME)
#   COUNT  runs of each benchmark, for the medians (default 6)
#   LOAD_DURATION  per level and round of the load target (default 20s)
# PostgreSQL is AGENTKIT_TEST_POSTGRES or the local default, as for the
# tests. Each benchmark's raw output FILE.txt is summarized by benchstat
# (pinned) into FILE.stat and by bench/medians into FILE.med (median, min
# and max of every metric); the paired benchmarks report each side's time
# (adk-ns/op, agentkit-ns/op, ...) and their ratio (adk/agentkit,
# agentkit/fsync, ...) as metrics of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCHSTAT_VERSION=v0.0.0-20260908200009-22c9c6c9d4da
COUNT=${COUNT:-6}
OUT=${OUT:-/tmp/agentkit-bench-$(date +%Y%m%d-%H%M%S)}
LOAD_DURATION=${LOAD_DURATION:-20s}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

step() { printf '\n== %s\n' "$*" >&2; }

# summary FILE.txt: benchstat's tables (FILE.stat) and, one line per
# benchmark and metric, the median, minimum and maximum (FILE.med).
summary() {
  go run "golang.org/x/perf/cmd/benchstat@$BENCHSTAT_VERSION" "$1" > "${1%.txt}.stat"
  go run ./bench/medians "$1" > "${1%.txt}.med"
  cat "${1%.txt}.med"
}

# The test binaries, built once per run.
turn_test() {
  [ -x "$OUT/turn.test" ] || go test -c -o "$OUT/turn.test" ./bench/turn/
}
adk_test() {
  [ -x "$OUT/adk.test" ] || (cd bench/adk && go test -c -o "$OUT/adk.test" .)
}

# conditions records the machine and its load next to the figures.
conditions() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "go: $(go version)"
    echo "cpus: $(nproc)"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "disk of /tmp: $(df -h /tmp | awk 'NR==2 {print $1, $2}') $(findmnt -no FSTYPE,OPTIONS -T /tmp 2>/dev/null || true)"
  } >> "$OUT/conditions.txt"
}

run_floor() {
  step "floor: single event append vs the disk's fsync floor"
  turn_test
  "$OUT/turn.test" -test.run '^$' -test.bench '^BenchmarkFloor$' -test.benchtime 2000x \
    -test.count "$COUNT" | tee "$OUT/floor.txt"
  summary "$OUT/floor.txt"
}

run_length() {
  step "length: a full turn on a 100,002-event session vs a 1,002-event one"
  turn_test
  "$OUT/turn.test" -test.run '^$' -test.bench '^BenchmarkSessionLength$' -test.benchtime 20x \
    -test.count "$COUNT" -test.timeout 60m | tee "$OUT/length.txt"
  summary "$OUT/length.txt"
}

run_restore() {
  step "restore: 1,000 sessions vs raw reads of the keys restore needs"
  turn_test
  "$OUT/turn.test" -test.run '^$' -test.bench '^BenchmarkRestore$' -test.benchtime 5x \
    -test.count "$COUNT" -test.timeout 60m | tee "$OUT/restore.txt"
  summary "$OUT/restore.txt"
}

run_turnalone() {
  step "turnalone: agentkit's turn alone, and 16 at once in process"
  turn_test
  "$OUT/turn.test" -test.run '^$' -test.bench '^Benchmark(Turn|ConcurrentTurns)$' -test.benchtime 1000x \
    -test.count "$COUNT" | tee "$OUT/turnalone.txt"
  summary "$OUT/turnalone.txt"
}

run_adk() {
  step "adk: agentkit vs ADK, paired"
  adk_test
  (cd "$OUT" && ./adk.test -test.run '^$' -test.bench '^Benchmark(Append|Turn|TurnFloor)$' -test.benchtime 500x \
    -test.count "$COUNT" -test.timeout 60m) | tee "$OUT/adk.txt"
  (cd "$OUT" && ./adk.test -test.run '^$' -test.bench '^BenchmarkLoadLast20$' \
    -test.count "$COUNT" -test.timeout 60m) | tee "$OUT/adk-load.txt"
  summary "$OUT/adk.txt"
  summary "$OUT/adk-load.txt"
}

# fsyncs_of BINARY BENCH: runs one benchmark under strace at two
# iteration counts and prints, per call and file, the fsyncs per op: the
# difference between the runs divided by the difference of iterations,
# so set-up fsyncs cancel out. Files are named from the benchmark's
# temporary folder down (adk/..., agentkit/state/sessions/..., ...).
fsyncs_of() {
  local bin=$1 bench=$2 n1=64 n2=320 n
  local tag
  tag=$(printf '%s' "$bench" | tr -c 'A-Za-z0-9=' '_')
  for n in $n1 $n2; do
    strace -f -y -qq -e trace=fsync,fdatasync -e signal=none -o "$OUT/strace-$tag.$n" \
      "$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "${n}x" -test.count 1 > /dev/null
  done
  echo "-- $bench: fsyncs per op (over $((n2 - n1)) ops)"
  awk -v n1="$n1" -v n2="$n2" '
    {
      if (!match($0, /(fsync|fdatasync)\([0-9]+<[^>]*>/)) next
      s = substr($0, RSTART, RLENGTH)
      call = s; sub(/\(.*/, "", call)
      path = s; sub(/^[^<]*</, "", path); sub(/>$/, "", path)
      sub(/^\/tmp\/[^\/]+\/[0-9]+(\/|$)/, "", path)  # the benchmark'"'"'s TempDir
      if (path == "") path = "(the folder)"
      key = call " " path
      if (FILENAME ~ ("\\." n1 "$")) a[key]++; else b[key]++
      keys[key] = 1
    }
    END {
      for (k in keys) {
        d = (b[k] - a[k]) / (n2 - n1)
        if (d >= 0.005) {
          printf "  %6.2f  %s\n", d, k
          side = k; sub(/^[a-z]+ /, "", side); sub(/\/.*/, "", side)
          total[side] += d
        }
      }
      for (s in total) printf "  %6.2f  total: %s\n", total[s], s
    }' "$OUT/strace-$tag.$n1" "$OUT/strace-$tag.$n2" | sort -k2
}

run_fsyncs() {
  step "fsyncs: per append and per turn, by file (strace)"
  command -v strace > /dev/null || { echo "bench: strace is not installed (apt-get install strace)" >&2; return 1; }
  adk_test
  turn_test
  {
    for b in '^BenchmarkAppend$/^db=sqlite/adk=wal$' '^BenchmarkAppend$/^db=sqlite/adk=default$' \
      '^BenchmarkTurn$/^db=sqlite/adk=wal$' '^BenchmarkTurn$/^db=sqlite/adk=default$' '^BenchmarkTurn$/^db=postgres$'; do
      fsyncs_of "$OUT/adk.test" "$b"
    done
    fsyncs_of "$OUT/turn.test" '^BenchmarkFloor$'
    fsyncs_of "$OUT/turn.test" '^BenchmarkTurn/store=sqlite$'
    fsyncs_of "$OUT/turn.test" '^BenchmarkTurn/store=postgres$'
    fsyncs_of "$OUT/turn.test" '^BenchmarkConcurrentTurns$'
  } | tee "$OUT/fsyncs.txt"
}

run_load() {
  step "load: agentkit serve, 1 and 16 clients, alternated"
  go build -o "$OUT/agentkit" ./cmd/agentkit
  go run ./bench/load -bin "$OUT/agentkit" -clients 1,16 -duration "$LOAD_DURATION" -rounds 2 | tee "$OUT/load.txt"
}

run_drivers() {
  step "drivers: each against its raw client, paired"
  scripts/services.sh
  eval "$(scripts/s3server.sh versitygw start)"
  local entry pkg bench file
  for entry in "pgkv Postgres" "rediskv Redis" "natskv NATS" "s3kv S3" \
    "sqlitekv SQLite/full/Paired" "filekv File/PairedPutVsRaw"; do
    read -r pkg bench <<<"$entry"
    file=$OUT/drivers-${bench//\//-}.txt
    step "drivers: $pkg $bench"
    go test -run '^$' -bench "$bench" -count "$COUNT" -timeout 90m "./kv/$pkg/" > "$file"
    summary "$file"
  done
}

run_profile() {
  step "profile: where a turn's CPU time goes"
  turn_test
  (cd "$OUT" && ./turn.test -test.run '^$' -test.bench '^BenchmarkTurn/store=sqlite$' -test.benchtime 3000x \
    -test.cpuprofile turn.cpu > /dev/null)
  go tool pprof -top -nodecount 40 "$OUT/turn.test" "$OUT/turn.cpu" > "$OUT/turn-pprof-flat.txt"
  go tool pprof -top -cum -nodecount 60 "$OUT/turn.test" "$OUT/turn.cpu" > "$OUT/turn-pprof-cum.txt"
  (cd "$OUT" && ./turn.test -test.run '^$' -test.bench '^BenchmarkSessionLength$' -test.benchtime 10x \
    -test.cpuprofile length.cpu > /dev/null)
  go tool pprof -top -cum -nodecount 40 "$OUT/turn.test" "$OUT/length.cpu" > "$OUT/length-pprof-cum.txt"
  (cd "$OUT" && ./turn.test -test.run '^$' -test.bench '^BenchmarkConcurrentTurns$' -test.benchtime 1000x \
    -test.blockprofile concurrent.block -test.blockprofilerate 1 > /dev/null)
  go tool pprof -top -cum -nodecount 60 "$OUT/turn.test" "$OUT/concurrent.block" > "$OUT/concurrent-block-cum.txt"
  head -60 "$OUT/turn-pprof-cum.txt"
}

[ $# -gt 0 ] || { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
conditions
for target in "$@"; do
  case "$target" in
    floor | length | restore | turnalone | adk | fsyncs | load | profile | drivers) "run_$target" ;;
    turn)
      for t in floor length restore turnalone adk fsyncs load profile; do "run_$t"; done
      ;;
    *)
      echo "bench: unknown target $target; see scripts/bench.sh's header" >&2
      exit 2
      ;;
  esac
done
conditions
echo "bench: results in $OUT" >&2
