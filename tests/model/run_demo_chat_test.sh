#!/usr/bin/env bash
# ctest (label "model"): deploy/run_demo.sh, README command (1)'s main job, with its SmolLM2 chat:
# the variant table, then a 24-token answer through the server that must be token-identical to
# transformers' generate() (run_demo.sh exits non-zero otherwise), and a clean server stop.
#
# Usage: tests/model/run_demo_chat_test.sh BUILD_DIR MODELS_DIR PYTHON
set -euo pipefail

readonly BUILD="${1:?usage: $0 BUILD_DIR MODELS_DIR PYTHON}"
readonly MODELS="${2:?usage: $0 BUILD_DIR MODELS_DIR PYTHON}"
readonly PYTHON="${3:?usage: $0 BUILD_DIR MODELS_DIR PYTHON}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

fail() {
  printf 'run_demo_chat_test: FAIL: %s\n' "$*" >&2
  exit 1
}

out="$(mktemp)"
trap 'rm -f "${out}"' EXIT
status=0
ATTNSERVE_BUILD_DIR="${BUILD}" ATTNSERVE_MODELS_DIR="${MODELS}" ATTNSERVE_PYTHON="${PYTHON}" \
  "${ROOT}/deploy/run_demo.sh" --tokens=16 --steps=2 >"${out}" 2>&1 || status=$?
cat "${out}"
[[ "${status}" -eq 0 ]] || fail "deploy/run_demo.sh exited with status ${status}"
grep -q "^MLA-256 " "${out}" || fail "no variant table (MLA row)"
grep -qF "chat: token-identical to transformers generate() (24/24 tokens)" "${out}" ||
  fail "no 24-token chat token-identical to transformers generate()"
grep -q "server stopped (exit status 0)" "${out}" || fail "the server did not stop cleanly"
echo "run_demo_chat_test: PASS"
