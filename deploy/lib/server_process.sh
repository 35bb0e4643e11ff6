# Sourced, not run: starts and stops a throwaway attnserve_server on a free loopback port, for
# deploy/run_demo.sh and the scripted ctest tests. Every wait is bounded.
#
#   source deploy/lib/server_process.sh
#   server_start BINARY WORKDIR [--with_metrics] [server flags...]
#       Sets SERVER_PID and SERVER_ADDRESS (127.0.0.1:PORT); with --with_metrics also
#       SERVER_METRICS (the /metrics address). The server's output goes to WORKDIR/server.log.
#       Returns 1 (with a message on stderr) if it exits or does not listen within 30 s.
#   server_stop      SIGTERM, wait; returns the server's exit status (0 = drained cleanly).
#   server_kill      SIGKILL, wait; for cleanup traps. Harmless when no server runs.
#   server_log_tail N    the last N lines of the server's log, to stderr.

SERVER_PID=""
SERVER_ADDRESS=""
SERVER_METRICS=""
SERVER_WORKDIR=""

server_start() {
  local binary="$1" workdir="$2"
  shift 2
  local with_metrics=0
  if [[ "${1:-}" == "--with_metrics" ]]; then
    with_metrics=1
    shift
  fi
  SERVER_WORKDIR="${workdir}"
  # --backend=cpu: the tests' expectations are the CPU backend's (the server's default is auto,
  # CUDA where a device is usable); a --backend among the caller's flags comes later and wins.
  local flags=(--listen=127.0.0.1:0 --port_file="${workdir}/port" --backend=cpu)
  ((with_metrics)) && flags+=(--metrics_address=127.0.0.1:0 --metrics_port_file="${workdir}/metrics_port")
  "${binary}" "${flags[@]}" "$@" >"${workdir}/server.log" 2>&1 &
  SERVER_PID=$!
  # The server writes its port files (atomically, metrics first) once it listens.
  local _
  for _ in $(seq 1 300); do
    [[ -s "${workdir}/port" ]] && break
    if ! kill -0 "${SERVER_PID}" 2>/dev/null; then
      echo "server_process: the server exited before listening" >&2
      SERVER_PID=""
      return 1
    fi
    sleep 0.1
  done
  if [[ ! -s "${workdir}/port" ]]; then
    echo "server_process: the server did not write its port within 30 s" >&2
    return 1
  fi
  SERVER_ADDRESS="127.0.0.1:$(tr -d '[:space:]' <"${workdir}/port")"
  if ((with_metrics)); then
    SERVER_METRICS="127.0.0.1:$(tr -d '[:space:]' <"${workdir}/metrics_port")"
  fi
}

server_stop() {
  local status=0
  if [[ -n "${SERVER_PID}" ]]; then
    kill -TERM "${SERVER_PID}" 2>/dev/null || true
    wait "${SERVER_PID}" || status=$?
  fi
  SERVER_PID=""
  return "${status}"
}

server_kill() {
  if [[ -n "${SERVER_PID}" ]] && kill -0 "${SERVER_PID}" 2>/dev/null; then
    kill -KILL "${SERVER_PID}" 2>/dev/null || true
    wait "${SERVER_PID}" 2>/dev/null || true
  fi
  SERVER_PID=""
}

server_log_tail() {
  local log="${SERVER_WORKDIR}/server.log"
  if [[ -s "${log}" ]]; then
    echo "--- server log ---" >&2
    tail -n "$1" "${log}" >&2
  fi
}
