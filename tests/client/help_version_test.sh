#!/usr/bin/env bash
# ctest: --help and --version of attnserve_server, attnctl and attnbench.
#   - --help lists the binary's own flags (Abseil's default looked for a file named after the
#     program and printed "No flags matched" for the server);
#   - the server's --backend defaults to auto;
#   - --version prints the version, git revision, build type and backends (Abseil's default
#     printed "Debug build (NDEBUG not #defined)" for a Release build and no version).
#
# Usage: tests/client/help_version_test.sh BUILD_DIR VERSION BUILD_TYPE
set -euo pipefail

readonly BUILD="${1:?usage: $0 BUILD_DIR VERSION BUILD_TYPE}"
readonly VERSION="${2:?usage: $0 BUILD_DIR VERSION BUILD_TYPE}"
readonly BUILD_TYPE="${3:?usage: $0 BUILD_DIR VERSION BUILD_TYPE}"
readonly TEST_NAME=help_version_test

fail() {
  printf '%s: FAIL: %s\n' "${TEST_NAME}" "$*" >&2
  exit 1
}

# check_binary PATH NAME FLAG...: --help names every FLAG; --version names NAME, VERSION and
# BUILD_TYPE.
check_binary() {
  local path="$1" name="$2"
  shift 2
  [[ -x "${path}" ]] || fail "${path} not found or not executable (build the project first)"
  local help version
  # --help exits (non-zero, Abseil's choice) without serving or connecting.
  help="$(timeout 20 "${path}" --help 2>&1)" || true
  [[ "${help}" != *"No flags matched"* ]] || fail "${name} --help: ${help}"
  local flag
  for flag in "$@"; do
    [[ "${help}" == *"--${flag}"* ]] || fail "${name} --help does not list --${flag}:
${help}"
  done
  version="$(timeout 20 "${path}" --version 2>&1)" || fail "${name} --version exited non-zero"
  [[ "${version}" != *"Debug build"* ]] || fail "${name} --version: ${version}"
  [[ "${version}" == "${name} ${VERSION} (git "* ]] || fail "${name} --version: ${version}"
  [[ "${version}" == *"${BUILD_TYPE} build, backends: cpu"* ]] ||
    fail "${name} --version lacks the build type or backends: ${version}"
  echo "${TEST_NAME}: ${version}"
}

check_binary "${BUILD}/server/attnserve_server" attnserve_server listen port_file backend \
  checkpoint_root
# The server's backend default is auto (CUDA when a device is usable, else CPU): one image serves
# with or without a GPU (deploy/compose.yaml passes no --backend).
server_help="$(timeout 20 "${BUILD}/server/attnserve_server" --help 2>&1)" || true
backend_help="$(printf '%s\n' "${server_help}" | sed -n '/^ *--backend (/,/default:/p')"
[[ "${backend_help}" == *'default: "auto";'* ]] ||
  fail "attnserve_server --help does not give --backend the default \"auto\": ${backend_help}"
check_binary "${BUILD}/client/attnctl" attnctl server session tokens to_session tls_ca
check_binary "${BUILD}/client/attnbench" attnbench server variants concurrency tls_ca
echo "${TEST_NAME}: PASS"
