#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (CMake preset `fuzz`: clang, ASan + UBSan) and runs
# each one for SECONDS (default 30) from a scratch copy of its seed corpus (tests/fuzz/corpus/).
# Prints, per target, the executions and the crashes (with the reproducer's path and the sanitizer
# report), then a last line "N passed, M failed", which CI reads. Exits non-zero when a target
# crashed, hung (-timeout), ran out of memory, or the build failed.
#
# Usage: tests/fuzz/run_fuzzers.sh [SECONDS]
# Environment: ATTNSERVE_BUILD_LOCK=FILE builds under `flock FILE` (shared build machines).
# Reproduce a crash: build/fuzz/tests/fuzz/<target> <crash file>  (see tests/fuzz/README.md).
set -uo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly SECONDS_PER_TARGET="${1:-30}"
readonly BIN_DIR="${ROOT}/build/fuzz/tests/fuzz"
readonly SCRATCH="${ROOT}/build/fuzz/runs"

if ! [[ "${SECONDS_PER_TARGET}" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [SECONDS]  (a positive whole number of seconds per target)" >&2
  exit 2
fi

# Every tests/fuzz/<name>_fuzzer.cc is a target; CMakeLists.txt lists the same names.
targets=()
for source in "${ROOT}"/tests/fuzz/*_fuzzer.cc; do
  targets+=("$(basename "${source}" .cc)")
done

cd "${ROOT}"
lock=()
if [[ -n "${ATTNSERVE_BUILD_LOCK:-}" ]]; then lock=(flock "${ATTNSERVE_BUILD_LOCK}"); fi
build_start=${SECONDS}
if ! { cmake --preset fuzz >/dev/null && "${lock[@]}" cmake --build --preset fuzz; }; then
  echo "fuzz build failed"
  echo "0 passed, ${#targets[@]} failed"
  exit 1
fi
echo "fuzz build: $((SECONDS - build_start)) s"

passed=0
failed=0
for target in "${targets[@]}"; do
  dir="${SCRATCH}/${target}"
  rm -rf "${dir}"
  mkdir -p "${dir}/corpus" "${dir}/artifacts"
  if [[ -d "${ROOT}/tests/fuzz/corpus/${target}" ]]; then
    cp "${ROOT}/tests/fuzz/corpus/${target}"/* "${dir}/corpus/"
  fi
  # -timeout: one input taking 10 s is a hang. -rss_limit_mb: what one input may make us hold.
  "${BIN_DIR}/${target}" -max_total_time="${SECONDS_PER_TARGET}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="${dir}/artifacts/" "${dir}/corpus" >"${dir}/log" 2>&1
  status=$?
  executions="$(sed -n 's/^stat::number_of_executed_units: *//p' "${dir}/log" | tail -n 1)"
  crashes="$(find "${dir}/artifacts" -type f \
               \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) |
             wc -l)"
  if [[ ${status} -eq 0 && ${crashes} -eq 0 ]]; then
    passed=$((passed + 1))
    echo "${target}: ${executions:-?} executions, 0 crashes"
  else
    failed=$((failed + 1))
    echo "${target}: ${executions:-?} executions, ${crashes} crashes (exit ${status}; log ${dir}/log)"
    find "${dir}/artifacts" -type f -printf '  reproducer: %p\n'
    grep -E -A 25 'ERROR: |runtime error|FUZZ_CHECK' "${dir}/log" | head -n 40 | sed 's/^/  /'
  fi
done

echo "${passed} passed, ${failed} failed"
[[ ${failed} -eq 0 ]]
