// The CUDA backend: MHA/MQA/GQA layers on one GPU. Projections through cuBLAS (fp32, loaded at
// run time), our own kernels for RoPE + KV append, prefill and split-KV paged decode. KV pages
// live in one device pool allocated when the backend is created. MLA has no CUDA kernels yet and
// is refused with UNIMPLEMENTED.
#ifndef ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_BACKEND_H_
#define ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"

namespace attnserve {

// Which kernels compute attention over 16-bit pages (f32 pages always use attnserve's own).
enum class CudaAttentionImpl {
  // FlashInfer where this build has it, else native: the default since a GPU run (H200,
  // 2026-11-26, docs/gpu_benchmarks.md) passed every CUDA-vs-CPU case under FlashInfer.
  kAuto,
  kNative,      // attnserve's kernels (kernels/cuda/attention/).
  kFlashInfer,  // FlashInfer 0.5.3's paged decode and prefill (kernels/cuda/flashinfer/).
};
// "auto", "native" or "flashinfer" (inline: the server parses the flag without loading the CUDA
// module).
inline absl::StatusOr<CudaAttentionImpl> ParseCudaAttentionImpl(absl::string_view name) {
  if (name == "auto") return CudaAttentionImpl::kAuto;
  if (name == "native") return CudaAttentionImpl::kNative;
  if (name == "flashinfer") return CudaAttentionImpl::kFlashInfer;
  return absl::InvalidArgumentError(
      absl::StrCat("--cuda_attention = '", name, "': must be auto, native or flashinfer"));
}
inline const char* CudaAttentionImplName(CudaAttentionImpl impl) {
  switch (impl) {
    case CudaAttentionImpl::kAuto:
      return "auto";
    case CudaAttentionImpl::kFlashInfer:
      return "flashinfer";
    case CudaAttentionImpl::kNative:
      break;
  }
  return "native";
}
// True when this build compiled FlashInfer's kernels (its headers were found at configure time).
bool FlashInferBuilt();

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal.
  // Device KV page pool in bytes, allocated once; 0 = kv_pool_fraction of the free device memory.
  int64_t kv_pool_bytes = 0;
  double kv_pool_fraction = 0.5;
  // Pool granularity: a layer takes whole slabs as its pages are first used. A layer's page must
  // fit in one slab.
  int64_t slab_bytes = int64_t{4} << 20;
  // Tests: fill the pool and every newly reserved page with NaN (0xFF bytes) and every workspace
  // output with NaN before each call, so reads of unwritten memory and unwritten outputs show.
  bool poison_for_testing = false;
  // kFlashInfer in a build without FlashInfer fails at creation with FAILED_PRECONDITION; kAuto
  // resolves to one of the other two there.
  CudaAttentionImpl attention = CudaAttentionImpl::kAuto;
};

// UNAVAILABLE when there is no usable device or cuBLAS cannot be loaded (with the reason);
// RESOURCE_EXHAUSTED when the pool cannot be allocated.
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(
    const CudaBackendOptions& options = {});

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CUDA_RUNTIME_CUDA_BACKEND_H_
