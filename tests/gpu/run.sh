#!/usr/bin/env bash
# The one script for the lent GPU machine: runs the benchmarks (layer calls, the attention kernels
# against same-run ceilings, the PyTorch peer) and the CUDA-vs-CPU tests, and prints the test
# summary table last.
#
# Approach: the GPU machine has the NVIDIA driver, nvcc, CMake, ninja and PyTorch, but not our
# Debian dependencies (gRPC, abseil, OpenBLAS, GoogleTest, nlohmann-json) and no package registry,
# so the tree cannot be configured there. Instead tests/gpu/bundle.sh builds the two binaries on
# the development machine (same x86-64; glibc there is as old or older) and copies them with their
# non-glibc shared libraries into .gpu-bundle/. This script runs that bundle. cudart is static in
# the binaries; cuBLAS is dlopen'ed from the GPU machine's CUDA toolkit or PyTorch wheel.
#
#   here:    tests/gpu/bundle.sh
#   device:  run(command="tests/gpu/run.sh", carry=[".gpu-bundle"])
# Outputs: full logs under $OUT (when set): bench.txt, kernel_bench.{txt,csv} and
# torch_peer.{txt,csv} (the benchmarks, run first) and gpu_test.txt; the test summary table is
# printed last.
#
# The real server (issue 19): after the tests it starts the bundle's attnserve_server with
# --backend=cuda (then again with --cuda_attention=flashinfer), runs `attnctl demo` against it and
# attnbench at d_model 4096, 32 heads, bf16 KV, 1/64/128 streams (server_<name>_*.txt/json), and
# the verdict table reports both. SERVER_BENCH_SECONDS (default 5) is each attnbench cell's length.
#
#   tests/gpu/run.sh --servers      (on the GPU) only the real-server part, the two CUDA servers.
#   tests/gpu/run.sh --probe        (on the GPU) decode-only attnbench cells (no re-prefills) on one
#       server per flag set: PROBE_CONFIGS='default=;threads8=--compute_threads=8' and
#       PROBE_BENCH_ARGS (extra attnbench flags), to find what bounds the served decode rate.
#   tests/gpu/run.sh --cpu-check    (here, no GPU) only the server part, with the bundle's server
#       started --backend=cpu and small shapes (d_model 512, 8 heads, 1/4 streams): checks the
#       script, the bundled binaries and the verdict rows, not the GPU.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CPU_CHECK=0
SERVERS_ONLY=0
if [[ "${1:-}" == "--cpu-check" ]]; then CPU_CHECK=1; fi
PROBE=0
if [[ "${1:-}" == "--servers" ]]; then SERVERS_ONLY=1; fi
if [[ "${1:-}" == "--probe" ]]; then SERVERS_ONLY=1 PROBE=1; fi
# bundle.sh packs the binaries into .gpu-bundle/bundle.tar.xz (the device tool's size limit);
# unpacked with Python's tarfile, which every machine with python3 has (xz may not be installed).
BUNDLE="${TMPDIR:-/tmp}/attnserve-gpu-bundle"
if [[ -f "${ROOT}/.gpu-bundle/bundle.tar.xz" ]]; then
  rm -rf "${BUNDLE}" && mkdir -p "${BUNDLE}"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "${ROOT}/.gpu-bundle/bundle.tar.xz" "${BUNDLE}" || exit 2
fi
LOGS="${OUT:-/tmp/attnserve-gpu}"
mkdir -p "${LOGS}"

if ((CPU_CHECK)) && [[ ! -x "${BUNDLE}/attnserve_server" ]]; then
  echo "run.sh --cpu-check: ${BUNDLE}/attnserve_server missing: run tests/gpu/bundle.sh" >&2
  exit 2
fi
if ((!CPU_CHECK)) && [[ ! -x "${BUNDLE}/cuda_backend_test" ]]; then
  echo "run.sh: ${BUNDLE}/cuda_backend_test missing: run tests/gpu/bundle.sh on the build machine" \
       "and carry .gpu-bundle" >&2
  exit 2
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "run.sh: nvidia-smi not available"

# Find libcublas.so.13 (or .12): the toolkit first, then PyTorch's wheel.
CUBLAS_DIR=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if ls "${dir}"/libcublas.so.1[23]* >/dev/null 2>&1; then CUBLAS_DIR="${dir}"; break; fi
done
if [[ -z "${CUBLAS_DIR}" ]]; then
  CUBLAS_DIR="$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia.cublas as m
    paths = list(m.__path__)
except Exception:
    paths = []
for p in paths:
    for lib in glob.glob(os.path.join(p, "lib", "libcublas.so.*")):
        print(os.path.dirname(lib)); raise SystemExit
