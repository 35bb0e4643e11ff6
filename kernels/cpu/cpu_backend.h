// The CPU backend: fp32 compute (f32 or bf16 projection weights), OpenBLAS projections for prefill
// and its own GEMV for decode steps, online-softmax attention over paged KV.
#ifndef ATTNSERVE_KERNELS_CPU_CPU_BACKEND_H_
#define ATTNSERVE_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace attnserve {

struct CpuBackendOptions {
  int num_threads = 0;  // Worker threads; 0 = one per hardware thread.
  // MLA decode: true uses the absorbed form (attention over the cached latent, as DeepSeek serves
  // it); false up-projects the cached latent to per-head keys/values (the form prefill uses).
  // Both give the same result; the switch exists so tests and benchmarks can compare them.
  bool mla_absorbed_decode = true;
  // How GQA/MHA/MQA layers keep their projection weights: kF32, or kBF16 (rounded once at
  // creation, half the bytes a decode step reads; widened to f32 in registers, f32 accumulate).
  // MLA layers keep f32 whatever this says.
  DType projection_weights = DType::kF32;
};

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCpuBackend(
    const CpuBackendOptions& options = {});

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_CPU_BACKEND_H_
