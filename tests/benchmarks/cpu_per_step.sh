#!/bin/bash
# The CPU time the server and attnbench spend per decode step in one closed-loop cell (issue 23's
# bound): runs the cell twice, at STEPS1 and STEPS2 steps per stream, each against a fresh server
# (--max_batch_size=64 --max_queue_delay=500us), and prints the server's utime+stime
# (/proc/PID/stat) and attnbench's (user+sys) per step of the difference, which leaves out the
# server's start, Configure and the first prefills; the re-prefills of the window stay in (one per
# stream every --steps_per_request steps).
#   usage: cpu_per_step.sh SERVER_BIN ATTNBENCH_BIN VARIANT CONCURRENCY STEPS1 STEPS2
set -euo pipefail
server_bin=$1 bench_bin=$2 variant=$3 concurrency=$4 steps1=$5 steps2=$6
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tick=$(getconf CLK_TCK)
run() {  # prints "server_seconds client_seconds" for one cell of $1 steps
  rm -f "$dir/port" "$dir/mport"
  "$server_bin" --listen=127.0.0.1:0 --port_file="$dir/port" --metrics_address=127.0.0.1:0 \
    --metrics_port_file="$dir/mport" --max_batch_size=64 --max_queue_delay=500us \
    > "$dir/server.log" 2>&1 &
  local server=$!
  for _ in $(seq 1 300); do [ -s "$dir/port" ] && [ -s "$dir/mport" ] && break; sleep 0.1; done
  local before after
  before=$(awk '{print $14 + $15}' "/proc/$server/stat")
  /usr/bin/time -f "%U %S" -o "$dir/time" "$bench_bin" --server="127.0.0.1:$(cat "$dir/port")" \
    --metrics="127.0.0.1:$(cat "$dir/mport")" --variants="$variant" --context=512 \
    --concurrency="$concurrency" --steps="$1" --progress=false > "$dir/bench.$1.log" 2>&1
  after=$(awk '{print $14 + $15}' "/proc/$server/stat")
  kill "$server"
  wait "$server" 2> /dev/null || true
  grep -E '^[A-Z]' "$dir/bench.$1.log" | tail -n 1 >&2
  echo "$(( after - before )) $(awk '{print $1 + $2}' "$dir/time")"
}
read -r s1 c1 < <(run "$steps1")
read -r s2 c2 < <(run "$steps2")
awk -v s1="$s1" -v s2="$s2" -v c1="$c1" -v c2="$c2" -v tick="$tick" \
    -v n=$(( (steps2 - steps1) * concurrency )) 'BEGIN {
  server = (s2 - s1) / tick / n * 1e6; client = (c2 - c1) / n * 1e6
  printf "per step: server %.0f us CPU, attnbench %.0f us CPU, together %.0f us",
         server, client, server + client
  printf " (at most %.0f steps/s on 2 cores)\n", 2e6 / (server + client)
}'
