// The CUDA backend as a loadable module (libattnserve_cuda.so), opened with dlopen by
// kernels/backend_factory.cc. Why not link it into the server: the static CUDA runtime brings a
// 4 KiB, 4 KiB-aligned static TLS block, which glibc carves out of EVERY thread's stack; the
// metrics server's civetweb workers run on ~100 KiB stacks and overflowed (SIGSEGV in mg_printf).
// A dlopen'ed module's TLS is allocated on first use instead, so binaries that only may use CUDA
// keep their stacks, and still need no CUDA library to start.
#include <cstdio>
#include <memory>

#include "kernels/cuda/runtime/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) int AttnserveCreateCudaBackend(
    const attnserve::CudaBackendOptions* options, attnserve::AttentionBackend** backend,
    char* error, size_t error_size) {
  absl::StatusOr<std::unique_ptr<attnserve::AttentionBackend>> created =
      attnserve::CreateCudaBackend(*options);
  if (!created.ok()) {
    std::snprintf(error, error_size, "%s", std::string(created.status().message()).c_str());
    return static_cast<int>(created.status().code());
  }
  *backend = created->release();
  return 0;
}
