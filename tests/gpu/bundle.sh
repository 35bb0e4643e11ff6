#!/usr/bin/env bash
# Builds the GPU test and benchmarks HERE (where gRPC, abseil, OpenBLAS and GoogleTest are
# installed) and copies them, with every shared library they load that is not part of glibc, into
# .gpu-bundle/ at the repository root (git-ignored). tests/gpu/run.sh runs that bundle on the lent
# GPU machine, which has the NVIDIA driver, nvcc, CMake and PyTorch but none of our Debian
# libraries and no package registry.
#
#   tests/gpu/bundle.sh [BUILD_DIR]      (default build-gpu-bundle)
# The build is portable (-DATTNSERVE_NATIVE=OFF): the GPU machine's CPU is not this one.
# then, with the device tool: carry [".gpu-bundle"], command "tests/gpu/run.sh".
#
# cudart is linked statically and cuBLAS is dlopen'ed, so neither is bundled: run.sh finds the
# GPU machine's own libcublas (CUDA toolkit or the PyTorch wheel's nvidia/cublas/lib).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-${ROOT}/build-gpu-bundle}"
cmake -S "${ROOT}" -B "${BUILD}" -G Ninja -DATTNSERVE_CUDA=ON -DATTNSERVE_NATIVE=OFF \
  -DATTNSERVE_BUILD_BENCHMARKS=OFF >/dev/null
ninja -C "${BUILD}" -j2 cuda_backend_test cuda_mla_test attnserve_cuda_bench attention_kernel_bench
# The real server and its two clients: run.sh starts the server with --backend=cuda and drives it
# with `attnctl demo` and attnbench. The server dlopens libattnserve_cuda.so from its own folder
# (kernels/backend_factory.cc), so the module is bundled next to it.
ninja -C "${BUILD}" -j2 attnserve_server attnserve_cuda_plugin attnctl attnbench
# FlashInfer's decode and prefill adapter tests, where deploy/setup.sh installed FlashInfer's
# headers.
extra_bins=()
# grep without -q: -q stops reading at the first match, ninja then dies of SIGPIPE, and under
# pipefail the whole test fails at random.
if ninja -C "${BUILD}" -t targets all | grep '^flashinfer_decode_test:' >/dev/null; then
  ninja -C "${BUILD}" -j2 flashinfer_decode_test flashinfer_prefill_test
  extra_bins+=(tests/gpu/flashinfer_decode_test tests/gpu/flashinfer_prefill_test)
fi
# The binaries and their libraries are staged here, then packed into one xz archive: the device
# tool carries at most 64 MiB with the tree, and the FlashInfer instances in every test binary
# plus OpenBLAS come to ~90 MiB unpacked (~25 MiB packed). run.sh unpacks it on the GPU machine.
OUT="${BUILD}/gpu-bundle-stage"
rm -rf "${OUT}"
mkdir -p "${OUT}/lib"
for bin in tests/gpu/cuda_backend_test tests/gpu/cuda_mla_test tests/gpu/attnserve_cuda_bench \
           tests/gpu/attention_kernel_bench server/attnserve_server \
           kernels/cuda/libattnserve_cuda.so client/attnctl client/attnbench "${extra_bins[@]}"; do
  cp "${BUILD}/${bin}" "${OUT}/"
  # Every resolved library except glibc's own pieces (the GPU machine's glibc is as new or newer).
  ldd "${BUILD}/${bin}" | awk '/=> \//{print $3}' |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "${lib}" "${OUT}/lib/"; done
done
for bin in cuda_backend_test cuda_mla_test attention_kernel_bench attnserve_server libattnserve_cuda.so; do
  if ldd "${OUT}/${bin}" | grep cublas >/dev/null; then
    echo "bundle.sh: ${bin} has a DT_NEEDED on cuBLAS; it must be dlopen'ed" >&2
    exit 1
  fi
done
# Symbols off (the device tool carries at most 64 MiB with the tree); the device code stays.
strip --strip-unneeded "${OUT}"/* "${OUT}"/lib/* 2>/dev/null || true
PACKED="${ROOT}/.gpu-bundle"
rm -rf "${PACKED}"
mkdir -p "${PACKED}"
XZ_OPT="-9 -T2" tar -C "${OUT}" -cJf "${PACKED}/bundle.tar.xz" .
echo "unpacked $(du -sh "${OUT}" | cut -f1), packed $(du -sh "${PACKED}" | cut -f1)"
if (( $(du -sm "${PACKED}" | cut -f1) > 56 )); then
  echo "bundle.sh: ${PACKED} is over 56 MiB; with the tree it may not fit the device tool's 64 MiB" >&2
  exit 1
fi
echo "bundle ready: ${PACKED} (carry it as .gpu-bundle)"
