#!/usr/bin/env bash
# ctest: the Python client's ForwardStream (tests/client/python_forward_stream_test.py) against the
# real server with a 256 KiB message limit and 64-token prefill chunks.
#
# Usage: tests/client/python_forward_stream_test.sh SERVER_BINARY PYTHON
set -euo pipefail

readonly SERVER="${1:?usage: $0 SERVER_BINARY PYTHON}"
readonly PYTHON="${2:?usage: $0 SERVER_BINARY PYTHON}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

readonly TEST_NAME=python_forward_stream_test
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER}"
require_python_modules "${PYTHON}" grpc grpc_tools numpy

# The in-flight quota well above 4 x the limit: a client's rows can arrive in bursts of its HTTP/2
# window, which gRPC buffers against that quota before the server reads them (docs/api.md).
server_start "${SERVER}" "${workdir}" --max_message_bytes=262144 --prefill_chunk_tokens=64 \
  --max_inflight_message_bytes=16777216 ||
  fail "the server did not start"
"${PYTHON}" "${ROOT}/client/python/gen_proto.py"
"${PYTHON}" "${ROOT}/tests/client/python_forward_stream_test.py" "${SERVER_ADDRESS}" ||
  fail "python_forward_stream_test.py failed"
server_stop || fail "the server did not exit 0 after SIGTERM"
