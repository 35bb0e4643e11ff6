#!/usr/bin/env bash
# ctest (label "model"): whole models whose attention layers attnserve serves, token for token
# against transformers' generate() (tests/model/remote_generate_test.py). Starts two
# attnserve_server processes on 127.0.0.1 with --checkpoint_root=MODELS_DIR (the second one
# receives a generation moved mid-way), runs the Python test, then stops both with SIGTERM and
# checks that they exit 0.
#
# Usage: tests/model/remote_model_test.sh SERVER_BINARY PYTHON CASE [MODELS_DIR]
#   CASE smollm2: MODELS_DIR holds SmolLM2-135M-Instruct (the model_smollm2_convert fixture
#   converts it there); CASE tiny or families: the tiny random models are written into a scratch
#   directory.
set -euo pipefail

readonly SERVER="${1:?usage: $0 SERVER_BINARY PYTHON CASE [MODELS_DIR]}"
readonly PYTHON="${2:?usage: $0 SERVER_BINARY PYTHON CASE [MODELS_DIR]}"
readonly CASE="${3:?usage: $0 SERVER_BINARY PYTHON CASE [MODELS_DIR]}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

readonly TEST_NAME="remote_model_test (${CASE})"
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER}"
require_python_modules "${PYTHON}" grpc numpy torch transformers

models="${4:-${workdir}/models}"
mkdir -p "${models}"
models="$(cd "${models}" && pwd)"
"${PYTHON}" "${ROOT}/client/python/gen_proto.py" >/dev/null

# One thread per process: client and servers share the machine's cores, and PyTorch's thread
# pool spins badly when they are oversubscribed.
server_flags=(--backend=cpu --checkpoint_root="${models}" --threads=1 --compute_threads=1 --max_queue_delay=0)

# The second server first, by hand; server_start then owns the first (SERVER_PID).
mkdir -p "${workdir}/second"
"${SERVER}" --listen=127.0.0.1:0 --port_file="${workdir}/second/port" "${server_flags[@]}" \
  >"${workdir}/second/server.log" 2>&1 &
SECOND_PID=$!
cleanup_both() {
  local status=$?
  if [[ -n "${SECOND_PID}" ]]; then
    kill -KILL "${SECOND_PID}" 2>/dev/null || true
    wait "${SECOND_PID}" 2>/dev/null || true
  fi
  (exit "${status}")
  server_test_cleanup
}
trap cleanup_both EXIT

server_start "${SERVER}" "${workdir}" "${server_flags[@]}" || fail "the server did not start"
for _ in $(seq 1 300); do
  [[ -s "${workdir}/second/port" ]] && break
  kill -0 "${SECOND_PID}" 2>/dev/null || fail "the second server exited before listening"
  sleep 0.1
done
[[ -s "${workdir}/second/port" ]] || fail "the second server did not listen within 30 s"
readonly SECOND="127.0.0.1:$(tr -d '[:space:]' <"${workdir}/second/port")"

OMP_NUM_THREADS=1 "${PYTHON}" "${ROOT}/tests/model/remote_generate_test.py" \
  --server="${SERVER_ADDRESS}" --server2="${SECOND}" --case="${CASE}" --models_dir="${models}" ||
  fail "remote_generate_test.py --case=${CASE} failed"

status=0
server_stop || status=$?
[[ "${status}" -eq 0 ]] || fail "the server exited with status ${status} after SIGTERM"
kill -TERM "${SECOND_PID}"
status=0
wait "${SECOND_PID}" || status=$?
SECOND_PID=""
[[ "${status}" -eq 0 ]] || fail "the second server exited with status ${status} after SIGTERM"
echo "remote_model_test (${CASE}): PASS"
