// CudaMlaLayer's attention through FlashInfer's MLA kernel (--cuda_attention=flashinfer or auto):
// the absorbed queries in bf16 against the bf16 latent pages, written in bf16 for the W_UV kernel.
// Served for bf16 pages at 512 + 64 (DeepSeek-V2/V3), causal, no sliding window, in a build with
// FlashInfer's headers; anything else stays on the native kernels (kernels/cuda/mla/).
//
// Two steps, as the GQA layer's FlashInferAttention: Plan on the host (page table and MLAPlan's
// schedule, packed into one int32 array the layer uploads with its plan), then Launch on the
// layer's stream. NOT RUN ON A DEVICE YET (kernels/cuda/flashinfer/paged_mla.h).
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_FLASHINFER_MLA_ATTENTION_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_FLASHINFER_MLA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/flashinfer/mla_plan.h"
#include "kernels/kv/cache_config.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::cuda {

class FlashInferMlaAttention {
 public:
  // Built with FlashInfer, bf16 pages, kv_lora_rank 512 and qk_rope_head_dim 64, causal without
  // a window, and every page's element offset in the pool below 2^32 (FlashInfer's 32-bit index
  // arithmetic).
  static bool Serves(const LayerSpec& spec, const KvCacheConfig& kv_config, int64_t pool_bytes);

  static FlashInferMlaAttention Create(const LayerSpec& spec, const KvCacheConfig& kv_config,
                                       int64_t page_bytes, int64_t slab_bytes, int multiprocessors);

  struct CallPlan {
    FlashInferMlaPlan schedule;  // Offsets into `words` for the schedule's arrays.
    std::vector<int32_t> words;  // The schedule, then the page indices; uploaded as one section.
    int page_indices = 0;        // Offset of the page indices in `words`.
    size_t scratch_bytes = 0;    // partial_o, then partial_lse at lse_offset (16-aligned).
    size_t lse_offset = 0;
  };
  absl::StatusOr<CallPlan> Plan(const BatchPlan& plan) const;

  // `words`: CallPlan::words on the device; `q`: [rows, heads, 576] bf16; `out`: [rows, heads,
  // 512] bf16; `scratch`: CallPlan::scratch_bytes, 16-byte aligned.
  absl::Status Launch(const CallPlan& call, const int32_t* words, void* pool, const void* q,
                      void* out, void* scratch, cudaStream_t stream) const;

 private:
  FlashInferMlaAttention() = default;
  int num_heads_ = 0;
  int page_size_ = 0;
  int64_t unit_bytes_ = 0;  // Pages are named in this unit (page_table.h).
  int multiprocessors_ = 1;
  float sm_scale_ = 1.0f;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_FLASHINFER_MLA_ATTENTION_H_