PY
)"
fi
echo "cuBLAS from: ${CUBLAS_DIR:-<loader search path>}"
export LD_LIBRARY_PATH="${BUNDLE}/lib${CUBLAS_DIR:+:${CUBLAS_DIR}}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

status=0

# Starts the bundle's server with `flags`, runs `attnctl demo` and attnbench against it, stops it.
# Logs: server_NAME.log, server_NAME_demo.json, server_NAME_bench.json; server_NAME.status holds
# "server=<ok|failed> demo=<exit> bench=<exit> stop=<exit>" for verdict.py, which judges them
# (its exit status counts); this returns non-zero when the server did not start or stop cleanly
# or attnbench failed.
run_server_checks() {
  local name="$1"
  shift
  local work="${LOGS}/server_${name}.d"
  rm -rf "${work}" && mkdir -p "${work}"
  rm -f "${LOGS}/server_${name}".{log,status} "${LOGS}/server_${name}"_demo.{json,err} \
        "${LOGS}/server_${name}"_bench.{json,err}
  echo "== server ${name}: attnserve_server $* =="
  # shellcheck source=deploy/lib/server_process.sh
  source "${ROOT}/deploy/lib/server_process.sh"
  if ! server_start "${BUNDLE}/attnserve_server" "${work}" --with_metrics "$@"; then
    cp "${work}/server.log" "${LOGS}/server_${name}.log" 2>/dev/null
    tail -n 20 "${LOGS}/server_${name}.log" 2>/dev/null
    echo "server=failed demo=- bench=- stop=-" >"${LOGS}/server_${name}.status"
    return 1
  fi
  local demo_args=(--kv_dtype=bf16) bench_args=(--d_model=4096 --num_heads=32 --kv_dtype=bf16
    --variants=gqa --context=512 --concurrency=1,64,128)
  if ((CPU_CHECK)) || [[ "${PROBE_BACKEND:-cuda}" == cpu ]]; then
    demo_args=(--kv_dtype=bf16 --tokens=32 --steps=4)
    bench_args=(--d_model=512 --num_heads=8 --kv_dtype=bf16 --variants=gqa --context=64
      --concurrency=1,4)
  fi
  # --probe: what bounds the served decode rate. A request lives 16000 steps, more than a 5 s
  # cell takes, so a cell is decode steps alone (no re-prefills); PROBE_BENCH_ARGS adds flags.
  if ((PROBE)); then
    bench_args+=(--steps_per_request=16000 ${PROBE_BENCH_ARGS:-})
  fi
  local demo=0 bench=0 stop=0
  # --json for verdict.py, which judges the demo: a variant the backend refuses as UNIMPLEMENTED
  # (MLA on CUDA) is expected, any other failure is not; so its exit status is only recorded here.
  ((PROBE)) || timeout 180 "${BUNDLE}/attnctl" --server="${SERVER_ADDRESS}" --timeout_s=120 --json demo \
    "${demo_args[@]}" >"${LOGS}/server_${name}_demo.json" 2>"${LOGS}/server_${name}_demo.err" ||
    demo=$?
  tail -n 5 "${LOGS}/server_${name}_demo.err"
  timeout 300 "${BUNDLE}/attnbench" --server="${SERVER_ADDRESS}" "${bench_args[@]}" \
    --duration="${SERVER_BENCH_SECONDS:-5}s" --progress=false --json \
    >"${LOGS}/server_${name}_bench.json" 2>"${LOGS}/server_${name}_bench.err" || bench=$?
  tail -n 5 "${LOGS}/server_${name}_bench.err"
  # attnbench keeps each failed call's status in its JSON: print the distinct ones here, since the
  # device tool brings back only a few files.
  python3 - "${LOGS}/server_${name}_bench.json" <<'PY' 2>/dev/null
import json, sys
seen = set()
def walk(node):
    if isinstance(node, dict):
        for message in node.get("error_messages", []) or []:
            if message not in seen and len(seen) < 8:
                seen.add(message)
                print("attnbench error:", message)
        for value in node.values():
            walk(value)
    elif isinstance(node, list):
        for value in node:
            walk(value)
walk(json.load(open(sys.argv[1])))
PY
  # Where a call's time went, per RPC: the server's own totals (wire to answer), queue wait and
  # engine compute, as mean ms per call from its Prometheus counters.
  python3 - "http://${SERVER_METRICS}/metrics" <<'PY' 2>&1 | tee "${LOGS}/server_${name}_metrics.txt"
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
sums = {}
for line in text.splitlines():
    m = re.match(r'attnserve_(rpc_duration|queue_wait|compute)_seconds_(sum|count)\{([^}]*)\} (\S+)', line)
    if not m:
        continue
    rpc = re.search(r'rpc="([^"]+)"', m.group(3))
    key = (rpc.group(1) if rpc else "?", m.group(1))
    entry = sums.setdefault(key, [0.0, 0.0])
    entry[0 if m.group(2) == "sum" else 1] += float(m.group(4))
for rpc in sorted({k[0] for k in sums}):
    parts = []
    for what in ("rpc_duration", "queue_wait", "compute"):
        total, count = sums.get((rpc, what), (0.0, 0.0))
        if count:
            parts.append(f"{what} {1e3 * total / count:.3f} ms")
    calls = int(sums.get((rpc, "rpc_duration"), (0, 0))[1])
    print(f"server metrics: {rpc:16s} {calls:7d} calls, mean " + ", ".join(parts))
PY
  server_stop || stop=$?
  grep -E " [EW][0-9]{4} |error|Error" "${work}/server.log" 2>/dev/null | sort | uniq -c |
    sort -rn | head -n 8
  cp "${work}/server.log" "${LOGS}/server_${name}.log"
  echo "server=ok demo=${demo} bench=${bench} stop=${stop}" | tee "${LOGS}/server_${name}.status"
  ((bench == 0 && stop == 0))
}

