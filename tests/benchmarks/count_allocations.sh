#!/bin/bash
# Prints the heap allocations (malloc_counter.c) the server makes while attnbench runs STEPS decode
# steps on each of CONCURRENCY DecodeStream streams (one item per message) of one GQA session:
# server start, Configure, prefill and shutdown included. Two runs with different STEPS and the
# same CONCURRENCY difference those out: (count(S2) - count(S1)) / ((S2 - S1) * CONCURRENCY) is
# the allocations per DecodeStream message (docs/benchmarks.md, "The per-step overhead").
#   usage: count_allocations.sh BUILD_DIR STEPS CONCURRENCY
set -euo pipefail
build=$1 steps=$2 concurrency=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ATTNSERVE_MALLOC_COUNT_FILE="$dir/count" LD_PRELOAD="$build/tests/benchmarks/libmalloc_counter.so" \
  "$build/server/attnserve_server" --listen=127.0.0.1:0 --port_file="$dir/port" --threads=2 \
  --max_queue_delay=0 > "$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
if ! "$build/client/attnbench" --server="127.0.0.1:$(cat "$dir/port")" --variants=gqa --context=64 \
     --steps_per_request=1000 --concurrency="$concurrency" --steps="$steps" --progress=false \
     > "$dir/bench.log" 2>&1; then
  cat "$dir/bench.log" >&2
  kill -TERM "$server"
  exit 1
fi
kill -TERM "$server"
wait "$server"  # The count is written as the server exits.
cat "$dir/count"
