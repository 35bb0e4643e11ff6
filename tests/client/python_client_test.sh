#!/usr/bin/env bash
# ctest: the Python client example (client/python/example.py) against the real server binary on
# 127.0.0.1. Starts attnserve_server on a free port, runs the example with unary Decode and with
# DecodeStream, checks each run's exit status and the output shapes it prints, then stops the
# server with SIGTERM and checks that it exits 0.
#
# Usage: tests/client/python_client_test.sh SERVER_BINARY PYTHON
set -euo pipefail

readonly SERVER="${1:?usage: $0 SERVER_BINARY PYTHON}"
readonly PYTHON="${2:?usage: $0 SERVER_BINARY PYTHON}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly EXAMPLE="${ROOT}/client/python/example.py"

readonly TEST_NAME=python_client_test
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER}"
require_python_modules "${PYTHON}" grpc grpc_tools numpy

server_start "${SERVER}" "${workdir}" || fail "the server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"

# Generate the client's protobuf modules up front (the package would do it on first import too).
"${PYTHON}" "${ROOT}/client/python/gen_proto.py"

for mode in unary stream; do
  flags=(--server="${ADDRESS}" --timeout_s=60)
  [[ "${mode}" == stream ]] && flags+=(--stream)
  status=0
  "${PYTHON}" "${EXAMPLE}" "${flags[@]}" >"${workdir}/${mode}.out" 2>&1 || status=$?
  cat "${workdir}/${mode}.out"
  [[ "${status}" -eq 0 ]] || fail "example.py (${mode}) exited with status ${status}"
  # The example's prompts are 48 and 17 tokens at d_model 512, then 8 decode steps.
  if [[ "${mode}" == unary ]]; then
    grep -qF "repeat of step 8 under its call_id: same outputs, nothing appended" \
      "${workdir}/${mode}.out" || fail "example.py (unary) did not show the call_id retry"
  fi
  for expected in "forward alice: output shape (48, 512) float32, sequence_length 48" \
                  "forward bob: output shape (17, 512) float32, sequence_length 17" \
                  "decode step 8: alice (1, 512) len=56, bob (1, 512) len=25" \
                  "example: OK"; do
    grep -qF "${expected}" "${workdir}/${mode}.out" || fail "example.py (${mode}) did not print '${expected}'"
  done
done

status=0
server_stop || status=$?
[[ "${status}" -eq 0 ]] || fail "the server exited with status ${status} after SIGTERM"
echo "python_client_test: PASS"