if ((CPU_CHECK)); then
  rm -f "${LOGS}"/server_*.status
  run_server_checks cpu --backend=cpu || status=1
  python3 "${ROOT}/tests/gpu/verdict.py" --servers-only "${LOGS}" 2>&1 | tee "${LOGS}/verdict.txt" ||
    status=1
  echo "run.sh --cpu-check: exit ${status} (logs in ${LOGS})"
  exit "${status}"
fi

# Packs every log into one file at exit: the device tool brings back at most 8 files from $OUT.
pack_logs() {
  if [[ -n "${OUT:-}" ]]; then
    tar -czf "${LOGS}/all_logs.tar.gz" --exclude=all_logs.tar.gz -C "${LOGS}" . 2>/dev/null
  fi
}
trap pack_logs EXIT

if ((PROBE)); then
  # One server per flag set (PROBE_CONFIGS: NAME=FLAG,FLAG;...), the decode-only cells each.
  rm -f "${LOGS}"/server_*.status
  IFS=';' read -r -a probe_configs <<<"${PROBE_CONFIGS:-default=}"
  for config in "${probe_configs[@]}"; do
    IFS=',' read -r -a probe_flags <<<"${config#*=}"
    run_server_checks "probe_${config%%=*}" --backend="${PROBE_BACKEND:-cuda}" "${probe_flags[@]}" ||
      status=1
  done
  python3 "${ROOT}/tests/gpu/verdict.py" --servers-only "${LOGS}" 2>&1 | tee "${LOGS}/verdict.txt" ||
    status=1
  echo "run.sh --probe: exit ${status} (logs in ${LOGS})"
  exit "${status}"
fi
if ((SERVERS_ONLY)); then
  rm -f "${LOGS}"/server_*.status
  run_server_checks cuda --backend=cuda || status=1
  run_server_checks cuda_flashinfer --backend=cuda --cuda_attention=flashinfer || status=1
  python3 "${ROOT}/tests/gpu/verdict.py" --servers-only "${LOGS}" 2>&1 | tee "${LOGS}/verdict.txt" ||
    status=1
  echo "run.sh --servers: exit ${status} (logs in ${LOGS})"
  exit "${status}"
fi

echo "== benchmark =="
"${BUNDLE}/attnserve_cuda_bench" 2>&1 | tee "${LOGS}/bench.txt" || status=1
# The attention kernels alone against same-run ceilings, then the PyTorch peer at the same shapes
# (it reads the kernel bench's CSV, so both run exactly the same cases, and ends with a table of
# attnserve's time against PyTorch's). docs/gpu_benchmarks.md. KERNEL_BENCH_ARGS=--quick for small
# shapes.
KERNEL_BENCH_ARGS="${KERNEL_BENCH_ARGS:-}"
rm -f "${LOGS}/kernel_bench.csv"  # never compare against an earlier run's numbers
if [[ -x "${BUNDLE}/attention_kernel_bench" ]]; then
  echo "== attention kernel benchmark (ratios against same-run ceilings) =="
  # shellcheck disable=SC2086
  "${BUNDLE}/attention_kernel_bench" ${KERNEL_BENCH_ARGS} --csv "${LOGS}/kernel_bench.csv" 2>&1 |
    tee "${LOGS}/kernel_bench.txt" || status=1
