#!/usr/bin/env bash
# ctest cuda_free_start_test: the server and a test binary start and run the CPU backend on a
# machine with no CUDA toolkit and no GPU driver, proven by running them with both hidden.
#   1. No binary (server, attnctl, backend_factory_test, the CUDA module) has a DT_NEEDED entry on
#      libcudart, libcublas, libcuda or libnvidia-*: cudart is linked statically, cuBLAS is
#      dlopen'ed at run time, the CUDA backend is a dlopen'ed module.
#   2. Re-runs itself in a private mount namespace (unshare --mount --map-root-user) and there
#      hides the toolkit and the driver: an empty directory over each /usr/local/cuda* (and
#      /opt/cuda*), /dev/null over every libcuda*/libcudart*/libcublas*/libnvidia-*/libnvrtc*/
#      libnvJitLink* file that ldconfig's cache or the standard library directories hold. It then
#      checks they are hidden: no nvcc, every such file empty or gone, dlopen of each fails.
#   3. With the toolkit hidden: backend_factory_test passes; the server with --backend=auto starts,
#      logs that it fell back to the CPU, reports backend "cpu" through GetServerInfo, serves
#      `attnctl demo` and drains on SIGTERM; the server with --backend=cuda exits non-zero with a
#      message naming CUDA. When the CUDA module was built, both also must say "no CUDA device":
#      the module itself loaded with the toolkit gone and only the device probe failed.
# Where no mount namespace can be made (some CI containers), it exits 77, which ctest reports as
# skipped, with the reason: nothing was proven then.
#
# Usage: tests/cuda_free/run_without_toolkit.sh SERVER ATTNCTL BACKEND_FACTORY_TEST [CUDA_MODULE]
#   CUDA_MODULE: libattnserve_cuda.so when this build has the CUDA backend; omit it otherwise.
set -euo pipefail

readonly SERVER="${1:?usage: $0 SERVER ATTNCTL BACKEND_FACTORY_TEST [CUDA_MODULE]}"
readonly ATTNCTL="${2:?usage: $0 SERVER ATTNCTL BACKEND_FACTORY_TEST [CUDA_MODULE]}"
readonly FACTORY_TEST="${3:?usage: $0 SERVER ATTNCTL BACKEND_FACTORY_TEST [CUDA_MODULE]}"
readonly CUDA_MODULE="${4:-}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
readonly SKIP=77

fail() { printf 'cuda_free_start_test: FAIL: %s\n' "$*" >&2; exit 1; }
skip() { printf 'cuda_free_start_test: SKIP: %s\n' "$*" >&2; exit "${SKIP}"; }
say() { printf 'cuda_free_start_test: %s\n' "$*"; }

# Every library file of the toolkit or the driver that the dynamic loader could find, resolved
# (one per line, existing files only).
cuda_library_files() {
  {
    ldconfig -p 2>/dev/null | sed -n 's/^[[:space:]]*\(libcuda\|libcudart\|libcublas\|libnvidia-\|libnvrtc\|libnvJitLink\).*=> //p'
    local dir
    for dir in /lib /lib64 /usr/lib /usr/lib64 /usr/local/lib /usr/local/lib64; do
      if [[ -d "${dir}" ]]; then readlink -f "${dir}"; fi
    done | sort -u | while read -r dir; do
      find "${dir}" \( -type f -o -type l \) \
        \( -name 'libcuda*' -o -name 'libcudart*' -o -name 'libcublas*' -o -name 'libnvidia-*' \
           -o -name 'libnvrtc*' -o -name 'libnvJitLink*' \) 2>/dev/null || true
    done
  } | while read -r path; do
    path="$(readlink -f "${path}" 2>/dev/null)" || continue
    if [[ -f "${path}" ]]; then printf '%s\n' "${path}"; fi
  done | sort -u
}

# The toolkit's directories, resolved (/usr/local/cuda -> /usr/local/cuda-13.0).
cuda_toolkit_dirs() {
  local dir
  for dir in /usr/local/cuda /usr/local/cuda-* /opt/cuda /opt/cuda-*; do
    [[ -e "${dir}" ]] || continue
    dir="$(readlink -f "${dir}")"
    if [[ -d "${dir}" ]]; then printf '%s\n' "${dir}"; fi
  done | sort -u
}

