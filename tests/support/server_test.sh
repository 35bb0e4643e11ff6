# Sourced, not run: the common start of the shell ctests that drive a throwaway attnserve_server
# (deploy/lib/server_process.sh). After sourcing, a test has:
#   fail MESSAGE...                 prints "TEST_NAME: FAIL: MESSAGE" and exits 1;
#   require_executables PATH...     fails naming the first PATH that is not an executable;
#   require_python_modules PYTHON MODULE...
#                                   fails unless PYTHON imports every MODULE (deploy/setup.sh
#                                   installs them into .venv);
#   workdir                         a scratch directory, removed on exit;
#   attnctl_test_setup BUILD_DIR PYTHON MODULE...
#                                   for the tests run as `TEST BUILD_DIR PYTHON`: sets BUILD,
#                                   PYTHON, SERVER and ATTNCTL (the build's binaries) read-only and
#                                   requires both executables and PYTHON with every MODULE;
# and an EXIT trap that kills the server, and when the test failed shows the server's log (and,
# when the test defines it, runs its own `show_failure_context` first, e.g. a client's stderr).
#
#   readonly TEST_NAME=attnctl_test
#   source "${ROOT}/tests/support/server_test.sh"
#
# Needs TEST_NAME set and `set -euo pipefail` in the test; sets ROOT (the repository) read-only
# unless the test has.

if [[ -z "${ROOT:-}" ]]; then
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  readonly ROOT
fi

fail() {
  printf '%s: FAIL: %s\n' "${TEST_NAME}" "$*" >&2
  exit 1
}

require_executables() {
  local path
  for path in "$@"; do
    [[ -x "${path}" ]] || fail "${path} not found or not executable (build the project first)"
  done
}

require_python_modules() {
  local python="$1"
  shift
  local modules
  modules="$(IFS=,; echo "$*")"
  [[ -x "${python}" ]] || fail "${python} not found: run deploy/setup.sh (it makes .venv)"
  "${python}" -c "import ${modules}" 2>/dev/null ||
    fail "${python} lacks one of ${modules}: run deploy/setup.sh"
}

attnctl_test_setup() {
  [[ $# -ge 2 && -n "$1" && -n "$2" ]] || fail "usage: $0 BUILD_DIR PYTHON"
  readonly BUILD="$1" PYTHON="$2"
  shift 2
  readonly SERVER="${BUILD}/server/attnserve_server"
  readonly ATTNCTL="${BUILD}/client/attnctl"
  require_executables "${SERVER}" "${ATTNCTL}"
  require_python_modules "${PYTHON}" "$@"
}

# shellcheck source=../../deploy/lib/server_process.sh
source "${ROOT}/deploy/lib/server_process.sh"

workdir="$(mktemp -d)"

server_test_cleanup() {
  local status=$?
  server_kill
  if [[ "${status}" -ne 0 ]]; then
    if declare -F show_failure_context >/dev/null; then show_failure_context; fi
    server_log_tail 40
  fi
  rm -rf "${workdir}"
  exit "${status}"
}
trap server_test_cleanup EXIT