else
  echo "run.sh: ${BUNDLE}/attention_kernel_bench missing: rebuild the bundle (tests/gpu/bundle.sh)"
  status=1
fi
echo "== PyTorch peer (same shapes, same device) =="
# shellcheck disable=SC2086
python3 "${ROOT}/tests/gpu/torch_peer_bench.py" ${KERNEL_BENCH_ARGS} \
  --ours "${LOGS}/kernel_bench.csv" --csv "${LOGS}/torch_peer.csv" 2>&1 |
  tee "${LOGS}/torch_peer.txt" || status=1
if [[ -x "${BUNDLE}/flashinfer_decode_test" ]]; then
  # FlashInfer's decode kernel over our pages against float64 (the layer's --cuda_attention=flashinfer).
  echo "== FlashInfer decode adapter =="
  "${BUNDLE}/flashinfer_decode_test" >"${LOGS}/flashinfer_test.txt" 2>&1 || status=1
  grep -E "^\[flashinfer\]|FAILED|Failure|SKIPPED|PASSED" "${LOGS}/flashinfer_test.txt" | head -100
  if grep -q "^FlashInfer decode: SKIPPED" "${LOGS}/flashinfer_test.txt"; then status=3; fi
fi
if [[ -x "${BUNDLE}/flashinfer_prefill_test" ]]; then
  # FlashInfer's prefill kernel over our pages against float64 (the layer's --cuda_attention=flashinfer).
  echo "== FlashInfer prefill adapter =="
  "${BUNDLE}/flashinfer_prefill_test" >"${LOGS}/flashinfer_prefill_test.txt" 2>&1 || status=1
  # A failing case's seed is in the log, on the "[case]" line before its result.
  grep -E "^\[flashinfer prefill\]|FAILED|Failure|SKIPPED|PASSED" \
    "${LOGS}/flashinfer_prefill_test.txt" | head -80
  if grep -q "^FlashInfer prefill: SKIPPED" "${LOGS}/flashinfer_prefill_test.txt"; then
    status=3
  fi
fi
# The MLA layer against the CPU engine (cuda_mla_test.cc; its native kernels; FlashInfer's MLA
# kernel is timed by attention_kernel_bench only).
if [[ -x "${BUNDLE}/cuda_mla_test" ]]; then
  echo "== MLA (CUDA vs CPU engine) =="
  "${BUNDLE}/cuda_mla_test" --gtest_brief=1 >"${LOGS}/mla_test.txt" 2>&1 || status=1
  grep -E "^\[mla\]|FAILED|Failure|SKIPPED|PASSED|seed [0-9]" "${LOGS}/mla_test.txt" | head -40
  if grep -q "no usable CUDA device" "${LOGS}/mla_test.txt"; then status=3; fi
else
  echo "run.sh: ${BUNDLE}/cuda_mla_test missing: rebuild the bundle (tests/gpu/bundle.sh)"
  status=1
fi
echo "== GPU tests (CUDA vs CPU engine) =="
"${BUNDLE}/cuda_backend_test" --gtest_brief=1 >"${LOGS}/gpu_test.txt" 2>&1 || status=1
# Failures first (if any), then the summary table, printed last.
grep -E "^\[  FAILED|Failure|error:|Expected|Which is|seed [0-9]" "${LOGS}/gpu_test.txt" | head -60
# On the GPU machine a skip means the device or cuBLAS was not usable: that is a failure here.
if grep -q "^CUDA vs CPU summary: SKIPPED" "${LOGS}/gpu_test.txt"; then status=3; fi
sed -n '/^CUDA vs CPU summary/,$p' "${LOGS}/gpu_test.txt"
# The real server on the GPU: the default CUDA attention, then FlashInfer's.
rm -f "${LOGS}"/server_*.status
if [[ -x "${BUNDLE}/attnserve_server" ]]; then
  run_server_checks cuda --backend=cuda || status=1
  run_server_checks cuda_flashinfer --backend=cuda --cuda_attention=flashinfer || status=1
else
  echo "run.sh: ${BUNDLE}/attnserve_server missing: rebuild the bundle (tests/gpu/bundle.sh)"
  status=1
fi
# The one verdict table: correctness per implementation, each target of the GPU issue against
# this run's numbers, and `flashinfer default: yes|no (reason)` (docs/gpu_benchmarks.md).
echo "== verdict =="
python3 "${ROOT}/tests/gpu/verdict.py" "${LOGS}" 2>&1 | tee "${LOGS}/verdict.txt" || status=1
echo "run.sh: exit ${status} (logs in ${LOGS})"
exit "${status}"
