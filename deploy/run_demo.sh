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

# shellcheck source=lib/server_process.sh
source "${ROOT}/deploy/lib/server_process.sh"
workdir="$(mktemp -d)"

stop_server() {
  [[ -n "${SERVER_PID}" ]] || return 0
  local status=0
  server_stop || status=$?
  log "server stopped (exit status ${status})"
}

cleanup() {
  local status=$?
  stop_server
  [[ "${status}" -ne 0 ]] && server_log_tail 20
  rm -rf "${workdir}"
  exit "${status}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck disable=SC2086  # ATTNSERVE_SERVER_FLAGS is a list of flags.
server_start "${SERVER}" "${workdir}" ${ATTNSERVE_SERVER_FLAGS:-} || die "the server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"
log "server pid ${SERVER_PID} listening on ${ADDRESS}"

"${ATTNCTL}" --server="${ADDRESS}" health --wait_s=30 >/dev/null ||
  die "the server's health check did not report SERVING"

"${ATTNCTL}" --server="${ADDRESS}" demo "$@"

stop_server
