#!/usr/bin/env bash
# Runs the client demo against a real server: starts attnserve_server on 127.0.0.1 with a free
# port, waits until its health service reports SERVING, runs `attnctl demo` (each demo variant
# configured, prefilled, decoded and released; the per-variant table of parameters, KV bytes and
# latencies), then stops the server with SIGTERM and waits for it to exit. The server is stopped
# on any exit of this script (error, Ctrl-C).
#
# Usage: deploy/run_demo.sh [attnctl demo flags, e.g. --batch=8 --tokens=512 --kv_dtype=bf16]
# Environment: ATTNSERVE_BUILD_DIR (default build/release), ATTNSERVE_SERVER_FLAGS (extra flags
# for the server, e.g. "--kv_pool_bytes=1073741824").
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly BUILD="${ATTNSERVE_BUILD_DIR:-${ROOT}/build/release}"
readonly SERVER="${BUILD}/server/attnserve_server"
readonly ATTNCTL="${BUILD}/client/attnctl"

log() { printf '[run_demo] %s\n' "$*" >&2; }
die() { printf '[run_demo] error: %s\n' "$*" >&2; exit 1; }

for binary in "${SERVER}" "${ATTNCTL}"; do
  [[ -x "${binary}" ]] || die "${binary} not found; build first: cmake --preset release && cmake --build --preset release"
done

workdir="$(mktemp -d)"
server_pid=""

stop_server() {
  if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
    kill -TERM "${server_pid}" 2>/dev/null || true
    local status=0
    wait "${server_pid}" || status=$?
    log "server stopped (exit status ${status})"
  fi
  server_pid=""
}

cleanup() {
  local status=$?
  stop_server
  if [[ "${status}" -ne 0 && -s "${workdir}/server.log" ]]; then
    log "server log (last 20 lines):"
    tail -n 20 "${workdir}/server.log" >&2
  fi
  rm -rf "${workdir}"
  exit "${status}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck disable=SC2086  # ATTNSERVE_SERVER_FLAGS is a list of flags.
"${SERVER}" --listen=127.0.0.1:0 --port_file="${workdir}/port" ${ATTNSERVE_SERVER_FLAGS:-} \
  >"${workdir}/server.log" 2>&1 &
server_pid=$!

# The server writes the port file (atomically) once it listens.
for _ in $(seq 1 300); do
  [[ -s "${workdir}/port" ]] && break
  kill -0 "${server_pid}" 2>/dev/null || die "the server exited before listening"
  sleep 0.1
done
[[ -s "${workdir}/port" ]] || die "the server did not write its port within 30 s"
readonly ADDRESS="127.0.0.1:$(tr -d '[:space:]' <"${workdir}/port")"
log "server pid ${server_pid} listening on ${ADDRESS}"

"${ATTNCTL}" --server="${ADDRESS}" health --wait_s=30 >/dev/null ||
  die "the server's health check did not report SERVING"

"${ATTNCTL}" --server="${ADDRESS}" demo "$@"

stop_server