if [[ "${ATTNSERVE_CUDA_FREE_INNER:-}" != 1 ]]; then
  # ---- 1. Outside the namespace: no binary links the toolkit or the driver. -------------------
  for binary in "${SERVER}" "${ATTNCTL}" "${FACTORY_TEST}"; do
    [[ -x "${binary}" ]] || fail "${binary} is not built"
  done
  [[ -z "${CUDA_MODULE}" || -f "${CUDA_MODULE}" ]] || fail "${CUDA_MODULE} is not built"
  command -v readelf >/dev/null || fail "readelf (binutils) is needed"
  for binary in "${SERVER}" "${ATTNCTL}" "${FACTORY_TEST}" ${CUDA_MODULE:+"${CUDA_MODULE}"}; do
    needed="$(readelf -d "${binary}" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
    [[ -n "${needed}" ]] || fail "readelf -d ${binary} lists no NEEDED entries"
    if bad="$(grep -E '^(libcuda|libcudart|libcublas|libnvidia-|libnvrtc|libnvJitLink)' <<<"${needed}")"; then
      fail "$(basename "${binary}") has DT_NEEDED on $(tr '\n' ' ' <<<"${bad}")"
    fi
    say "no DT_NEEDED on libcuda/libcudart/libcublas/libnvidia-*: $(basename "${binary}")"
  done

  # ---- 2. Re-run inside a private mount namespace. ---------------------------------------------
  unshare_flags=(--mount --map-root-user)
  if ! probe="$(unshare "${unshare_flags[@]}" true 2>&1)"; then
    # Real root without user namespaces may still make a mount namespace.
    if [[ "$(id -u)" == 0 ]] && unshare --mount true 2>/dev/null; then
      unshare_flags=(--mount)
    else
      skip "cannot make a private mount namespace (unshare --mount --map-root-user: ${probe:-failed}), so the toolkit cannot be hidden here: nothing was proven"
    fi
  fi
  # unshare(1) makes the new namespace's mounts private: nothing below leaks to this machine.
  ATTNSERVE_CUDA_FREE_INNER=1 exec unshare "${unshare_flags[@]}" bash "${SELF}" "$@"
fi

# ---- Inside the namespace: hide the toolkit and the driver. ----------------------------------
# shellcheck source=../../deploy/lib/server_process.sh
source "${ROOT}/deploy/lib/server_process.sh"
workdir="$(mktemp -d)"
cleanup() {
  local status=$?
  server_kill
  [[ "${status}" -ne 0 && "${status}" -ne "${SKIP}" ]] && server_log_tail 40
  rm -rf "${workdir}"
  exit "${status}"
}
trap cleanup EXIT
empty="${workdir}/empty"
mkdir "${empty}"
hidden_dirs=()
while read -r dir; do
  mount --bind "${empty}" "${dir}" 2>/dev/null ||
    skip "mount --bind over ${dir} is not permitted here: nothing was proven"
  hidden_dirs+=("${dir}")
done < <(cuda_toolkit_dirs)
hidden_files=()
while read -r file; do
  mount --bind /dev/null "${file}" 2>/dev/null ||
    skip "mount --bind /dev/null over ${file} is not permitted here: nothing was proven"
  hidden_files+=("${file}")
done < <(cuda_library_files)
say "hid ${#hidden_dirs[@]} toolkit directories (${hidden_dirs[*]:-none}) and ${#hidden_files[@]} library files${hidden_files[*]:+ (${hidden_files[*]})}"

# Nothing of the toolkit or the driver may be visible or loadable now.
unset LD_LIBRARY_PATH LD_PRELOAD ATTNSERVE_CUBLAS_LIBRARY CUDA_HOME CUDA_PATH
export PATH="/usr/local/cuda/bin:${PATH}"
[[ ! -e /usr/local/cuda/bin/nvcc ]] || fail "/usr/local/cuda/bin/nvcc still exists"
# A wrapper on PATH (e.g. /usr/local/bin/nvcc exec'ing into the toolkit) may remain; none may run.
nvccs=()
while read -r nvcc; do
  ! "${nvcc}" --version >/dev/null 2>&1 || fail "${nvcc} --version still runs"
  nvccs+=("${nvcc}")
done < <(type -ap nvcc)
say "no nvcc runs (${nvccs[*]:-none on PATH}${nvccs[*]:+: present but fail})"
while read -r file; do
  [[ ! -s "${file}" ]] || fail "${file} is still readable after hiding"
done < <(cuda_library_files)
dlopen_names=(libcuda.so.1 libcuda.so libcudart.so.13 libcudart.so.12 libcudart.so
              libcublas.so.13 libcublas.so.12 libcublas.so libcublasLt.so.13 libcublasLt.so.12)
python=""
for candidate in /usr/bin/python3 python3; do
  command -v "${candidate}" >/dev/null && { python="$(command -v "${candidate}")"; break; }
