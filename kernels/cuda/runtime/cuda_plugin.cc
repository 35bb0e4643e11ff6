// The CUDA backend as a loadable module (libattnserve_cuda.so), opened with dlopen by
// kernels/backend_factory.cc, and only when --backend is cuda or auto. Why not link it into the
// server: the static CUDA runtime brings a 4 KiB, 4 KiB-aligned static TLS block, which glibc
// carves out of every thread's stack in every binary that links it, whether it uses CUDA or not;
// on threads with fixed small stacks that has overflowed them. A dlopen'ed module's TLS is
// allocated on first use instead, so the server's threads keep their stacks on the CPU backend.
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