done
if [[ -n "${python}" ]]; then
  "${python}" - "${dlopen_names[@]}" <<'PY' || fail "a CUDA library can still be dlopen'ed"
import ctypes, sys
loaded = []
for name in sys.argv[1:]:
    try:
        ctypes.CDLL(name)
        loaded.append(name)
    except OSError:
        pass
if loaded:
    print("still loadable:", " ".join(loaded), file=sys.stderr)
    sys.exit(1)
PY
  say "dlopen fails for ${dlopen_names[*]}"
else
  say "no python3 for the dlopen check; relying on the file checks above"
fi

# ---- 3. Run the binaries. ---------------------------------------------------------------------
if [[ -n "${CUDA_MODULE}" ]]; then
  export ATTNSERVE_CUDA_PLUGIN="${CUDA_MODULE}"
  # The module must load with the toolkit gone; only the device probe may fail.
  readonly CUDA_REASON="no CUDA device"
else
  unset ATTNSERVE_CUDA_PLUGIN
  readonly CUDA_REASON="built without CUDA"
fi

# The test binary.
"${FACTORY_TEST}" --gtest_brief=1 >"${workdir}/factory.out" 2>&1 ||
  fail "$(basename "${FACTORY_TEST}") failed without the toolkit: $(cat "${workdir}/factory.out")"
! grep -q '\[  SKIPPED' "${workdir}/factory.out" || fail "$(basename "${FACTORY_TEST}") skipped tests"
say "$(basename "${FACTORY_TEST}"): $(grep -E '^\[  PASSED' "${workdir}/factory.out")"

# The server, --backend=auto: falls back to the CPU and serves.
server_start "${SERVER}" "${workdir}" --backend=auto || fail "the server did not start with --backend=auto"
reason="$(grep -o 'backend auto: .*' "${workdir}/server.log" || true)"
[[ "${reason}" == *"auto: CPU, because the CUDA backend is unavailable ("*"${CUDA_REASON}"* ]] ||
  fail "the server's log does not say it fell back to the CPU because of '${CUDA_REASON}': ${reason:-no backend line}"
ctl() { "${ATTNCTL}" --server="${SERVER_ADDRESS}" --timeout_s=60 "$@"; }
[[ "$(ctl health)" == SERVING ]] || fail "attnctl health is not SERVING"
ctl --json info >"${workdir}/info.json" || fail "attnctl info failed"
grep -Eq '"backend": *"cpu"' "${workdir}/info.json" ||
  fail "GetServerInfo does not report backend cpu: $(cat "${workdir}/info.json")"
ctl demo --steps=4 --batch=2 >"${workdir}/demo.out" 2>&1 || fail "attnctl demo failed: $(cat "${workdir}/demo.out")"
grep -q ': cpu backend' "${workdir}/demo.out" || fail "attnctl demo did not run on the cpu backend: $(head -n 3 "${workdir}/demo.out")"
server_stop || fail "the server did not drain cleanly on SIGTERM (exit $?)"
say "server --backend=auto: ${reason}"
say "server --backend=auto: GetServerInfo backend cpu, attnctl demo served ($(grep -cE '^(MHA|GQA|MQA|MLA)' "${workdir}/demo.out") variants), clean SIGTERM exit"

# The server, --backend=cuda: refuses to start, and says why.
status=0
timeout 30 "${SERVER}" --backend=cuda --listen=127.0.0.1:0 >"${workdir}/cuda.log" 2>&1 || status=$?
message="$(tail -n 1 "${workdir}/cuda.log")"
[[ "${status}" -ne 0 ]] || fail "the server started with --backend=cuda and no toolkit"
[[ "${status}" -ne 124 ]] || fail "the server with --backend=cuda neither started nor exited within 30 s"
[[ "${status}" -lt 128 ]] || fail "the server with --backend=cuda crashed (exit ${status}): $(cat "${workdir}/cuda.log")"
[[ "${message}" == *"backend = cuda: "*CUDA* && "${message}" == *"${CUDA_REASON}"* ]] ||
  fail "the server with --backend=cuda exited ${status} without naming the CUDA problem ('${CUDA_REASON}'): $(cat "${workdir}/cuda.log")"
say "server --backend=cuda: exit ${status}: ${message#* E }"

if [[ -n "${CUDA_MODULE}" ]]; then
  say "PROVEN: with the CUDA toolkit and driver hidden, the CUDA-enabled build (module $(basename "${CUDA_MODULE}") loaded, device probe failed) starts and serves on the CPU backend"
else
  say "PROVEN: with the CUDA toolkit and driver hidden, this CPU-only build (no CUDA module) starts and serves on the CPU backend"
fi
